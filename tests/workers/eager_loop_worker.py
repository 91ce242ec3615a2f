"""Scripts as Paddle's dygraph docs write them, with only the import changed, trained by Fleet's
eager loop (loss.backward(); opt.step()) on this rank's rows (r::N of the global batch), each
beside a plain-Paddle reference on the full batch in the same process; every rank writes
OUT/result.<rank>.json (tests/runtime/test_eager_loop.py compares them).

Usage: eager_loop_worker.py OUT ORDER     (under fleetrun; ORDER is how the job comes up:
  "paddle_first": paddle.distributed.init_parallel_env(), then fleet.init;
  "fleet_first":  fleet.init, then paddle.distributed.init_parallel_env())

fleet.init gets the README's preset, configs/cpu_gloo.yaml. Ranks other than 0 build their
models from another seed: only the wrapper's broadcast of rank 0's values makes them agree.
"""
import json
import sys
from pathlib import Path

import numpy as np
import paddle

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import fleetlite as fleet  # noqa: E402
from support import models  # noqa: E402

BATCH, STEPS, SEED = 32, 4, 2024
PRESET = ROOT / "configs" / "cpu_gloo.yaml"


def momentum(model):
    return paddle.optimizer.Momentum(0.05, momentum=0.9, parameters=model.parameters())


def adamw_groups(model):
    """Two parameter groups with their own learning rate and weight decay, global-norm clip."""
    return paddle.optimizer.AdamW(
        0.01, weight_decay=0.01, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
        parameters=[{"params": model.hidden.parameters(), "learning_rate": 0.5, "weight_decay": 0.1},
                    {"params": model.out.parameters()}])


def distributed_model(model):
    return fleet.distributed_model(model)


def paddle_data_parallel(model):
    return paddle.DataParallel(model) if fleet.worker_num() > 1 else model


CASES = {   # name: (how the model is wrapped, the optimizer)
    "readme_preset": (distributed_model, momentum),
    "parameter_groups": (distributed_model, adamw_groups),
    "paddle_data_parallel": (paddle_data_parallel, momentum),
}


def layer(model):
    """The Layer a wrapper holds (its optimizer takes that Layer's parameters)."""
    return model._layers if isinstance(model, paddle.DataParallel) else model


def loss_fn(model, x, y):
    return paddle.nn.functional.cross_entropy(model(paddle.to_tensor(x)), paddle.to_tensor(y))


def state(model):
    return {name: value.numpy() for name, value in layer(model).state_dict().items()}


def train(model, optimizer, x, y):
    losses = []
    for _ in range(STEPS):
        loss = loss_fn(model, x, y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        losses.append(float(loss))
    return losses


def compare(name, x, y):
    wrap, make_optimizer = CASES[name]
    rank, world = fleet.worker_index(), fleet.worker_num()
    with paddle.utils.unique_name.guard():
        paddle.seed(SEED)
        reference = models.Mlp()
        reference_losses = train(reference, make_optimizer(reference), x, y)
    with paddle.utils.unique_name.guard():
        paddle.seed(SEED + rank)
        model = wrap(models.Mlp())
        optimizer = fleet.distributed_optimizer(make_optimizer(layer(model)))
        losses = train(model, optimizer, x[rank::world], y[rank::world])
    trained, expected = state(model), state(reference)
    return {"losses": losses, "reference_losses": reference_losses,
            "param_diff": max(float(np.abs(trained[k] - expected[k]).max()) for k in expected)}


def refused_step(seed, x, y):
    """The refusal of an eager step on grouped parameters of a model nothing wraps, built from
    `seed` on every rank (None if the step ran)."""
    with paddle.utils.unique_name.guard():
        paddle.seed(seed)
        model = models.Mlp()
    optimizer = fleet.distributed_optimizer(adamw_groups(model))
    rank, world = fleet.worker_index(), fleet.worker_num()
    loss_fn(model, x[rank::world], y[rank::world]).backward()
    try:
        optimizer.step()
    except fleet.FleetliteError as error:
        return str(error)
    return None


def bring_up(order):
    strategy = fleet.DistributedStrategy.load(str(PRESET))
    if order == "paddle_first":
        paddle.distributed.init_parallel_env()
    fleet.init(is_collective=True, strategy=strategy)
    if order == "fleet_first":
        paddle.distributed.init_parallel_env()


def main():
    out, order = sys.argv[1], sys.argv[2]
    bring_up(order)
    x, y = models.digits(BATCH)
    results = {name: compare(name, x, y) for name in CASES}
    results["unwrapped_groups"] = refused_step(SEED + fleet.worker_index(), x, y)     # values differ
    results["unwrapped_same_seed"] = refused_step(SEED, x, y)      # values agree, gradients (other rows) do not
    Path(out, f"result.{fleet.worker_index()}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
