"""Train every pto configuration a few steps on this rank's shard; report losses, final
parameters, the optimizer state bytes this rank's scope holds, and checkpoint continuations.

Usage: pto_worker.py SHARDS CHECKPOINT_DIR
SHARDS is the world size the batch is cut for (the one-process oracle sees the whole batch).
With more than one rank, the checkpoint configuration trains 2 steps, saves to CHECKPOINT_DIR
with fleet.save_persistables, trains 2 more, then builds the program again, loads the
checkpoint and trains the same 2 steps ("resumed"). The one-process oracle loads the same
checkpoint (written by the multi-rank job) and trains those 2 steps too.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support import models  # noqa: E402

BATCH, STEPS, SEED = 16, 4, 7
CHECKPOINT_CONFIG = "adam"


class Wide(paddle.nn.Layer):
    """One linear layer: 2 parameters, fewer than 4 ranks."""

    def __init__(self):
        super().__init__()
        self.out = paddle.nn.Linear(64, 10)

    def forward(self, x):
        return self.out(x)


def optimizer(kind):
    clip = paddle.nn.ClipGradByGlobalNorm(0.05)
    return {
        "sgd": lambda: paddle.optimizer.SGD(0.1),
        "momentum": lambda: paddle.optimizer.Momentum(0.1, momentum=0.9),
        "momentum_l2": lambda: paddle.optimizer.Momentum(0.1, momentum=0.9, weight_decay=paddle.regularizer.L2Decay(0.01)),
        "adam": lambda: paddle.optimizer.Adam(0.01),
        "adamw": lambda: paddle.optimizer.AdamW(0.01, weight_decay=0.05),
        "adamw_clip": lambda: paddle.optimizer.AdamW(0.01, weight_decay=0.05, grad_clip=clip),
        "adam_step_lr": lambda: paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.02, step_size=1, gamma=0.5)),
    }[kind]()


# name: (model, optimizer, strategy fields)
CONFIGS = {
    "sgd": ("mlp", "sgd", {}),
    "momentum": ("mlp", "momentum", {}),
    "momentum_l2": ("mlp", "momentum_l2", {}),
    "adam": ("mlp", "adam", {}),
    "adamw": ("mlp", "adamw", {}),
    "adamw_clip": ("mlp", "adamw_clip", {}),
    "adam_round_robin_one_param_buckets": ("mlp", "adam", {"pto_configs": {"partition": "round_robin",
                                                                            "allgather_bucket_MB": 0}}),
    "adam_fused_update": ("mlp", "adam", {"build_strategy": {"fuse_all_optimizer_ops": True}}),
    "adam_step_lr": ("mlp", "adam_step_lr", {}),
    "momentum_gradient_merge": ("mlp", "momentum", {"gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}}),
    "adam_fused_update_gradient_merge": ("mlp", "adam", {"build_strategy": {"fuse_all_optimizer_ops": True},
                                                         "gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}}),
    "adam_fewer_parameters_than_ranks": ("wide", "adam", {}),
    "adam_sharding_stage1": ("mlp", "adam", {"pto": False, "sharding": True}),
}


def build(config, shards):
    """(main, startup, loss, distributed optimizer) for `config` on this rank."""
    model_name, kind, fields = CONFIGS[config]
    world = fleet.worker_num()
    strategy = fleet.DistributedStrategy()
    strategy.pto = True
    for field, value in fields.items():
        setattr(strategy, field, value)
    if strategy.sharding:
        strategy.sharding_configs = {"sharding_degree": world}
    rows = BATCH // world
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        if model_name == "wide":
            loss = paddle.nn.functional.cross_entropy(Wide()(x), y)
        else:
            loss = models.loss(model_name, x, y, shards // world)
        distributed = fleet.distributed_optimizer(optimizer(kind), strategy)
        distributed.minimize(loss)
    return main, startup, loss, distributed


def run_steps(exe, main, loss, distributed, steps, x_all, y_all):
    rank, world = fleet.worker_index(), fleet.worker_num()
    rows = BATCH // world
    scheduler = distributed.inner_opt._learning_rate
    losses = []
    for step in steps:
        start = step * BATCH + rank * rows
        feed = {"x": x_all[start:start + rows], "y": y_all[start:start + rows]}
        losses.append(float(exe.run(main, feed=feed, fetch_list=[loss])[0]))
        if isinstance(scheduler, paddle.optimizer.lr.LRScheduler):
            scheduler.step()
    return losses


def parameters(main, scope):
    return {p.name: np.array(scope.find_var(p.name).get_tensor()).ravel().tolist()
            for p in main.global_block().all_parameters()}


def held_bytes(scope):
    """{variable: bytes} of every initialised tensor in `scope`."""
    held = {}
    for name in scope.local_var_names():
        try:
            tensor = scope.find_var(name).get_tensor()
        except RuntimeError:         # not a dense tensor (e.g. the executor's fetch list)
            continue
        if tensor._is_initialized():
            held[name] = np.array(tensor).nbytes
    return held


def accumulators(distributed):
    """{parameter: its optimizer state variables} as the optimizer created them (before pto
    removed any: read it where pto did not run, the values of removed ops are gone)."""
    found = {}
    for by_param in distributed.inner_opt._accumulators.values():
        for param, value in by_param.items():
            found.setdefault(param, []).append(value.name)
    return found


def train(config, shards, x_all, y_all):
    main, startup, loss, distributed = build(config, shards)
    exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + fleet.worker_index())      # ranks differ until the startup broadcast
        exe.run(startup)
        losses = run_steps(exe, main, loss, distributed, range(STEPS), x_all, y_all)
        report = distributed.compile_report
        result = {"losses": losses, "params": parameters(main, scope), "held": held_bytes(scope),
                  "applied": report.applied, "pto": report.record("pto").details if "pto" in report.applied else None}
        if "pto" not in report.applied:
            result["accumulators"] = accumulators(distributed)
        return result


def resume(shards, directory, x_all, y_all):
    """Load `directory` into a freshly built program and train steps 2 and 3."""
    main, startup, loss, distributed = build(CHECKPOINT_CONFIG, shards)
    exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + 100 + fleet.worker_index())
        exe.run(startup)
        fleet.load_model(directory, executor=exe, main_program=main)
        losses = run_steps(exe, main, loss, distributed, range(2, STEPS), x_all, y_all)
        return {"losses": losses, "params": parameters(main, scope)}


def save_and_continue(shards, directory, x_all, y_all):
    """Train steps 0 and 1, save, train steps 2 and 3: the continuation resuming must equal."""
    main, startup, loss, distributed = build(CHECKPOINT_CONFIG, shards)
    exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + fleet.worker_index())
        exe.run(startup)
        run_steps(exe, main, loss, distributed, range(2), x_all, y_all)
        fleet.save_persistables(exe, directory, main)
        losses = run_steps(exe, main, loss, distributed, range(2, STEPS), x_all, y_all)
        return {"losses": losses, "params": parameters(main, scope), "files": sorted(os.listdir(directory))}


def main():
    shards, directory = int(sys.argv[1]), sys.argv[2]
    paddle.enable_static()
    fleet.init(is_collective=True)
    x_all, y_all = models.digits(BATCH * STEPS)
    results = {config: train(config, shards, x_all, y_all) for config in CONFIGS}
    if fleet.worker_num() > 1 and shards == 2:
        results["continued"] = save_and_continue(shards, directory, x_all, y_all)
    if shards == 2:
        results["resumed"] = resume(shards, directory, x_all, y_all)
    write_result(json.loads(json.dumps(results)))


if __name__ == "__main__":
    main()
