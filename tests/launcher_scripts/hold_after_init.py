"""Brings the process group up, runs one all-reduce, marks itself ready and holds until the
test's stop file appears (at most 60 s): the network-listener tests look at its sockets. Ranks
other than 0 start 1 s late, so rank 0's store listens long enough to be seen."""
import os
import sys
import time

import fleetlite as fleet

folder = sys.argv[1]
if os.environ["PADDLE_TRAINER_ID"] != "0":
    time.sleep(1)
fleet.init(is_collective=True)
total = fleet.util.all_reduce(1)
open(os.path.join(folder, f"ready.{fleet.worker_index()}"), "w").write(str(int(total)))
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(folder, "stop")) and time.monotonic() < deadline:
    time.sleep(0.05)
