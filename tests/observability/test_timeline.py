"""The step timeline: timestamp pairs compiled around each collective and the optimizer update
(checked op by op in this process), and whole jobs' traces checked against the Trace Event
Format: required fields, a named track per rank, each collective nested inside its step on its
rank's track, bucket bytes in args. One static job (--timeline) and one fleet.train_step job
(FLEETLITE_TIMELINE); the second is also drawn by `fleetlite plot`."""
import json
import os
import subprocess
import sys

import pytest

from fleetlite import Topology, cli
from support.in_process import strategy
from support.models import compiled_program
from support.multiprocess import FLEETRUN, SCRIPTS, clean_environment, fleetrun

STAMP = "custom_op.fleetlite_timestamp_"
ROUNDING_US = 0.01
REQUIRED = {"X": ("name", "ph", "ts", "dur", "pid", "tid"), "M": ("name", "ph", "pid", "args")}


def test_a_stamp_pair_brackets_each_bucket_all_reduce_and_the_optimizer_update():
    main, _, built = compiled_program(strategy(fuse_all_reduce_ops=False), Topology.grid(2), timeline=True)
    events = built.report.step_events
    assert [e["name"] for e in events] == [f"all_reduce bucket {i}" for i in range(4)] + ["optimizer update"]
    assert [e["args"]["bytes"] for e in events[:4]] == [40, 1280, 128, 8192]     # the MLP's gradients, ready order
    ops = list(main.global_block().ops)
    collectives = [op for op in ops if op.name() == "pd_op.all_reduce_"]
    for event, collective in zip(events, collectives):
        before = collective.operand_source(0).get_defining_op()
        (after,) = collective.result(0).all_used_ops()
        assert (before.name(), before.attrs()["slot"], after.name(), after.attrs()["slot"]) == \
            (STAMP, event["begin"], STAMP, event["end"])
    update = [i for i, op in enumerate(ops) if op.op_role == 2 and op.name() != STAMP]
    slots = {op.attrs()["slot"]: i for i, op in enumerate(ops) if op.name() == STAMP}
    assert update[0] < slots[events[-1]["begin"]] < update[-1] < slots[events[-1]["end"]]
    assert [ops[i].name() for i in update[-4:]] == ["pd_op.sgd_"] * 4
    untimed, _, plain = compiled_program(strategy(fuse_all_reduce_ops=False), Topology.grid(2))
    assert plain.report.step_events is None and STAMP not in {op.name() for op in untimed.global_block().ops}


def check_trace(trace, ranks, steps):
    """The Trace Event Format's rules that Perfetto and chrome://tracing rely on, and the
    timeline's own: a named track per rank, every event of a step inside it."""
    events = trace["traceEvents"]
    for event in events:
        assert all(key in event for key in REQUIRED[event["ph"]]), event
        if event["ph"] == "X":
            assert event["dur"] >= 0 and isinstance(event["ts"], (int, float))
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {rank: f"rank {rank} (127.0.0.1)" for rank in ranks}
    for rank in ranks:
        track = [e for e in events if e["ph"] == "X" and e["pid"] == rank]
        step_events = [e for e in track if e["cat"] == "step"]
        assert [e["name"] for e in step_events] == [f"step {i}" for i in range(steps)]
        inner = [e for e in track if e["cat"] not in ("step", "host")]
        for event in inner:
            holders = [s for s in step_events if s["ts"] - ROUNDING_US <= event["ts"]
                       and event["ts"] + event["dur"] <= s["ts"] + s["dur"] + ROUNDING_US]
            assert len(holders) == 1, event
        collectives = [e for e in inner if "all_reduce" in e["name"]]
        assert len(collectives) >= steps and all(e["args"]["bytes"] > 0 for e in collectives)
        assert {e["name"] for e in inner} >= {"compute", "optimizer update", "all_reduce bucket 0"}
        assert [e["name"] for e in track if e["cat"] == "host"] == [f"host before step {i}" for i in range(1, steps)]
    return events


def last_loss(output):
    return next(line for line in output.splitlines() if "trained 5 steps" in line).rsplit(" ", 1)[1]


def test_a_static_job_writes_one_trace_with_a_track_per_rank_and_trains_as_without_it(tmp_path):
    job = ["--nproc_per_node", "2", "--quiet", os.path.join(SCRIPTS, "timed_steps.py"), "--steps", "5"]
    timed = fleetrun(["--log_dir", "timed", "--timeline", "trace.json", *job], tmp_path, timeout=150)
    assert timed.returncode == 0, timed.stdout + timed.stderr
    assert "timeline of this host's ranks in trace.json" in timed.stderr
    trace = json.loads((tmp_path / "trace.json").read_text())
    check_trace(trace, (0, 1), 5)
    assert all(abs(offset) < 0.01 for offset in trace["otherData"]["clock_offsets_s"].values())
    plain = fleetrun(["--log_dir", "plain", *job], tmp_path, timeout=150)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert last_loss(timed.stdout) == last_loss(plain.stdout)       # the stamps change no value


def test_a_train_step_job_traces_through_the_environment_and_fleetlite_plot_draws_it(tmp_path):
    result = subprocess.run([*FLEETRUN, "--nproc_per_node", "2", "--log_dir", "log", "--quiet",
                             os.path.join(SCRIPTS, "timed_steps.py"), "--steps", "5", "--dygraph"], cwd=tmp_path,
                            env={**clean_environment(), "FLEETLITE_TIMELINE": "trace.json"}, capture_output=True,
                            text=True, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    check_trace(json.loads((tmp_path / "trace.json").read_text()), (0, 1), 5)
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", str(tmp_path / "trace.json"), "-o", str(tmp_path / "steps.png")]) == 0
    assert (tmp_path / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    assert cli.main(["plot", str(tmp_path / "trace.json"), "-o", str(tmp_path / "out.png")]) == 2
    assert capsys.readouterr().err == "fleetlite: error: fleetlite plot needs matplotlib: pip install 'fleetlite[plot]'\n"


def test_the_top_k_exchange_is_one_event_found_by_its_passs_ops_with_its_collectives_inside():
    topk = {"topk": True, "topk_configs": {"density": 0.05, "min_numel": 1000}}    # linear_0.w_0 (2048) sparse
    main, _, built = compiled_program(strategy(**topk), Topology.grid(2), timeline=True)
    events = built.report.step_events
    exchanges = [e for e in events if e["kind"] == "topk"]     # one per run of the pass's ops
    assert exchanges and all(e["name"] == "topk selection and exchange (topk)" for e in exchanges)
    slots = {op.attrs()["slot"]: i for i, op in enumerate(main.global_block().ops) if op.name() == STAMP}
    gathers = [e for e in events if e["kind"] == "all_gather"]
    assert gathers and all(any(slots[x["begin"]] < slots[e["begin"]] < slots[e["end"]] < slots[x["end"]]
                               for x in exchanges) for e in gathers)
