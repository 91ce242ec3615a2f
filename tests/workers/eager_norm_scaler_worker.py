"""Fleet's eager loop with SyncBatchNorm and with AMP (fleet.distributed_scaler), on this rank's
rows (r::N of the global batch), beside plain-Paddle references on the full batch in one
process from rank 0's initial values; writes OUT/result.<rank>.json (tests/runtime compares).

Usage: eager_norm_scaler_worker.py OUT        (under fleetrun, any world size dividing 32)

- sync_batch_norm: the conv net after paddle.nn.SyncBatchNorm.convert_sync_batchnorm, against
  the unconverted net (BatchNorm2D) on the full batch; per_shard: the unconverted net trained
  data parallel (the control: each rank normalises over its own shard).
- amp: auto_cast + a GradScaler as on a GPU (support.accelerator_scaler) + distributed_scaler,
  against the same recipe on the full batch; bf16_script: the literal CPU script (a GradScaler
  Paddle builds, bfloat16 auto_cast) against plain fp32.
- inf_in_input / inf_in_gradient: step 1 of 3 meets an inf on the last rank only (its input
  scaled by inf, or one reduced gradient set to inf); inf_in_gradient_without_vote: the same
  with the plain scaler (the control; given only the NumPy 2.4 fix of paddle_compat.scale_update). Each records per step whether this rank's parameters moved, the scale
  after the step and a digest of the parameters.
"""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.paddle_compat import scale_update  # noqa: E402
from support import models  # noqa: E402
from support.accelerator_scaler import grad_scaler_as_on_a_gpu  # noqa: E402

BATCH, STEPS, SEED, INF_STEP = 32, 4, 2024, 1
SCALER = {"init_loss_scaling": 1024.0, "incr_every_n_steps": 2, "decr_every_n_nan_or_inf": 1}


def state(model):
    return {name: value.numpy() for name, value in model.state_dict().items()}


def digest(arrays):
    return hashlib.sha256(b"".join(np.ascontiguousarray(arrays[k]).tobytes() for k in sorted(arrays))).hexdigest()


def gap(trained, expected):
    return max(float(np.abs(trained[k] - expected[k]).max()) for k in expected)


def cross_entropy(model, x, y):
    return paddle.nn.functional.cross_entropy(model(paddle.to_tensor(x)), paddle.to_tensor(y))


def momentum(model):
    return paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=model.parameters())


def train(model, optimizer, x, y, steps, scaler=None, dtype="float16"):
    """Losses of `steps` eager steps (AMP when `scaler` is given)."""
    losses = []
    for _ in range(steps):
        if scaler is None:
            loss = cross_entropy(model, x, y)
            loss.backward()
            optimizer.step()
        else:
            with paddle.amp.auto_cast(dtype=dtype):
                loss = cross_entropy(model, x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.clear_grad()
        losses.append(float(loss))
    return losses


def on_this_rank(make_model, convert=False):
    rank = fleet.worker_index()
    paddle.seed(SEED + rank)          # only distributed_model's broadcast makes the ranks agree
    model = make_model()
    if convert:
        model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return fleet.distributed_model(model)


def rows(x, y):
    rank, world = fleet.worker_index(), fleet.worker_num()
    return x[rank::world], y[rank::world]


def compare(model, losses, reference, reference_losses, x):
    trained, expected = state(model), state(reference)
    model.eval(), reference.eval()
    with paddle.no_grad():
        eval_diff = float(np.abs(model(paddle.to_tensor(x)).numpy() - reference(paddle.to_tensor(x)).numpy()).max())
    return {"losses": losses, "reference_losses": reference_losses, "param_diff": gap(trained, expected),
            "eval_diff": eval_diff, "digest": digest(trained), "state_names": sorted(trained),
            "reference_state_names": sorted(expected)}


def batch_norm_case(x, y, convert):
    with paddle.utils.unique_name.guard():
        paddle.seed(SEED)
        reference = models.ConvBn()
        reference_losses = train(reference, momentum(reference), x, y, STEPS)
        model = on_this_rank(models.ConvBn, convert)
        losses = train(model, fleet.distributed_optimizer(momentum(model)), *rows(x, y), STEPS)
    result = compare(model, losses, reference, reference_losses, x)
    result["norm_class"] = type(model._layers.norm if isinstance(model, paddle.DataParallel) else model.norm).__name__
    return result


def amp_case(x, y):
    with paddle.utils.unique_name.guard():
        paddle.seed(SEED)
        reference = models.Mlp()
        reference_scaler = grad_scaler_as_on_a_gpu(**SCALER)
        reference_losses = train(reference, momentum(reference), x, y, STEPS, reference_scaler)
        model = on_this_rank(models.Mlp)
        scaler = fleet.distributed_scaler(grad_scaler_as_on_a_gpu(**SCALER))
        losses = train(model, fleet.distributed_optimizer(momentum(model)), *rows(x, y), STEPS, scaler)
    result = compare(model, losses, reference, reference_losses, x)
    result.update(scale=scaler._scale.item(), reference_scale=reference_scaler._scale.item())
    return result


def bf16_script_case(x, y):
    """The script as a CPU user writes it: Paddle builds the scaler, bfloat16 asked for."""
    with paddle.utils.unique_name.guard():
        paddle.seed(SEED)
        reference = models.Mlp()
        reference_losses = train(reference, momentum(reference), x, y, STEPS)
        model = on_this_rank(models.Mlp)
        scaler = fleet.distributed_scaler(paddle.amp.GradScaler(init_loss_scaling=1024.0))
        losses = train(model, fleet.distributed_optimizer(momentum(model)), *rows(x, y), STEPS, scaler, "bfloat16")
        with paddle.amp.auto_cast(dtype="bfloat16"):
            output_dtype = str(model(paddle.to_tensor(x[:2])).dtype)
    result = compare(model, losses, reference, reference_losses, x)
    result.update(scaler_enabled=scaler.is_enable(), output_dtype=output_dtype,
                  bfloat16_supported=paddle.amp.is_bfloat16_supported())
    return result


def inf_case(x, y, where, vote):
    """Per step: did this rank's parameters move, the scale after it, the parameters' digest."""
    last_rank = fleet.worker_index() == fleet.worker_num() - 1
    with paddle.utils.unique_name.guard():
        model = on_this_rank(models.Mlp)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1, parameters=model.parameters()))
        scaler = grad_scaler_as_on_a_gpu(**SCALER)
        scaler = fleet.distributed_scaler(scaler) if vote else scale_update.lowers_without_crashing(scaler)
    x, y = rows(x, y)
    moved, scales, digests = [], [], []
    for step in range(3):
        before = state(model)
        poisoned = x * np.float32("inf") if where == "input" and step == INF_STEP and last_rank else x
        with paddle.amp.auto_cast(dtype="float16"):
            loss = cross_entropy(model, poisoned, y)
        scaler.scale(loss).backward()
        if where == "gradient" and step == INF_STEP and last_rank:
            gradient = model.parameters()[0].grad
            gradient.set_value(np.full(gradient.shape, np.inf, "float32"))
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        after = state(model)
        moved.append(any(not np.array_equal(before[k], after[k]) for k in after))
        scales.append(scaler._scale.item())
        digests.append(digest(after))
    return {"moved": moved, "scales": scales, "digests": digests}


def main():
    out = sys.argv[1]
    fleet.init(is_collective=True)
    x, y = models.digits(BATCH)
    results = {"sync_batch_norm": batch_norm_case(x, y, convert=True),
               "per_shard": batch_norm_case(x, y, convert=False),
               "amp": amp_case(x, y)}
    for where in ("input", "gradient"):
        results[f"inf_in_{where}"] = inf_case(x, y, where, vote=True)
    results["inf_in_gradient_without_vote"] = inf_case(x, y, "gradient", vote=False)
    results["bf16_script"] = bf16_script_case(x, y)
    Path(out, f"result.{fleet.worker_index()}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
