"""`fleetrun --timeline PATH`: the job's steps as one Chrome trace (Trace Event Format), loadable in
Perfetto (https://ui.perfetto.dev) and chrome://tracing.

One track (`pid`) per rank, named `rank N (host)`. Per step: a complete event (`ph: "X"`)
`step N`, and before it `host before step N`, the time the rank spent outside any step (input
pipeline, the script's own code). Inside the step, the events the compiled timestamp pairs
measured (fleetlite.compile.step_events): each collective by its bucket (`all_reduce bucket 0`,
bytes in `args`), the top-k selection and exchange, the optimizer update; what is left of the
step between them is `compute`. Every event is clipped to its step, so each nests inside it.
Times are microseconds from the job's first event, each rank's clock moved by the offset it
measured against rank 0's at start (step_records).
"""
import json
import os

ORIGIN_NOTE = "microseconds since the first event of the job"


def _complete(name, category, pid, start, seconds, origin, args=None):
    event = {"name": name, "cat": category, "ph": "X", "pid": pid, "tid": 0,
             "ts": round((start - origin) * 1e6, 3), "dur": round(max(seconds, 0.0) * 1e6, 3)}
    if args:
        event["args"] = args
    return event


def _step_events(record, index, start, end, origin):
    """The compiled events of step `index` clipped to [start, end], and compute in the gaps."""
    inner = sorted(((max(start, begin + record.clock_offset_s), min(end, begin + record.clock_offset_s + seconds),
                     name, args) for step, name, begin, seconds, args in record.events if step == index),
                   key=lambda event: (event[0], -event[1]))
    events, cursor = [], start
    for begin, finish, name, args in inner:
        if begin > cursor:
            events.append(_complete("compute", "compute", record.rank, cursor, begin - cursor, origin))
        events.append(_complete(name, args.get("kind", "event"), record.rank, begin, finish - begin, origin, args))
        cursor = max(cursor, finish)
    if inner and end > cursor:
        events.append(_complete("compute", "compute", record.rank, cursor, end - cursor, origin))
    return events


def chrome_trace(records, hosts):
    """The trace (a dict) of the step records that have wall-clock starts; `hosts`: {rank: host}."""
    records = sorted((r for r in records if r is not None and r.start_s), key=lambda r: r.rank)
    if not records:
        return None
    origin = min(r.start_s[0] + r.clock_offset_s - r.host_s[0] for r in records)
    events = []
    for record in records:
        events.append({"name": "process_name", "ph": "M", "pid": record.rank, "tid": 0,
                       "args": {"name": f"rank {record.rank} ({hosts.get(record.rank, '?')})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": record.rank, "tid": 0,
                       "args": {"sort_index": record.rank}})
        for index, (started, seconds, host) in enumerate(zip(record.start_s, record.step_s, record.host_s)):
            start = started + record.clock_offset_s
            if host > 0:
                events.append(_complete(f"host before step {index}", "host", record.rank, start - host, host, origin))
            events.append(_complete(f"step {index}", "step", record.rank, start, seconds, origin, {"step": index}))
            events += _step_events(record, index, start, start + seconds, origin)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "fleetrun --timeline", "ts": ORIGIN_NOTE}}


def write_timeline(path, trace):
    partial = f"{path}.partial"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(partial, "w") as out:
        json.dump(trace, out)
    os.replace(partial, path)
