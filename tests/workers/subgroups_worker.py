"""A job of 2 "nodes" x 2 ranks on real gloo sub-groups (tests/runtime/test_subgroups.py).

1. The digits MLP trained for a few steps flat, with hierarchical all-reduce (intra-node
   reduce-scatter, inter-node all-reduce, intra-node all-gather on their own communicators),
   with it on two flat rings, and with nccl_comm_num = 2: final parameters, the communicators
   the compile report lists and the ones this process holds.
2. The compiled reduce-scatter called eagerly over a node (2 members) and over 4 members.
3. The eager trap: an eager paddle._C_ops all-reduce on an integer ring over this rank's node,
   then a static ring-0 all-reduce, run once through Paddle's own Executor.run (the trap: the
   node's sum) and once through fleetlite's (ring 0 bound back: the world's sum).
Rank r contributes 10**r to the sums, so each sum shows which ranks took part.
"""
import sys
from pathlib import Path

import numpy as np
import paddle
from paddle.base import core

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.compile import group_collectives  # noqa: E402
from fleetlite.runtime import process_group, subgroups  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support import models  # noqa: E402

BATCH, STEPS, SEED = 16, 3, 7
BUCKETS = {"fuse_grad_size_in_TFLOPS": 2, "last_comm_group_size_MB": 0}
STRATEGIES = {"flat": BUCKETS, "hierarchical": {"use_hierarchical_allreduce": True, **BUCKETS},
              "hierarchical_two_rings": {"use_hierarchical_allreduce": True, "nccl_comm_num": 2, **BUCKETS},
              "two_rings": {"nccl_comm_num": 2, **BUCKETS}}
NODE_RING = 77    # + node: integer ring ids (one per group: the key is also its store prefix), as a script would use


def train(fields, x_all, y_all):
    rank, world = fleet.worker_index(), fleet.worker_num()
    strategy = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(strategy, field, value)
    rows = BATCH // world
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = models.loss("mlp", x, y, 1)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1), strategy)
        _, params_grads = optimizer.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED)
        exe.run(startup)
        for step in range(STEPS):
            start = step * BATCH + rank * rows
            exe.run(main, feed={"x": x_all[start:start + rows], "y": y_all[start:start + rows]})
        params = {p.name: np.array(scope.find_var(p.name).get_tensor()).ravel().tolist() for p, _ in params_grads}
    lowering = optimizer.compile_report.record("gloo_lowering")
    ops = sorted({op.name() for op in main.global_block().ops if op.has_attr("ring_id")})
    return {"params": params, "communicators": lowering.details.get("communicators", []), "collectives": ops}


def eager_then_static():
    rank = fleet.worker_index()
    node = [r for r in range(4) if r // 2 == rank // 2]
    value = np.full([3], 10.0 ** rank, "float32")
    with process_group.dynamic_mode():
        ring = NODE_RING + rank // 2
        core.CommContextManager.create_gloo_comm_context(process_group.store(), str(ring), node.index(rank), 2)
        eager = float(paddle._C_ops.all_reduce(paddle.to_tensor(value), ring, 0).numpy()[0])
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [3], "float32")
        world_sum = paddle._C_ops.all_reduce(x, 0, 0)
    exe = paddle.static.Executor(paddle.CPUPlace())
    paddles_own = paddle.static.Executor.run.__wrapped__(exe, main, feed={"x": value}, fetch_list=[world_sum])[0]
    fleetlites = exe.run(main, feed={"x": value}, fetch_list=[world_sum])[0]
    return {"eager": eager, "paddles_run": float(paddles_own[0]), "fleetlite_run": float(fleetlites[0])}


def own_rows(rank):
    """What `rank` hands a reduce-scatter: 8 x 3, different on every rank."""
    return (np.arange(24, dtype="float32").reshape(8, 3) + 1) * (rank + 1) + 0.25 * rank


def reduce_scatters():
    """This rank's share of the compiled reduce-scatter (a ring of point-to-point steps) over its
    node (2 members) and over the world's copy on channel 1 (4 members), called eagerly."""
    rank = fleet.worker_index()
    node = [r for r in range(4) if r // 2 == rank // 2]
    shares = {}
    with process_group.dynamic_mode():
        for members in (node, [0, 1, 2, 3]):
            key = group_collectives.comm_key(0 if len(members) == 2 else 1, members)
            share = group_collectives.reduce_scatter(paddle.to_tensor(own_rows(rank)), key, len(members))
            shares[len(members)] = share.numpy().tolist()
    return shares


def main():
    paddle.enable_static()
    fleet.init(is_collective=True)
    x_all, y_all = models.digits(BATCH * STEPS)
    results = {name: train(fields, x_all, y_all) for name, fields in STRATEGIES.items()}
    results["held"] = sorted(subgroups.created())
    results["reduce_scatter"] = reduce_scatters()
    results["trap"] = eager_then_static()
    write_result(results)


if __name__ == "__main__":
    main()
