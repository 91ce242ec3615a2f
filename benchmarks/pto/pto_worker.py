"""One rank of a pto benchmark contender: an Adam step over a model's parameter shapes.

    python -m benchmarks.pto.pto_worker CONTENDER MODEL      (started by pto.py, one process per rank)

The program holds the parameters and fixed gradients of MODEL (no forward or backward, so
only the optimizer step is timed) and Adam's update of them, built by the optimizer itself:
- one_rank: the whole update, as every rank runs it without pto;
- pto: the same program rewritten by fleetlite's pto pass (this rank's half of the update,
  then the broadcast of every parameter from its owner, 32 MiB buckets);
- exchange_broadcast / exchange_all_gather: the parameter exchange alone, as pto builds it
  (broadcast from each owner) or as one all_gather per round of buckets, each rank's part
  padded to the largest (what all_gather needs).
On "info" a rank answers the optimizer state bytes its scope holds.
"""
import json
import math
import sys
from pathlib import Path

import numpy as np

from benchmarks.harness.worker_loop import serve

SHAPES_FILE = Path(__file__).parents[1] / "harness" / "resnet50_shapes.json"
SHAPES = [tuple(s) for s in json.loads(SHAPES_FILE.read_text())["shapes"]]
MODELS = {"resnet50": SHAPES, "small_params": [(256,)] * 400}
BUCKET_MB = 32


def build(contender, shapes):
    import paddle
    from paddle.base.framework import pir_op_role_guard

    import fleetlite as fleet
    from fleetlite.compile import program_edit
    from fleetlite.strategies import pto
    from fleetlite.compile.pass_contract import CompileContext

    paddle.enable_static()
    fleet.init(is_collective=True)
    topology = fleet.api._topology()
    strategy = fleet.DistributedStrategy()
    strategy.pto = True
    strategy.pto_configs = {"allgather_bucket_MB": BUCKET_MB}
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        params = [paddle.static.create_parameter(list(s), "float32") for s in shapes]
        constant = paddle.nn.initializer.Constant(1e-3)
        grads = [paddle.static.create_parameter(list(s), "float32", default_initializer=constant) for s in shapes]
        optimizer = paddle.optimizer.Adam(1e-3)
        if contender in ("one_rank", "pto"):
            with pir_op_role_guard(program_edit.OPTIMIZE):
                optimizer.apply_gradients(list(zip(params, grads)))
        state = [v.name for by_param in optimizer._accumulators.values() for v in by_param.values()]
        if contender == "pto":
            context = CompileContext(main, strategy, topology, [])
            context.current_pass = pto.Pto.name
            pto.Pto(strategy).apply(context)
        elif contender.startswith("exchange_"):
            sizes = [program_edit.nbytes(p) for p in params]
            owners = pto.plan_partition(sizes, topology.world_size, "size")
            buckets = pto.plan_exchange(owners, sizes, BUCKET_MB << 20)
            if contender == "exchange_broadcast":
                for owner, members in buckets:
                    chosen = [params[i] for i in members]
                    pto._exchange(topology.rank, owner, chosen, chosen)
            else:
                all_gather_exchange(params, owners, buckets, topology)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    scope = paddle.static.global_scope()

    def state_bytes():
        held = [scope.find_var(name) for name in state]
        return sum(np.array(v.get_tensor()).nbytes for v in held if v is not None and v.get_tensor()._is_initialized())

    return (lambda: exe.run(main)), barrier(), state_bytes


def all_gather_exchange(params, owners, buckets, topology):
    """Round k: every rank's k-th bucket, padded to the longest, in one all_gather."""
    import paddle
    world, rank = topology.world_size, topology.rank
    by_owner = [[members for owner, members in buckets if owner == r] for r in range(world)]
    for round_index in range(max(len(b) for b in by_owner)):
        runs = [b[round_index] if round_index < len(b) else [] for b in by_owner]
        lengths = [sum(math.prod(params[i].shape) for i in run) for run in runs]
        longest = max(lengths)
        pieces = [paddle.reshape(params[i], [-1]) for i in runs[rank]]
        if lengths[rank] < longest:
            pieces.append(paddle.zeros([longest - lengths[rank]], "float32"))
        gathered = paddle._C_ops.all_gather(paddle.concat(pieces), 0, world)
        for owner, run in enumerate(runs):
            if owner == rank or not run:
                continue
            part = paddle.slice(gathered, [0], [owner * longest], [owner * longest + lengths[owner]])
            values = paddle.split(part, [math.prod(params[i].shape) for i in run]) if len(run) > 1 else [part]
            for i, value in zip(run, values):
                paddle.assign(paddle.reshape(value, params[i].shape), output=params[i])


def barrier():
    """fleet's barrier: it also meets the other ranks when no program has yet (the one-rank
    contender's programs hold no collective, and static-mode fleet.init defers the rendezvous)."""
    import fleetlite as fleet
    return fleet.barrier_worker


if __name__ == "__main__":
    step, wait, info = build(sys.argv[1], MODELS[sys.argv[2]])
    serve(step, wait, info)
