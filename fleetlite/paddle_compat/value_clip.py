"""Gradient clips that Paddle 3.3.1 cannot build into a PIR program, built the same way here.

`paddle.nn.ClipGradByValue._pir_clip` raises NotImplementedError in Paddle 3.3.1, so any static
(PIR) program whose optimizer has `grad_clip=ClipGradByValue(...)` fails in `minimize`, one
process included. While the optimizer builds its update, `buildable(optimizer)` puts in its
place the element-wise clip that Paddle's dynamic mode applies: each gradient clamped to
[min, max], except for parameters marked `need_clip=False`. Every other clip (and a subclass
that builds its own PIR ops) is Paddle's own, untouched.
"""
import contextlib

import paddle

from fleetlite.paddle_compat.version_gate import needed


@contextlib.contextmanager
def buildable(optimizer):
    """Within: `optimizer.apply_gradients` can build its gradient clip in a PIR program."""
    clip = getattr(optimizer, "_grad_clip", None)
    if not _pir_clip_missing(clip):
        yield
        return
    optimizer._grad_clip = ValueClip(clip.min, clip.max)
    try:
        yield
    finally:
        optimizer._grad_clip = clip


def _pir_clip_missing(clip):
    return (needed("PIR value clip") and isinstance(clip, paddle.nn.ClipGradByValue)
            and type(clip)._pir_clip is paddle.nn.ClipGradByValue._pir_clip)


class ValueClip:
    """ClipGradByValue's clamp as PIR ops: [(param, grad)] -> [(param, clamped grad)]."""

    def __init__(self, low, high):
        self.low, self.high = low, high

    def __call__(self, params_grads):
        return [(param, grad if grad is None or getattr(param, "need_clip", True) is False
                 else paddle.clip(grad, self.low, self.high)) for param, grad in params_grads]
