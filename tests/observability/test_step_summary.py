"""The end-of-job step summary names the rank that holds the others back, not the ranks that
wait for it; the step records it reads are timed with two clock reads per step and written
owner-only; the live progress line says step, samples/s, loss, elapsed and ETA."""
import io
import os
import stat
import time

import pytest

from fleetlite.launcher.progress_line import ProgressLine, describe
from fleetlite.launcher.spec import parse_launch_spec
from fleetlite.launcher.step_records import StepRecord, StepRecorder, read_steps, write_steps
from fleetlite.launcher.step_summary import format_summary, summarize
from fleetlite.launcher.worker_records import Progress, ProgressWriter, read_progress


def _job(host_by_rank, compute=0.010, steps=10):
    """Step records of ranks that each spend `host_by_rank[rank]` s before each step: every step
    ends when the latest rank has arrived and computed."""
    latest = max(host_by_rank.values())
    return [StepRecord(rank, step_s=[1.0] + [compute + latest - host] * steps, host_s=[0.0] + [host] * steps)
            for rank, host in host_by_rank.items()]


def test_the_rank_with_long_host_time_is_the_straggler_not_the_ranks_that_wait_for_it():
    summary = summarize(_job({0: 0.001, 1: 0.001, 2: 0.041, 3: 0.001}))
    assert summary.straggler == 2
    assert "rank 2 spends 41.0 ms outside the step" in summary.reason and "wait 40.0 ms" in summary.reason
    waiting = {r.rank: round(r.waiting_share, 3) for r in summary.ranks}
    assert waiting[2] == 0 and waiting[0] == round(0.040 / 0.051, 3)
    assert [round(r.median_step_s, 3) for r in summary.ranks] == [0.05, 0.05, 0.01, 0.05]
    assert all(r.steps == 11 for r in summary.ranks)
    assert "fleetrun: straggler: rank 2" in format_summary(summary)[-1]


def test_balanced_ranks_or_one_rank_name_no_straggler():
    assert summarize(_job({0: 0.002, 1: 0.003})).straggler is None
    assert summarize(_job({0: 0.050})).straggler is None
    assert summarize([None, StepRecord(1, [0.1], [0.0])]) is None      # nothing but the warm-up step


def test_host_time_nobody_waits_for_is_no_straggler():
    records = [StepRecord(0, [1.0] + [0.01] * 5, [0.0] + [0.05] * 5), StepRecord(1, [1.0] + [0.01] * 5, [0.0] * 6)]
    assert summarize(records).straggler is None


def test_the_recorder_reads_two_clocks_per_step_and_writes_an_owner_only_file(tmp_path):
    ticks = iter([10.0, 10.5, 10.7, 11.0])
    recorder = StepRecorder(3, clock=lambda: next(ticks))
    for _ in range(2):
        recorder.begin()
        recorder.end()
    assert recorder.record.step_s == pytest.approx([0.5, 0.3]) and recorder.record.host_s == pytest.approx([0.0, 0.2])
    path = tmp_path / "rank3.steps.json"
    write_steps(str(path), recorder.record)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_steps(str(path)) == recorder.record and recorder.record.start_s == []


def test_the_progress_record_carries_training_steps_samples_and_what_the_script_reported(tmp_path):
    path = str(tmp_path / "rank0.progress")
    writer = ProgressWriter(path)
    writer.enter_step()                  # the startup program: no training step
    writer.enter_step(16)
    writer.report(0.25, 100)
    progress = read_progress(path)
    assert (progress.steps, progress.trained, progress.samples, progress.loss, progress.total_steps) == \
        (2, 1, 16, 0.25, 100)


def test_the_progress_line_says_step_rate_loss_elapsed_and_eta():
    first = read_like(trained=1, samples=16, time=100.0)
    now = read_like(trained=11, samples=176, time=102.0, loss=0.1234567, total_steps=51)
    assert describe(now, first, 2, 65) == "step 11/51 | 160 samples/s | loss 0.1235 | 1:05 elapsed | ETA 0:08"
    assert describe(first, first, 2, 1) == "step 1 | 0:01 elapsed"


def read_like(**fields):
    return Progress(**{"steps": fields.get("trained", 0), **fields})


def test_off_a_terminal_the_progress_line_is_a_plain_line_and_quiet_turns_it_off(tmp_path):
    path = str(tmp_path / "rank0.progress")
    ProgressWriter(path).enter_step(8)
    out = io.StringIO()
    line = ProgressLine(out, interval=0.01)
    line.start(path, 2)
    deadline = time.monotonic() + 10
    while "\n" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    line.stop()
    assert out.getvalue().startswith("fleetrun: progress: step 1 | ") and "\r" not in out.getvalue()
    assert parse_launch_spec(["--quiet", "t.py"], {}).quiet and not parse_launch_spec(["t.py"], {}).quiet
