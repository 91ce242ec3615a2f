"""Brings the process group up, runs one all-reduce, marks itself ready and holds until the
test's stop file appears (at most 60 s): the network-listener test looks at its sockets."""
import os
import sys
import time

import fleetlite as fleet

folder = sys.argv[1]
fleet.init(is_collective=True)
total = fleet.util.all_reduce(1)
open(os.path.join(folder, f"ready.{fleet.worker_index()}"), "w").write(str(int(total)))
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(folder, "stop")) and time.monotonic() < deadline:
    time.sleep(0.05)
