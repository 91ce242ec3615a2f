"""The worker side of harness.WorkerGroup: answer JSON requests on stdin until told to quit."""
import json
import sys
import time


def serve(step, barrier, info=None):
    """Run `step()` `reps` times per request; each sample starts after `barrier()`; an "info"
    request answers `info()` (facts about the contender, e.g. memory it holds).

    A step that returns a float reports its own time in ms (a paired difference, say).
    """
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            return
        if request["op"] == "ready":
            reply = {"ok": True}
        elif request["op"] == "info":
            reply = {"info": info() if info else None}
        else:
            times = []
            for _ in range(request["reps"]):
                barrier()
                started = time.perf_counter()
                own = step()
                elapsed = (time.perf_counter() - started) * 1000.0
                times.append(own if isinstance(own, float) else elapsed)
            reply = {"ms": times}
        print(json.dumps(reply), flush=True)
