"""A tiny data-parallel linear regression with fault injection, for fleetrun's tests.

Each step every rank takes its slice of the same global batch, computes its gradient
(Tensor.backward, which the bootstrap counts as progress), all-reduces it and takes an SGD step,
so every attempt is deterministic. With --fleet it starts with fleetlite's `fleet.init` instead
of Paddle's init_parallel_env, as a script run by srun, mpirun or a PaddleJob pod does, and
--endpoints DIR has each rank write what fleet.worker_endpoints() says to DIR/endpoints.<rank>.json. With --checkpoint, rank 0 saves (step, weights) after every
step and all ranks resume from it, as a script under `fleetrun --max_restarts` should.

--fail RANK:STEP:HOW makes RANK fail before STEP on the first attempt only (restart count 0):
raise (an exception), exit (code 3), kill (SIGKILL itself) or stall (sleep for an hour).
"""
import argparse
import json
import os
import socket
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import paddle.distributed as dist

import fleetlite as fleet

FEATURES, GLOBAL_BATCH, LEARNING_RATE = 8, 16, 0.05


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step_seconds", type=float, default=0.0, help="sleep per step")
    parser.add_argument("--fail", default=None, help="RANK:STEP:HOW")
    parser.add_argument("--checkpoint", default=None, help="a .npz file")
    parser.add_argument("--out", default=None, help="rank 0 writes the final weights here (.npy)")
    parser.add_argument("--child", action="store_true", help="start a `sleep` child, print its pid")
    parser.add_argument("--fleet", action="store_true", help="fleet.init instead of init_parallel_env")
    parser.add_argument("--endpoints", default=None, help="a folder for each rank's endpoints.<rank>.json")
    return parser.parse_args()


def fail(how):
    if how == "raise":
        raise ValueError("injected failure")
    if how == "exit":
        sys.exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "stall":
        time.sleep(3600)


def batch(step, rank, world):
    data = np.random.RandomState(step)
    x = data.randn(GLOBAL_BATCH, FEATURES).astype("float32")
    y = x @ np.arange(1, FEATURES + 1, dtype="float32")
    mine = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    return paddle.to_tensor(x[mine]), paddle.to_tensor(y[mine])


def resume(path):
    if path and os.path.exists(path):
        saved = np.load(path)
        return int(saved["step"]) + 1, saved["weights"]
    return 0, np.zeros(FEATURES, dtype="float32")


def main():
    args = parse_args()
    if args.fleet:
        fleet.init(is_collective=True)
    else:
        dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.endpoints:
        with open(os.path.join(args.endpoints, f"endpoints.{rank}.json"), "w") as out:
            json.dump({"host": socket.gethostname(), "endpoints": fleet.worker_endpoints()}, out)
    print(f"rank {rank} pid {os.getpid()}", flush=True)
    if args.child:
        child = subprocess.Popen(["sleep", "600"])
        print(f"rank {rank} child pid {child.pid}", flush=True)
    first_step, weights = resume(args.checkpoint)
    w = paddle.to_tensor(weights, stop_gradient=False)
    restart = int(os.environ.get("FLEETLITE_RESTART_COUNT", "0"))
    fail_rank, fail_step, how = (args.fail.split(":") if args.fail else (-1, -1, None))
    for step in range(first_step, args.steps):
        if restart == 0 and rank == int(fail_rank) and step == int(fail_step):
            fail(how)
        x, y = batch(step, rank, world)
        loss = ((paddle.matmul(x, w) - y) ** 2).sum() / GLOBAL_BATCH
        loss.backward()
        grad = w.grad.clone()
        if world > 1:  # Paddle brings up no group for a single process
            dist.all_reduce(grad)
        with paddle.no_grad():
            w.subtract_(LEARNING_RATE * grad)
        w.clear_gradient()
        if rank == 0 and args.checkpoint:
            np.savez(args.checkpoint + ".tmp.npz", step=step, weights=w.numpy())
            os.replace(args.checkpoint + ".tmp.npz", args.checkpoint)
        print(f"rank {rank} step {step} loss {float(loss):.6f}", flush=True)
        time.sleep(args.step_seconds)
    if rank == 0 and args.out:
        np.save(args.out, w.numpy())


if __name__ == "__main__":
    main()
