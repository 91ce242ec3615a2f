"""What Paddle users do with the persistable values of a trained program, on fleetlite's compiled
program: list them by name, look them up in the scope, `program.state_dict()`,
`paddle.static.save/load`, `paddle.static.save_inference_model`, `fleet.save_persistables` +
`fleet.load_model`. One program per strategy, each in its own scope, trained two steps on the
digits MLP; each rank writes what it found to OUT/result.<rank>.json.

Usage: save_compiled_programs.py OUT     (under fleetrun, any world size)
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from support import models, program_state  # noqa: E402

ROWS, STEPS = 8, 2
STRATEGIES = {
    "default": {},
    "gradient_merge": {"gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}},
    "pto": {"pto": True},
    "topk": {"topk": True, "topk_configs": {"density": 0.5, "min_numel": 100}},
}


def trained(fields, rank, world):
    strategy = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(strategy, field, value)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [ROWS, 64], "float32")
        y = paddle.static.data("y", [ROWS, 1], "int64")
        model = models.Mlp()
        logits = model(x)
        loss = paddle.nn.functional.cross_entropy(logits, y)
        fleet.distributed_optimizer(paddle.optimizer.Adam(0.01), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    x_all, y_all = models.digits(ROWS * STEPS * world)
    for step in range(STEPS):
        start = (step * world + rank) * ROWS
        exe.run(main, feed={"x": x_all[start:start + ROWS], "y": y_all[start:start + ROWS]})
    return main, startup, exe, x, logits, x_all[:ROWS]


def parameters(main):
    return program_state.in_scope(p.name for p in main.global_block().all_parameters())


def overwrite(names, value):
    scope = paddle.static.global_scope()
    for name in names:
        tensor = scope.find_var(name).get_tensor()
        tensor.set(np.full(np.array(tensor).shape, value, np.array(tensor).dtype), paddle.CPUPlace())


def check(name, fields, out, rank, world):
    main, startup, exe, x, logits, x_rows = trained(fields, rank, world)
    folder = os.path.join(out, name, f"rank{rank}")
    names = program_state.persistable_names(main)
    result = {"problems": program_state.problems(main, startup, paddle.static.global_scope()), "names": names,
              "state_dict": sorted(main.state_dict(scope=paddle.static.global_scope()))}
    before = parameters(main)
    paddle.static.save(main, os.path.join(folder, "static", "model"))
    overwrite(before, 0.0)
    paddle.static.load(main, os.path.join(folder, "static", "model"), exe)
    result["static_load_restores"] = _equal(before, parameters(main))
    paddle.static.save_inference_model(os.path.join(folder, "inference", "model"), [x], [logits], exe, program=main)
    program, feeds, fetches = paddle.static.load_inference_model(os.path.join(folder, "inference", "model"), exe)
    result["inference"] = exe.run(program, feed={feeds[0]: x_rows}, fetch_list=fetches)[0].tolist()
    checkpoint = os.path.join(out, name, "fleet_checkpoint")
    fleet.save_persistables(exe, checkpoint, main)
    fleet.util.barrier()
    overwrite(before, 0.0)
    fleet.load_model(checkpoint, main_program=main)
    result["fleet_load_restores"] = _equal(before, parameters(main))
    result["fleet_files"] = sorted(os.listdir(checkpoint))
    return result


def _equal(expected, actual):
    return sorted(expected) == sorted(actual) and all(np.array_equal(expected[n], actual[n]) for n in expected)


def main():
    out = sys.argv[1]
    paddle.enable_static()
    fleet.init(is_collective=True)
    rank, world = fleet.worker_index(), fleet.worker_num()
    results = {}
    for name, fields in STRATEGIES.items():
        with paddle.static.scope_guard(paddle.static.Scope()):
            results[name] = check(name, fields, out, rank, world)
    with open(os.path.join(out, f"result.{rank}.json"), "w") as result_file:
        json.dump(results, result_file)


if __name__ == "__main__":
    main()
