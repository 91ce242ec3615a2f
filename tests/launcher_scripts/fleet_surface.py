"""The Fleet API that collective scripts use, exercised in one job; each rank writes what the
calls returned to OUT/result.<rank>.json.

Usage: fleet_surface.py OUT                 (under fleetrun / fleetlite run, any world size)
       fleet_surface.py OUT --kill-mid-save (one process: saves OUT/ckpt and the digests of
                                             its files, then is SIGKILLed while saving it again)

Checked in the job: a UserDefinedRoleMaker built the way Fleet scripts build it, agreeing with
PaddleCloudRoleMaker; fleet.util's all_reduce (sum, max, min), all_gather, barrier,
print_on_rank and get_file_shard; a model trained with fleet.ExecutionStrategy in its strategy;
save_persistables called by every rank (the first worker writes), loaded back by every rank
after fleet.util.barrier(), saved again over itself; save_inference_model and fleet.save, read
back by every rank; a save that fails on the first worker halfway through, which must raise
there and leave the previous checkpoint as it was; the collective no-ops (is_worker, is_server, init_worker, stop_worker).
"""
import contextlib
import hashlib
import io
import json
import os
import signal
import sys

import numpy as np
import paddle

import fleetlite as fleet
from fleetlite.base.role_maker import Role, UserDefinedRoleMaker

FEATURES, CLASSES, GLOBAL_BATCH = 8, 3, 8


def parameters(program):
    """{name: value} of every parameter of `program`, from the global scope."""
    scope = paddle.static.global_scope()
    return {p.name: np.array(scope.find_var(p.name).get_tensor()) for p in program.global_block().all_parameters()}


def file_digests(folder):
    """{file name: sha256 of its bytes} for the files in `folder`."""
    digests = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as saved:
            digests[name] = hashlib.sha256(saved.read()).hexdigest()
    return digests


def overwrite_parameters(program, value):
    scope = paddle.static.global_scope()
    for p in program.global_block().all_parameters():
        tensor = scope.find_var(p.name).get_tensor()
        tensor.set(np.full(np.array(tensor).shape, value, "float32"), paddle.CPUPlace())


@contextlib.contextmanager
def save_fails_after(files, how):
    """Make Paddle's per-variable save fail after `files` files: raise, or SIGKILL this process."""
    core = paddle.base.core
    original, written = core.save_func, []

    def failing(*args):
        if len(written) == files:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError("injected failure: the disk filled up")
        written.append(args[1])
        return original(*args)

    core.save_func = failing
    try:
        yield
    finally:
        core.save_func = original


def build():
    """A linear classifier in the default programs, trained by Adam through fleetlite."""
    x = paddle.static.data("x", [None, FEATURES], "float32")
    y = paddle.static.data("y", [None, 1], "int64")
    logits = paddle.nn.Linear(FEATURES, CLASSES)(x)
    loss = paddle.nn.functional.cross_entropy(logits, y).mean()
    strategy = fleet.DistributedStrategy()
    strategy.execution_strategy = fleet.ExecutionStrategy()     # Paddle 3 removed paddle.static's
    fleet.distributed_optimizer(paddle.optimizer.Adam(0.1), strategy).minimize(loss)
    return logits, loss


def batch(step, rank, world):
    data = np.random.RandomState(step)
    x = data.randn(GLOBAL_BATCH, FEATURES).astype("float32")
    y = data.randint(0, CLASSES, (GLOBAL_BATCH, 1)).astype("int64")
    mine = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    return {"x": x[mine], "y": y[mine]}


def as_lists(named_arrays):
    return {name: value.tolist() for name, value in sorted(named_arrays.items())}


def check_util(rank, world):
    util = fleet.util
    values = np.array([rank + 1, 10 * (rank + 1)], "float32")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        util.print_on_rank(f"printed by rank {rank}", 1)
    util.barrier()
    return {"sum": util.all_reduce(values, "sum").tolist(), "max": util.all_reduce(values, "max").tolist(),
            "min": util.all_reduce(values, mode="min").tolist(),
            "sum_dtype": str(util.all_reduce(values).dtype),
            "count_true": int(fleet.all_reduce(rank == world - 1)),
            "gathered": util.all_gather(rank), "gathered_objects": util.all_gather({"rank": rank, "r2": rank ** 2}),
            "printed": printed.getvalue(), "file_shard": util.get_file_shard(["a", "b", "c"])}


def check_saving(out, exe, main, logits, loss, rank, world):
    result = {}
    ckpt = os.path.join(out, "ckpt")
    fleet.save_persistables(exe, ckpt, main)
    fleet.util.barrier()                      # as in Fleet: the first worker's write is done
    trained = parameters(main)
    overwrite_parameters(main, 0.0)
    fleet.load_model(ckpt, executor=exe, main_program=main)
    result["loaded"] = as_lists(parameters(main))
    result["trained"] = as_lists(trained)
    result["ckpt_files"] = sorted(os.listdir(ckpt))

    exe.run(main, feed=batch(9, rank, world), fetch_list=[loss])          # one more step, then over itself
    fleet.save_persistables(exe, ckpt, main)
    fleet.util.barrier()
    retrained = parameters(main)
    overwrite_parameters(main, 0.0)
    fleet.load_model(ckpt, executor=exe, main_program=main)
    result["reloaded_matches"] = all(np.array_equal(v, parameters(main)[k]) for k, v in retrained.items())

    with save_fails_after(2, "raise") if rank == 0 else contextlib.nullcontext():
        for target in (ckpt, os.path.join(out, "ckpt_new")):
            try:
                fleet.save_persistables(exe, target, main)
                result[f"failed_save_{os.path.basename(target)}"] = "no error"
            except Exception as exc:  # what each rank saw
                result[f"failed_save_{os.path.basename(target)}"] = f"{type(exc).__name__}: {exc}"
            fleet.util.barrier()
    overwrite_parameters(main, 0.0)
    fleet.load_model(ckpt, executor=exe, main_program=main)
    result["after_failed_save_matches"] = all(np.array_equal(v, parameters(main)[k]) for k, v in retrained.items())
    result["out_listing"] = sorted(os.listdir(out))

    inference = os.path.join(out, "inference")
    fleet.save_inference_model(exe, inference, ["x"], [logits], main)
    fleet.util.barrier()
    program, feeds, fetches = paddle.static.load_inference_model(os.path.join(inference, "model"), exe)
    x = np.arange(2 * FEATURES, dtype="float32").reshape(2, FEATURES) / 10
    result["inference"] = exe.run(program, feed={feeds[0]: x}, fetch_list=fetches)[0].tolist()
    weight, bias = _weight_and_bias(main)
    result["inference_reference"] = (x @ weight + bias).tolist()
    fleet.save(os.path.join(out, "saved"))
    fleet.save(os.path.join(out, "saved_inference"), feed=["x"], fetch=[logits])
    fleet.util.barrier()
    result["fleet_save_files"] = sorted(os.listdir(os.path.join(out, "saved")))
    result["fleet_save_inference_files"] = sorted(os.listdir(os.path.join(out, "saved_inference")))
    return result


def _weight_and_bias(program):
    named = parameters(program)
    weight = next(v for v in named.values() if v.ndim == 2)
    bias = next(v for v in named.values() if v.ndim == 1)
    return weight, bias


def job(out):
    paddle.enable_static()
    role = UserDefinedRoleMaker(is_collective=True, current_id=int(os.environ["PADDLE_TRAINER_ID"]),
                                role=Role.WORKER, worker_num=int(os.environ["PADDLE_TRAINERS_NUM"]),
                                worker_endpoints=os.environ["PADDLE_TRAINER_ENDPOINTS"].split(","))
    fleet.init(role)
    rank, world = fleet.worker_index(), fleet.worker_num()
    result = {"rank": rank, "world": world, "nranks": fleet.nranks(),
              "cloud_role_maker_agrees": fleet.PaddleCloudRoleMaker(is_collective=True).topology(os.environ)
              == fleet.api._topology(),
              "is_worker": fleet.is_worker(), "is_server": fleet.is_server(),
              "init_worker": fleet.init_worker(), "stop_worker": fleet.stop_worker()}
    result["util"] = check_util(rank, world)
    paddle.seed(7)
    logits, loss = build()
    main = paddle.static.default_main_program()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    result["losses"] = [float(exe.run(main, feed=batch(step, rank, world), fetch_list=[loss])[0])
                        for step in range(3)]
    result.update(check_saving(out, exe, main, logits, loss, rank, world))
    with open(os.path.join(out, f"result.{rank}.json"), "w") as result_file:
        json.dump(result, result_file)


def killed_mid_save(out):
    """One process: a complete checkpoint, then a save over it that is SIGKILLed halfway."""
    paddle.enable_static()
    fleet.init(is_collective=True)
    build()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    ckpt = os.path.join(out, "ckpt")
    fleet.save_persistables(exe, ckpt)
    with open(os.path.join(out, "ckpt.sha256.json"), "w") as digests:
        json.dump(file_digests(ckpt), digests)
    overwrite_parameters(paddle.static.default_main_program(), 5.0)
    with save_fails_after(2, "kill"):
        fleet.save_persistables(exe, ckpt)


if __name__ == "__main__":
    if sys.argv[2:] == ["--kill-mid-save"]:
        killed_mid_save(sys.argv[1])
    else:
        job(sys.argv[1])
