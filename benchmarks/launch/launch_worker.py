"""One rank of the launch-speed benchmark: bring up the process group, one all-reduce of 4
floats, then write the wall-clock time it finished to <out>/rank<r>.

    launch_worker.py torch|paddle|fleetlite OUT   (started by a launcher, see launch_speed.py)
"""
import sys
import time
from pathlib import Path


def torch_first_all_reduce():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(4))
    return dist.get_rank()


def paddle_first_all_reduce():
    import paddle
    import paddle.distributed as dist
    dist.init_parallel_env()
    dist.all_reduce(paddle.ones([4]))
    return dist.get_rank()


def fleetlite_first_all_reduce():
    import fleetlite as fleet
    fleet.init(is_collective=True)
    fleet.util.all_reduce([1.0] * 4)
    return fleet.worker_index()


FIRST_ALL_REDUCE = {"torch": torch_first_all_reduce, "paddle": paddle_first_all_reduce,
                    "fleetlite": fleetlite_first_all_reduce}

if __name__ == "__main__":
    kind, out = sys.argv[1], Path(sys.argv[2])
    rank = FIRST_ALL_REDUCE[kind]()
    (out / f"rank{rank}").write_text(repr(time.time()))
