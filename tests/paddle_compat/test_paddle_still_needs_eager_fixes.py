"""Canaries of the eager loop's Paddle workarounds (see test_paddle_still_needs_it.py): each test
shows the problem is still there without the workaround; once one fails, Paddle fixed it:
delete the workaround and its entry in version_gate.LAST_NEEDED. Also: each workaround does its job.
"""
import numpy as np
import paddle
import pytest

from fleetlite.paddle_compat import scale_update, version_gate
from support.accelerator_scaler import grad_scaler_as_on_a_gpu


def _installed_release_is_gated(workaround):
    assert version_gate.needed(workaround), (
        f"the installed Paddle is past version_gate.LAST_NEEDED[{workaround!r}]: run this canary on it and "
        f"move the bound, or delete the workaround")


def test_sync_batch_norm_still_has_no_cpu_kernel():
    _installed_release_is_gated("no CPU sync_batch_norm kernel")
    with pytest.raises(RuntimeError, match="The kernel `sync_batch_norm` is not registered"):
        paddle.nn.SyncBatchNorm(4)(paddle.ones([2, 4, 3, 3]))


def lowered_once(scaler):
    """`scaler` after one step whose gradient is inf (its update lowers the scale)."""
    layer = paddle.nn.Linear(3, 2)
    with paddle.amp.auto_cast(dtype="float16"):
        loss = layer(paddle.ones([2, 3])).sum()
    scaler.scale(loss).backward()
    layer.weight.grad.set_value(np.full(layer.weight.grad.shape, np.inf, "float32"))
    scaler.step(paddle.optimizer.SGD(0.1, parameters=layer.parameters()))
    scaler.update()
    return scaler


def test_grad_scaler_still_cannot_lower_its_scale_under_numpy_2_4():
    _installed_release_is_gated("GradScaler float() of its scale")
    with pytest.raises(TypeError, match="only 0-dimensional arrays can be converted to Python scalars"):
        lowered_once(grad_scaler_as_on_a_gpu(init_loss_scaling=8.0))


def test_the_fixed_scaler_lowers_its_scale_and_keeps_its_shape_and_state_dict():
    scaler = lowered_once(scale_update.lowers_without_crashing(grad_scaler_as_on_a_gpu(init_loss_scaling=8.0)))
    assert scaler._scale.shape == [1] and scaler._scale.item() == 4.0
    restored = grad_scaler_as_on_a_gpu()
    restored.load_state_dict(scaler.state_dict())
    assert restored._scale.item() == 4.0
