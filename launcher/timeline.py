"""`fleetrun --timeline PATH`: the job's steps as one Chrome trace (Trace Event Format), loadable in
Perfetto (https://ui.perfetto.dev) and chrome://tracing.

One track (`pid`) per rank, named `rank N (host)`. Per step: a complete event (`ph: "X"`)
`step N`, and before it `host before step N`, the time the rank spent outside any step (input
pipeline, the script's own code). Inside the step, the events the compiled timestamp pairs
measured (fleetlite.compile.step_events): each collective by its bucket (`all_reduce bucket 0`,
bytes in `args`), the top-k selection and exchange, the optimizer update; what is left of the
step between them is `compute`. Every event is clipped to its step, so each nests inside it.
Times are microseconds from the job's first event. Ranks on other hosts read other clocks, so
each rank's clock is moved by one offset against the first rank's, measured from the job itself:
a collective ends on every rank at nearly the same instant (the last rank's data completes it),
so the offset is the median, over the steps, of the difference between the ends of the step's
last collective (0 on one host, up to a few microseconds of noise; 0 without compiled events).
"""
import json
import os
import statistics

ORIGIN_NOTE = "microseconds since the first event of the job"


def _complete(name, category, pid, start, seconds, origin, args=None):
    begin, end = round((start - origin) * 1e6, 3), round((start + max(seconds, 0.0) - origin) * 1e6, 3)
    event = {"name": name, "cat": category, "ph": "X", "pid": pid, "tid": 0, "ts": begin, "dur": round(end - begin, 3)}
    if args:
        event["args"] = args
    return event


def _collective_ends(record):
    """{step: end of its last collective} on this rank's clock."""
    ends = {}
    for step, _name, begin, seconds, args in record.events:
        if "collective" in args:
            ends[step] = max(ends.get(step, 0.0), begin + seconds)
    return ends


def clock_offsets(records):
    """{rank: seconds to add to its clock to read the first rank's}."""
    reference = _collective_ends(records[0])
    offsets = {}
    for record in records:
        ends = _collective_ends(record)
        shared = [reference[step] - ends[step] for step in ends if step in reference]
        offsets[record.rank] = statistics.median(shared) if shared else 0.0
    return offsets


def _step_events(record, index, start, end, origin, offset):
    """The compiled events of step `index` clipped to [start, end], and compute in the gaps."""
    inner = sorted(((max(start, begin + offset), min(end, begin + offset + seconds), name, args)
                    for step, name, begin, seconds, args in record.events if step == index),
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
    offsets = clock_offsets(records)
    origin = min(r.start_s[0] + offsets[r.rank] - r.host_s[0] for r in records)
    events = []
    for record in records:
        events.append({"name": "process_name", "ph": "M", "pid": record.rank, "tid": 0,
                       "args": {"name": f"rank {record.rank} ({hosts.get(record.rank, '?')})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": record.rank, "tid": 0,
                       "args": {"sort_index": record.rank}})
        for index, (started, seconds, host) in enumerate(zip(record.start_s, record.step_s, record.host_s)):
            start = started + offsets[record.rank]
            if host > 0:
                events.append(_complete(f"host before step {index}", "host", record.rank, start - host, host, origin))
            events.append(_complete(f"step {index}", "step", record.rank, start, seconds, origin, {"step": index}))
            events += _step_events(record, index, start, start + seconds, origin, offsets[record.rank])
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "fleetrun --timeline", "ts": ORIGIN_NOTE,
                          "clock_offsets_s": {str(rank): offset for rank, offset in offsets.items()}}}


def write_timeline(path, trace):
    partial = f"{path}.partial"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(partial, "w") as out:
        json.dump(trace, out)
    os.replace(partial, path)
