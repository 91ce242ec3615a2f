"""One real 2-rank fleetrun job on a pseudo-terminal, rank 1 sleeping before each step (a slow
input pipeline): fleetrun names rank 1 the straggler (not rank 0, which waits for it in the
all-reduce), writes the summary as JSON beside the logs, and shows a live progress line on the
terminal, which no worker log holds."""
import json
import os
import pty
import select
import stat
import subprocess
import time

from support.multiprocess import FLEETRUN, SCRIPTS, clean_environment

DEADLINE_S = 120


def run_on_a_terminal(args, cwd):
    """(exit status, everything fleetrun wrote to its terminal)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen([*FLEETRUN, *args], cwd=cwd, env=clean_environment(), stdin=subprocess.DEVNULL,
                               stdout=follower, stderr=follower, start_new_session=True)
    os.close(follower)
    output, deadline = b"", time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    data = os.read(leader, 65536)
                except OSError:     # the terminal closed: fleetrun has ended
                    break
                if not data:
                    break
                output += data
            elif process.poll() is not None:
                break
    finally:
        os.close(leader)
        if process.poll() is None:
            os.killpg(process.pid, 9)
    return process.wait(10), output.decode(errors="replace")


def test_a_rank_that_sleeps_before_each_step_is_named_and_progress_shows_on_the_terminal(tmp_path):
    code, console = run_on_a_terminal(["--nproc_per_node", "2", "--log_dir", "log",
                                       os.path.join(SCRIPTS, "timed_steps.py"), "--steps", "16",
                                       "--sleep_rank", "1", "--sleep_s", "0.1"], tmp_path)
    assert code == 0, console
    assert "fleetrun: straggler: rank 1 spends" in console, console
    summary = json.loads((tmp_path / "log" / "step_summary.json").read_text())
    assert summary["straggler"] == 1 and [r["steps"] for r in summary["ranks"]] == [16, 16]
    assert summary["ranks"][0]["waiting_share"] > 0.5 > summary["ranks"][1]["waiting_share"]
    for rank in (0, 1):
        assert stat.S_IMODE(os.stat(tmp_path / "log" / ".fleetlite" / f"rank{rank}.steps.json").st_mode) == 0o600
    assert "\r\x1b[Kfleetrun: step " in console and "/16 | " in console and "samples/s | loss " in console, console
    logs = "".join((tmp_path / "log" / f"workerlog.{rank}").read_text() for rank in (0, 1))
    assert "samples/s" not in logs and "\r" not in logs
