"""Fleet's save idiom under fleetrun: the first worker saves, every rank waits in
fleet.util.barrier(), then every rank reads what was saved; each rank writes what it found to
OUT/result.<rank>.json.

Usage: fleet_save_idiom.py OUT              (any world size)
       fleet_save_idiom.py OUT --mismatch   (rank 0 calls fleet.util.all_reduce while the other
                                             ranks call fleet.util.barrier: fleetrun must stop it)
       fleet_save_idiom.py OUT --pto-idiom  (under pto, only the first worker saves: its gather
                                             meets the others' barrier, fleetrun must stop it)
"""
import json
import os
import sys

import numpy as np
import paddle

import fleetlite as fleet
from fleet_surface import CLASSES, FEATURES, batch, build, file_digests, overwrite_parameters, parameters


def save_then_read(out):
    paddle.enable_static()
    fleet.init(is_collective=True)
    rank, world = fleet.worker_index(), fleet.worker_num()
    paddle.seed(7)
    logits, loss = build()
    main = paddle.static.default_main_program()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    for step in range(2):
        exe.run(main, feed=batch(step, rank, world), fetch_list=[loss])
    ckpt, inference, saved = (os.path.join(out, name) for name in ("ckpt", "inference", "saved"))
    if fleet.is_first_worker():
        fleet.save_persistables(exe, ckpt, main)
        fleet.save_inference_model(exe, inference, ["x"], [logits], main)
        fleet.save(saved)
    fleet.util.barrier()
    trained = parameters(main)
    overwrite_parameters(main, 0.0)
    fleet.load_model(ckpt, executor=exe, main_program=main)
    program, feeds, fetches = paddle.static.load_inference_model(os.path.join(inference, "model"), exe)
    x = np.ones((1, FEATURES), "float32")
    result = {"loaded_matches": all(np.array_equal(value, parameters(main)[name]) for name, value in trained.items()),
              "ckpt": file_digests(ckpt), "saved": file_digests(saved),
              "inference": exe.run(program, feed={feeds[0]: x}, fetch_list=fetches)[0].tolist(),
              "hidden": [name for name in os.listdir(out) if name.startswith(".")]}
    with open(os.path.join(out, f"result.{rank}.json"), "w") as result_file:
        json.dump(result, result_file)


def idiom_under_pto(out):
    """Fleet's idiom under pto: only the first worker calls save_persistables, whose gather of
    the sharded optimizer state every rank must join, while the others wait in the barrier."""
    paddle.enable_static()
    fleet.init(is_collective=True)
    strategy = fleet.DistributedStrategy()
    strategy.pto = True
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, FEATURES], "float32")
        loss = paddle.nn.Linear(FEATURES, CLASSES)(x).mean()
        fleet.distributed_optimizer(paddle.optimizer.Adam(0.1), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    if fleet.is_first_worker():
        fleet.save_persistables(exe, os.path.join(out, "ckpt"), main)   # under pto every rank must call it
    fleet.util.barrier()


def mismatched_collectives():
    fleet.init(is_collective=True)
    if fleet.worker_index() == 0:
        fleet.util.all_reduce(1)   # rank 0 waits here
    else:
        fleet.util.barrier()       # the others wait here


if __name__ == "__main__":
    if sys.argv[2:] == ["--mismatch"]:
        mismatched_collectives()
    elif sys.argv[2:] == ["--pto-idiom"]:
        idiom_under_pto(sys.argv[1])
    else:
        save_then_read(sys.argv[1])
