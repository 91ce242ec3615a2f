"""The worker side of harness.WorkerGroup: answer JSON requests on stdin until told to quit."""
import json
import sys
import time


def serve(step, barrier, info=None):
    """Run `step()` `reps` times per request; each sample starts after `barrier()` (unless the
    request says "sync": false, e.g. to count only the steps' own traffic); an "info" request
    answers `info()` (facts about the contender, e.g. memory it holds).

    A step that returns a float reports its own time in ms (a paired difference, say).
    """
    def measure(request):
        times = []
        for _ in range(request["reps"]):
            if request.get("sync", True):
                barrier()
            started = time.perf_counter()
            own = step()
            elapsed = (time.perf_counter() - started) * 1000.0
            times.append(own if isinstance(own, float) else elapsed)
        return {"ms": times}

    answer({"info": lambda request: {"info": info() if info else None}, "measure": measure})


def answer(handlers):
    """Reply to each request with `handlers[request["op"]](request)` (a JSON-able dict); "ready"
    gets {"ok": true} and "quit" ends the loop."""
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            return
        reply = {"ok": True} if request["op"] == "ready" else handlers[request["op"]](request)
        print(json.dumps(reply), flush=True)
