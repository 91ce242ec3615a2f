"""examples/train_digits.py's --checkpoint_dir, as the README and the user guide run it: 2 ranks
through fleetrun with --max_restarts 1; rank 1 is SIGKILLed once the first checkpoint exists,
fleetrun restarts both ranks, they resume from the newest checkpoint, and the job ends with
exactly the parameters and optimizer state of an uninterrupted run. With 1 rank, a checkpoint
folder that does not exist yet is created."""
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.multiprocess import FLEETRUN, clean_environment

ROOT = Path(__file__).resolve().parents[2]
# A small global batch makes each epoch long enough (~180 steps) for the kill to land mid-run; 3
# epochs leave a checkpoint to resume from and one to end with whichever epoch the kill lands in.
EPOCHS, BATCH = 3, 8
RANK_1_PID = re.compile(r"^\s+1\s+127\.0\.0\.1\s+cpu\s+\S+\s+(\d+)\s", re.MULTILINE)


def command(checkpoints, ranks=2, epochs=EPOCHS, batch=BATCH):
    return [*FLEETRUN, "--max_restarts", "1", "--nproc_per_node", str(ranks), "--log_dir", "log",
            str(ROOT / "examples" / "train_digits.py"), "--strategy", str(ROOT / "configs" / "cpu_gloo.yaml"),
            "--epochs", str(epochs), "--batch_size", str(batch), "--checkpoint_dir", str(checkpoints)]


def start(folder, checkpoints):
    """The example's job in the background, its output in folder/fleetrun.out."""
    folder.mkdir()
    with open(folder / "fleetrun.out", "w") as out:
        return subprocess.Popen(command(checkpoints), cwd=folder, env=clean_environment(), stdout=out,
                                stderr=subprocess.STDOUT)


def digests(folder):
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in sorted(os.listdir(folder))}


def test_a_killed_rank_is_restarted_and_the_job_resumes_to_the_uninterrupted_result(tmp_path):
    checkpoints, whole_checkpoints = tmp_path / "killed" / "ckpt", tmp_path / "whole" / "ckpt"
    jobs = [start(tmp_path / "killed", checkpoints), start(tmp_path / "whole", whole_checkpoints)]
    try:
        deadline = time.monotonic() + 120
        while not (checkpoints.is_dir() and any(name.startswith("epoch_") for name in os.listdir(checkpoints))):
            assert jobs[0].poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        os.kill(int(RANK_1_PID.search((tmp_path / "killed" / "fleetrun.out").read_text()).group(1)), signal.SIGKILL)
        for job, name in zip(jobs, ("killed", "whole")):
            assert job.wait(timeout=150) == 0, (tmp_path / name / "fleetrun.out").read_text()[-3000:]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
    output = (tmp_path / "killed" / "fleetrun.out").read_text()
    assert "root cause: rank 1 on 127.0.0.1" in output and "restart 1 of 1" in output
    resumed_at = int(re.search(r"resumed from \S+ at epoch (\d+)", output).group(1))
    assert 0 < resumed_at < EPOCHS, output[-3000:]
    assert os.listdir(checkpoints) == [f"epoch_{EPOCHS - 1}"] == os.listdir(whole_checkpoints)
    assert digests(checkpoints / f"epoch_{EPOCHS - 1}") == digests(whole_checkpoints / f"epoch_{EPOCHS - 1}")
    accuracy = re.compile(r"test accuracy .*")
    whole = (tmp_path / "whole" / "fleetrun.out").read_text()
    assert "resumed from" not in whole and accuracy.search(output).group(0) == accuracy.search(whole).group(0)


def test_one_rank_creates_a_checkpoint_folder_that_does_not_exist_yet(tmp_path):
    checkpoints = tmp_path / "not" / "yet"
    run = subprocess.run(command(checkpoints, ranks=1, epochs=1, batch=64),
                         cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert {"linear_0.w_0", "linear_0.w_0_velocity_0", "learning_rate_0"} <= set(os.listdir(checkpoints / "epoch_0"))
