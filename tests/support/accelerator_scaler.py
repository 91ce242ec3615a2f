"""A paddle.amp.GradScaler built as Paddle builds it on a GPU, here on the CPU.

On a CPU place Paddle 3.3.1 builds every GradScaler switched off (its constructor checks the
tracer's place), so dynamic loss scaling and the skipping of non-finite steps never run there.
The distributed_scaler tests need them: this builds the scaler with Paddle's own constructor
while that one check sees an accelerator place. Everything the scaler then runs
(check_finite_and_unscale, the skip, the scale update) is Paddle's CPU code. Train under
`paddle.amp.auto_cast(dtype="float16")` (fp32 on a CPU): under any other auto_cast dtype a
scaler turns itself off at `scale()`.
"""
from unittest import mock

import paddle
from paddle.amp import grad_scaler


class _AcceleratorPlace:
    def is_gpu_place(self):
        return False

    def is_xpu_place(self):
        return False

    def is_custom_place(self):
        return True


class _AcceleratorTracer:
    _expected_place = _AcceleratorPlace()


def grad_scaler_as_on_a_gpu(**settings):
    with mock.patch.object(grad_scaler, "_dygraph_tracer", _AcceleratorTracer):
        return paddle.amp.GradScaler(**settings)
