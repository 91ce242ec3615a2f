"""`fleet.distributed_scaler(scaler)`: every rank skips the same AMP steps and keeps one loss scale.

A `paddle.amp.GradScaler` skips `optimizer.step()` when the gradients it unscales hold an inf or
a NaN, and then lowers the loss scale. Each rank checks only its own gradients: were one rank to
skip while another steps, the models would part and their loss scales too. Here the scaler's
found-inf flag is all-reduced (max) over the process group right after it unscales, as Paddle's
Fleet does in its hybrid modes, so every rank decides alike. (paddle.DataParallel's reduction
already carries an inf of one rank's backward to every rank; the vote also covers gradients it
does not reduce, and costs one all-reduce of one number per step.)

On a CPU, Paddle 3.3.1 builds `GradScaler` and `auto_cast` switched off ("... can only be enabled
on CUDAPlace, XPUPlace and CustomPlace ... so it makes no effect"), whatever the CPU's bfloat16
support, and a scaler turns itself off under a bfloat16 `auto_cast`: training runs in fp32 and
`scaler.step(opt)` is `opt.step()`. Such a scaler has nothing to agree on and is left as it is.
(An enabled one also gets paddle_compat.scale_update's fix: Paddle's own update crashes under
NumPy 2.4 when it lowers the scale.)
"""
import types

import paddle
import paddle.distributed as dist

from fleetlite.errors import FleetliteError
from fleetlite.paddle_compat import scale_update
from fleetlite.runtime.collective_waits import waiting_in


def agreeing_across_ranks(scaler, world_size):
    """`scaler`, its found-inf flag from now on the maximum over the `world_size` ranks (every rank
    calls it; one rank has nothing to agree with)."""
    if not isinstance(scaler, paddle.amp.GradScaler):
        raise FleetliteError(f"fleet.distributed_scaler takes a paddle.amp.GradScaler, got a "
                             f"{type(scaler).__module__}.{type(scaler).__name__}: pass the scaler you call "
                             f"scaler.scale(loss) on")
    scale_update.lowers_without_crashing(scaler)
    if world_size == 1:
        return scaler
    unscale = scaler._unscale

    def unscale_and_agree(self, optimizer):
        unscale(optimizer)
        if self._enable:
            found_inf = paddle.cast(self._found_inf, "int32")
            with waiting_in("fleet.distributed_scaler (found-inf vote)"):
                dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
            self._found_inf = paddle.cast(found_inf, "bool")

    scaler._unscale = types.MethodType(unscale_and_agree, scaler)
    return scaler
