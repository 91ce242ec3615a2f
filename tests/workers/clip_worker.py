"""Train every gradient-clipping / weight-decay case for a few micro-steps on this rank's shard;
report the initial and final trainable parameters, the losses, the passes that ran and the
number of gradient buckets (the clipping tests compare them with one process on the full
batch, and that one with Paddle's dynamic mode).

Usage: clip_worker.py CASES_JSON
The model is the digits MLP, without batch norm: the shards do not change the function, so the
one-process result is the oracle of every world size. A real rank feeds BATCH // world rows of
each micro-step's batch, the one-process oracle all of them. A case is
  {"optimizer": "sgd"|"momentum"|"adam"|"adamw", "clip": [kind, bound] or null,
   "decay": {"parameter": "L1"|"L2", "optimizer": "L1"|"L2"} (either or none),
   "clip_hidden_weight": true, "strategy": {field: value}, "clip_before_reduce": false}
where kind is "global_norm", "norm" or "value" (ClipGradByValue(bound, -bound)); a parameter
decay is set on the hidden layer's weight through ParamAttr(regularizer=...), an optimizer decay
as weight_decay=... (AdamW always has its own decoupled weight decay); "clip_hidden_weight":
false sets need_clip=False on that weight. clip_before_reduce builds what fleetlite must never
build, so that a test can show parity would catch it: each rank clips its own gradients by
their own norm and only then are they averaged.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.compile import compiler  # noqa: E402
from fleetlite.runtime import training_program  # noqa: E402
from fleetlite.topology.env_contract import read_topology  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support import models  # noqa: E402

BATCH, MICRO_STEPS, SEED = 16, 4, 31
DECAY_COEFF = 0.01
CLIPS = {"global_norm": paddle.nn.ClipGradByGlobalNorm, "norm": paddle.nn.ClipGradByNorm,
         "value": lambda bound: paddle.nn.ClipGradByValue(bound, -bound)}
DECAYS = {"L1": paddle.regularizer.L1Decay, "L2": paddle.regularizer.L2Decay}
# Adam's epsilon is large so that noise-level gradients (summation order) cannot flip an update's sign.
OPTIMIZERS = {"sgd": lambda **kw: paddle.optimizer.SGD(0.1, **kw),
              "momentum": lambda **kw: paddle.optimizer.Momentum(0.1, momentum=0.9, **kw),
              "adam": lambda **kw: paddle.optimizer.Adam(0.01, epsilon=1e-3, **kw),
              "adamw": lambda **kw: paddle.optimizer.AdamW(0.01, epsilon=1e-3, weight_decay=0.1, **kw)}


def make_optimizer(case, parameters=None, clip=True):
    """The case's optimizer (its clip left out with clip=False); `parameters` in dynamic mode."""
    options = {"parameters": parameters}
    if clip and case.get("clip"):
        kind, bound = case["clip"]
        options["grad_clip"] = CLIPS[kind](bound)
    if "optimizer" in case.get("decay", {}):
        options["weight_decay"] = DECAYS[case["decay"]["optimizer"]](DECAY_COEFF)
    return OPTIMIZERS[case["optimizer"]](**options)


def make_model(case):
    """The digits MLP; the case may regularize its hidden weight or leave it out of the clip."""
    decay = case.get("decay", {}).get("parameter")
    return models.Mlp(paddle.ParamAttr(regularizer=DECAYS[decay](DECAY_COEFF) if decay else None,
                                       need_clip=case.get("clip_hidden_weight", True)))


def make_strategy(fields):
    strategy = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(strategy, field, value)
    return strategy


def fleet_minimize(case, loss, startup):
    optimizer = fleet.distributed_optimizer(make_optimizer(case), make_strategy(case.get("strategy", {})))
    _, params_grads = optimizer.minimize(loss, startup)
    return params_grads, optimizer.compile_report


def clip_before_reduce(case, loss, startup):
    """Each rank clips its raw gradients, then fleetlite averages the clipped ones: a per-rank norm."""
    optimizer = make_optimizer(case, clip=False)
    kind, bound = case["clip"]
    clipped = CLIPS[kind](bound)(optimizer.backward(loss, startup))
    topology = read_topology(os.environ)
    gradients, report = compiler.compile(loss.block.program, clipped, make_strategy(case.get("strategy", {})), topology)
    optimizer.apply_gradients([(g.param, g.synced) for g in gradients])
    if topology.world_size > 1:
        training_program.broadcast_parameters(startup)
    return [(g.param, g.synced) for g in gradients], report


def train(case, x_all, y_all):
    rank, world = fleet.worker_index(), fleet.worker_num()
    rows = BATCH // world
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = paddle.nn.functional.cross_entropy(make_model(case)(x), y)
        minimize = clip_before_reduce if case.get("clip_before_reduce") else fleet_minimize
        params_grads, report = minimize(case, loss, startup)
    names = sorted(p.name for p, _ in params_grads)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + rank)              # ranks differ until the startup broadcast
        exe.run(startup)
        initial = {n: np.array(scope.find_var(n).get_tensor()).tolist() for n in names}
        losses = []
        for step in range(MICRO_STEPS):
            start = step * BATCH + rank * rows
            feed = {"x": x_all[start:start + rows], "y": y_all[start:start + rows]}
            losses.append(float(exe.run(main, feed=feed, fetch_list=[loss])[0]))
        params = {n: np.array(scope.find_var(n).get_tensor()).tolist() for n in names}
    return {"initial": initial, "losses": losses, "params": params, "applied": report.applied,
            "buckets": len(report.buckets)}


def main():
    cases = json.loads(sys.argv[1])
    paddle.enable_static()
    fleet.init(is_collective=True)
    x_all, y_all = models.digits(BATCH * MICRO_STEPS)
    write_result({name: train(case, x_all, y_all) for name, case in cases.items()})


if __name__ == "__main__":
    main()
