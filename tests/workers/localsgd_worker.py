"""Train the digits MLP under localsgd and adaptive_localsgd on this rank's rows (r::N of each
step's batch) and record, after every step, the loss, the parameters and (adaptive) the k the
program holds. Rank 0 also runs the oracle in this process: N copies of Paddle's plain program
on the same rows from the same (broadcast) start, averaged on the steps Fleet's rule picks
(support/local_sgd.py). Writes OUT/result.<rank>.json.

Usage: localsgd_worker.py OUT        (under fleetlite run / fleetrun, world size dividing 16)
"""
import json
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from support import local_sgd, models  # noqa: E402
from workers.knob_pairs_worker import make_strategy  # noqa: E402
from workers.meta_optimizer_worker import program  # noqa: E402

BATCH, STEPS, SEED, LR = 16, 10, 7, 0.2
CASES = {   # name: (inner optimizer, strategy fields, the oracle's schedule)
    "localsgd": (lambda: paddle.optimizer.Momentum(LR, momentum=0.5),
                 {"localsgd": True, "localsgd_configs": {"k_steps": 3, "begin_step": 2}},
                 lambda: local_sgd.FleetSchedule(2, 3)),
    "adaptive_localsgd": (lambda: paddle.optimizer.SGD(LR),
                          {"adaptive_localsgd": True, "adaptive_localsgd_configs": {"init_k_steps": 4}},
                          lambda: local_sgd.FleetSchedule(1, 4, adaptive=True)),
}


def flat(scope, names):
    return np.concatenate([np.array(scope.find_var(n).get_tensor()).ravel() for n in names]).tolist()


def train(name, x, y):
    make_inner, fields, make_schedule = CASES[name]
    rank, world = fleet.worker_index(), fleet.worker_num()
    main, startup, loss, optimizer, names = program(
        BATCH // world, lambda: fleet.distributed_optimizer(make_inner(), make_strategy(fields)))
    details = optimizer.compile_report.record(name).details
    feeds = [[{"x": x[s * BATCH:(s + 1) * BATCH][r::world], "y": y[s * BATCH:(s + 1) * BATCH][r::world]}
              for r in range(world)] for s in range(STEPS)]
    exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
    result = {"losses": [], "params": [], "k": [], "applied": optimizer.compile_report.applied,
              "ops": [op.name() for op in main.global_block().ops]}
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + rank)    # ranks differ until the startup broadcast
        exe.run(startup)
        initial = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
        for step_feeds in feeds:
            result["losses"].append(float(exe.run(main, feed=step_feeds[rank], fetch_list=[loss])[0]))
            result["params"].append(flat(scope, names))
            if "k_steps_value" in details:
                result["k"].append(int(np.array(scope.find_var(details["k_steps_value"]).get_tensor())[0]))
    if rank == 0:
        plain = lambda: (lambda m, s, loss_, _, n: (m, s, loss_, n))(*program(BATCH // world, make_inner))
        losses, params, syncs = local_sgd.simulate(plain, initial, feeds, make_schedule(), LR)
        result["oracle"] = {"losses": losses, "syncs": syncs,
                            "params": [[np.concatenate([copy[n].ravel() for n in names]).tolist() for copy in step]
                                       for step in params]}
    return result


def main():
    out = Path(sys.argv[1])
    paddle.enable_static()
    fleet.init(is_collective=True)
    x, y = models.digits(BATCH * STEPS)
    results = {name: train(name, x, y) for name in CASES}
    (out / f"result.{fleet.worker_index()}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
