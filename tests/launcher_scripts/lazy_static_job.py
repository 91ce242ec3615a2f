"""A static-mode job whose ranks meet only when the startup program runs: fleet.init and a whole
minimize leave the rendezvous deferred, then the digits MLP trains as in the parity tests.
Writes OUT/result.<rank>.json: losses, parameters, and whether the rendezvous was still deferred
after init and minimize, and after training.

Usage: lazy_static_job.py OUT SHARDS   (SHARDS: the world size; the one-process oracle passes the
                                        world it stands for and sees the whole batch)
"""
import json
import sys
from pathlib import Path

import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.runtime import process_group  # noqa: E402
from support import models  # noqa: E402
from workers.parity_worker import BATCH, STEPS, train  # noqa: E402


def main():
    out, shards = Path(sys.argv[1]), int(sys.argv[2])
    paddle.enable_static()
    fleet.init(is_collective=True)
    main_program, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main_program, startup):
        x = paddle.static.data("x", [4, 64], "float32")
        y = paddle.static.data("y", [4, 1], "int64")
        fleet.distributed_optimizer(paddle.optimizer.SGD(0.1)).minimize(models.loss("mlp", x, y, 1))
    deferred_after_minimize = process_group.deferred()
    x_all, y_all = models.digits(BATCH * STEPS)
    result = train("mlp", {"fuse_grad_size_in_MB": 16}, shards, x_all, y_all)
    result.update(deferred_after_minimize=deferred_after_minimize, deferred_after_training=process_group.deferred(),
                  group_up=process_group.is_up())
    (out / f"result.{fleet.worker_index()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
