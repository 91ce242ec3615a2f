"""Train each dygraph case with fleet.train_step on this rank's rows (r::N of the global batch)
and, beside it in the same process, a plain-Paddle eager reference on the full batch from rank
0's initial values; write both to OUT/result.<rank>.json (the dygraph tests compare them).

The "eager_loop" cases train by Fleet's own loop (loss.backward(); opt.step()) instead.

Usage: dygraph_worker.py OUT        (under fleetlite run / fleetrun, any world size dividing 32)

Ranks other than 0 build their models from another seed: only train_step's broadcast of rank
0's values makes them agree. The conv net is put in eval mode before training, which must not
change what train_step trains. "resume" trains 3 steps, saves model and optimizer with
paddle.save, loads them into a fresh model and optimizer (another seed) and trains 3 more.
"""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import paddle
from paddle.distributed.fleet.utils import recompute

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from support import models  # noqa: E402
from support.meta_optimizers import fleet_optimizer  # noqa: E402
from workers.knob_pairs_worker import make_strategy  # noqa: E402

BATCH, STEPS, SEED = 32, 4, 2024


def sgd(params):
    return paddle.optimizer.SGD(0.1, parameters=params), None


def momentum(params):
    return paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=params), None


def adam(params):
    return paddle.optimizer.Adam(0.01, parameters=params), None


def adamw_clip_schedule(params):
    schedule = paddle.optimizer.lr.StepDecay(0.02, step_size=2, gamma=0.5)
    return paddle.optimizer.AdamW(schedule, parameters=params, weight_decay=0.05,
                                  grad_clip=paddle.nn.ClipGradByGlobalNorm(0.5)), schedule


class RecomputedMlp(models.Mlp):
    """The Mlp with its hidden layer and activation under fleet.utils.recompute, Fleet's dygraph
    idiom: train_step recomputes them in backward when the strategy turns recompute on."""

    def forward(self, x):
        return self.out(recompute(self.activations, x, use_reentrant=False))

    def activations(self, x):
        return paddle.nn.functional.relu(self.hidden(x))


CASES = {   # name: (model, optimizer, strategy fields, gradient-merge steps of the reference)
    "sgd": (models.Mlp, sgd, {}, 1),
    "momentum": (models.Mlp, momentum, {}, 1),
    "adamw_clip_schedule": (models.Mlp, adamw_clip_schedule, {}, 1),
    "convbn_sync_batch_norm": (models.ConvBn, momentum, {"sync_batch_norm": True}, 1),
    "gradient_merge": (models.Mlp, momentum, {"gradient_merge": True,
                                              "gradient_merge_configs": {"k_steps": 2, "avg": True}}, 2),
    "pto": (models.Mlp, adam, {"pto": True}, 1),
    "eager_loop": (models.Mlp, momentum, {}, 1),
    "amp_cpu_recipe": (models.Mlp, momentum, {"amp": True, "amp_configs": {
        "custom_black_list": ["matmul", "relu", "elementwise_add"], "init_loss_scaling": 1024.0}}, 1),
    "two_steps_per_run": (models.Mlp, momentum, {"execution_strategy": {"num_iteration_per_run": 2}}, 1),
    # the reference trains with the optimizer Fleet's meta-optimizer builds (support.meta_optimizers)
    "lars": (models.Mlp, momentum, {"lars": True, "lars_configs": {
        "lars_coeff": 0.05, "lars_weight_decay": 0.001, "exclude_from_weight_decay": ["b_0"]}}, 1),
    "lamb": (models.Mlp, adam, {"lamb": True, "lamb_configs": {
        "lamb_weight_decay": 0.02, "exclude_from_weight_decay": ["b_0"]}}, 1),
    # the model marks its segment with fleet.utils.recompute; the reference runs it eagerly
    "recompute": (RecomputedMlp, momentum, {"recompute": True}, 1),
    # local SGD averaging after every update (k_steps 1; every step <= begin_step): for Momentum the
    # full-batch update; its local steps are in COMPRESSED
    "localsgd_every_step": (models.Mlp, momentum, {"localsgd": True, "localsgd_configs": {"k_steps": 1}}, 1),
    "adaptive_localsgd_every_step": (models.Mlp, momentum, {"adaptive_localsgd": True, "adaptive_localsgd_configs": {
        "begin_step": STEPS}}, 1),
}
UNWRAPPED = ("momentum", "adamw_clip_schedule")   # not through distributed_model: train_step's broadcast alone


class WideMlp(models.Mlp):
    """64 -> 300 -> 10: its first weight (19,200 elements) is large enough for dgc."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = paddle.nn.Linear(64, 300), paddle.nn.Linear(300, 10)


COMPRESSED = {   # lossy by design: they must train and the ranks must agree (local SGD: its last step syncs)
    "topk": (models.Mlp, {"topk": True, "topk_configs": {"density": 0.05, "min_numel": 1000}}),
    "dgc": (WideMlp, {"dgc": True, "dgc_configs": {"sparsity": [0.9]}}),
    "localsgd": (models.Mlp, {"localsgd": True, "localsgd_configs": {"k_steps": 3, "begin_step": 2}}),   # 1, 2, 5, 8
}


def loss_fn(model, x, y):
    return paddle.nn.functional.cross_entropy(model(x), y)


def state(model):
    return {name: value.numpy() for name, value in model.state_dict().items()}


def digest(arrays):
    return hashlib.sha256(b"".join(np.ascontiguousarray(arrays[k]).tobytes() for k in sorted(arrays))).hexdigest()


def train_with_fleet(make_model, make_optimizer, fields, x, y, steps, seed, load=None, wrap=True):
    """(model, optimizer, losses) after `steps` training steps on this rank's rows (a call of
    the step runs num_iteration_per_run of them, on as many copies of the rows)."""
    rank, world = fleet.worker_index(), fleet.worker_num()
    paddle.seed(seed + rank)
    model = fleet.distributed_model(make_model()) if wrap else make_model()
    inner, schedule = make_optimizer(model.parameters())
    optimizer = fleet.distributed_optimizer(inner, make_strategy(fields))
    if load is not None:
        model.set_state_dict(paddle.load(load + ".pdparams"))
        optimizer.set_state_dict(paddle.load(load + ".pdopt"))
    model.eval()                                     # train_step trains in train mode regardless
    step = fleet.train_step(model, loss_fn, optimizer)
    per_call = optimizer.user_defined_strategy.execution_strategy.num_iteration_per_run
    rows = np.concatenate([x[rank::world]] * per_call), np.concatenate([y[rank::world]] * per_call)
    losses = []
    for i in range(steps // per_call):
        losses.extend(np.atleast_1d(step(rows[0], paddle.to_tensor(rows[1])).numpy()).tolist())
        if schedule is not None:
            schedule.step()
    return model, optimizer, losses


def train_eagerly(make_model, make_optimizer, fields, x, y, steps, merge):
    """The plain-Paddle reference: the full batch, one process, gradient merge by hand, and the
    optimizer Fleet trains with under `fields` (LARS or LAMB in place of the inner one)."""
    paddle.seed(SEED)
    model = make_model()
    inner, schedule = make_optimizer(model.parameters())
    optimizer = fleet_optimizer(inner, fields)
    losses = []
    for i in range(steps):
        loss = loss_fn(model, paddle.to_tensor(x), paddle.to_tensor(y))
        (loss / merge).backward()
        if (i + 1) % merge == 0:
            optimizer.step()
            optimizer.clear_grad()
        losses.append(float(loss))
        if schedule is not None:
            schedule.step()
    return model, losses


def train_by_fleet_eager_loop(make_model, make_optimizer, fields, x, y, steps, seed):
    """Fleet's own dygraph loop: loss.backward(); opt.step(); opt.clear_grad()."""
    rank, world = fleet.worker_index(), fleet.worker_num()
    paddle.seed(seed + rank)
    model = fleet.distributed_model(make_model())
    inner, _ = make_optimizer(model.parameters())
    optimizer = fleet.distributed_optimizer(inner, make_strategy(fields))
    losses = []
    for i in range(steps):
        loss = loss_fn(model, paddle.to_tensor(x[rank::world]), paddle.to_tensor(y[rank::world]))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        losses.append(float(loss))
    return model, optimizer, losses


def compare(name, x, y):
    make_model, make_optimizer, fields, merge = CASES[name]
    with paddle.utils.unique_name.guard():
        reference, reference_losses = train_eagerly(make_model, make_optimizer, fields, x, y, STEPS, merge)
        if name.startswith("eager_loop"):
            model, _, losses = train_by_fleet_eager_loop(make_model, make_optimizer, fields, x, y, STEPS, SEED)
        else:
            model, _, losses = train_with_fleet(make_model, make_optimizer, fields, x, y, STEPS, SEED,
                                                wrap=name not in UNWRAPPED)
    trained, expected = state(model), state(reference)
    model.eval(), reference.eval()
    with paddle.no_grad():
        eval_diff = float(np.abs(model(paddle.to_tensor(x)).numpy() - reference(paddle.to_tensor(x)).numpy()).max())
    return {"losses": losses, "reference_losses": reference_losses, "digest": digest(trained),
            "param_diff": max(float(np.abs(trained[k] - expected[k]).max()) for k in expected),
            "state_names": sorted(trained), "eval_diff": eval_diff,
            "comm_buffer_size": getattr(model, "comm_buffer_size", None)}


def compressed(name, x, y):
    make_model, fields = COMPRESSED[name]
    with paddle.utils.unique_name.guard():
        model, optimizer, losses = train_with_fleet(make_model, momentum, fields, x, y, 2 * STEPS, SEED)
    return {"losses": losses, "digest": digest(state(model)), "applied": optimizer.compile_report.applied}


def resume(out, x, y):
    """Uninterrupted 6 steps against 3 steps, save, load into fresh objects, 3 steps."""
    make_model, make_optimizer = models.Mlp, adamw_clip_schedule
    with paddle.utils.unique_name.guard():
        straight, _, straight_losses = train_with_fleet(make_model, make_optimizer, {}, x, y, 6, SEED)
    with paddle.utils.unique_name.guard():
        first, optimizer, first_losses = train_with_fleet(make_model, make_optimizer, {}, x, y, 3, SEED)
        checkpoint = str(Path(out) / f"ckpt.{fleet.worker_index()}")
        paddle.save(first.state_dict(), checkpoint + ".pdparams")
        paddle.save(optimizer.state_dict(), checkpoint + ".pdopt")
    with paddle.utils.unique_name.guard():
        resumed, _, resumed_losses = train_with_fleet(make_model, make_optimizer, {}, x, y, 3, SEED + 100,
                                                      load=checkpoint)
    got, expected = state(resumed), state(straight)
    return {"losses": first_losses + resumed_losses, "straight_losses": straight_losses,
            "param_diff": max(float(np.abs(got[k] - expected[k]).max()) for k in expected)}


def refused_eager_step(wrap, fields):
    """The refusal of an eager step (None if it ran)."""
    with paddle.utils.unique_name.guard():
        model = fleet.distributed_model(models.Mlp()) if wrap else models.Mlp()
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1, parameters=model.parameters()),
                                            make_strategy(fields))
    x, y = models.digits(4)
    loss_fn(model, paddle.to_tensor(x), paddle.to_tensor(y)).backward()
    try:
        optimizer.step()
    except fleet.FleetliteError as error:
        return str(error)
    return None


def main():
    out = sys.argv[1]
    fleet.init(is_collective=True)
    x, y = models.digits(BATCH)
    results = {name: compare(name, x, y) for name in CASES}
    results.update({name: compressed(name, x, y) for name in COMPRESSED})
    results["resume"] = resume(out, x, y)
    results["unwrapped_eager_step"] = refused_eager_step(False, {})
    results["other_fusion_size"] = refused_eager_step(True, {"fuse_grad_size_in_MB": 0})
    results["dynamic_mode"] = paddle.in_dynamic_mode()
    Path(out, f"result.{fleet.worker_index()}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
