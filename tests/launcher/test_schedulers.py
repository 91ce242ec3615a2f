"""fleetlite under a real Slurm and a real Open MPI across the namespace hosts (root, Linux).

Debian's slurmctld, slurmd, munge and openmpi-bin are installed when missing (skipped, with the
reason, only where they cannot be); one module-scoped cluster of two hosts runs a slurmctld, a
slurmd per host and an sshd per host (benchmarks/harness/slurm_cluster.py), and each test is one
short job of 2 hosts x 2 ranks: srun and mpirun train like one process on the full batch with
true endpoints; a rank killed under either is named by the survivors within 10 s and nothing is
left on any host; the documented sbatch script trains to its end; fleetrun in an allocation fans
out over its hosts. About 3 minutes on 2 cores.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.harness import slurm_cluster
from support.multiprocess import QUIET_CPU, clean_environment

ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(ROOT / "tests" / "launcher_scripts" / "train_linear.py")
STEPS, JOB_TIMEOUT_S, NAMED_WITHIN_S, LEFT_WITHIN_S = 6, 150, 10, 10
MASTER = "node-a:29500"


@pytest.fixture(scope="module")
def slurm():
    reason = slurm_cluster.unavailable() or slurm_cluster.open_mpi_unavailable()
    if reason:
        pytest.skip(f"no Slurm/Open MPI cluster here: {reason}")
    with slurm_cluster.SlurmCluster(2) as made:
        yield made


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("one-process")
    result = subprocess.run([sys.executable, TRAIN, "--steps", str(STEPS), "--out", "w.npy"], cwd=cwd,
                            env=environment(), capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    return np.load(cwd / "w.npy")


def environment():
    """No launcher's variables; this Python first on PATH (as `python` in the sbatch script)."""
    return {**clean_environment(), **QUIET_CPU, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}


def srun(*args):
    return ["srun", "-N", "2", "--ntasks-per-node", "2", *args]


def mpirun(slurm, cwd, *args):
    return slurm.mpirun(["node-a:2", "node-b:2"], cwd, [f"PADDLE_MASTER={MASTER}", *QUIET_CPU], args)


def train(*args):
    return [sys.executable, TRAIN, "--fleet", *args]


def assert_trained_like_one_process(cwd, one_process):
    np.testing.assert_allclose(np.load(cwd / "w.npy"), one_process, rtol=1e-5)
    said = [json.loads((cwd / f"endpoints.{rank}.json").read_text()) for rank in range(4)]
    assert [s["host"] for s in said] == ["node-a", "node-a", "node-b", "node-b"]
    for endpoints in (s["endpoints"] for s in said):   # every rank on its own host, as every rank sees it
        assert endpoints == said[0]["endpoints"]
        assert [slurm_host(endpoint) for endpoint in endpoints] == ["node-a", "node-a", "node-b", "node-b"]


def slurm_host(endpoint):
    host = endpoint.rsplit(":", 1)[0]
    return {"10.213.0.1": "node-a", "10.213.0.2": "node-b"}.get(host, host)


def assert_nothing_left(slurm):
    left = slurm.left_running(TRAIN, LEFT_WITHIN_S)
    assert not left, f"left running: {left}"


def test_srun_two_hosts_by_two_train_like_one_process_with_nothing_exported(slurm, tmp_path, one_process):
    result = slurm.run(srun(*train("--steps", str(STEPS), "--out", "w.npy", "--endpoints", ".")),
                       JOB_TIMEOUT_S, cwd=tmp_path, env=environment())
    assert result.returncode == 0, result.stderr[-3000:]
    assert_trained_like_one_process(tmp_path, one_process)


def test_a_rank_killed_under_srun_is_named_by_the_survivors_within_10_s(slurm, tmp_path):
    seconds, output = slurm.kill_rank_during(srun(*train("--steps", "200", "--step_seconds", "0.2")), tmp_path,
                                             environment(), rank=2)
    assert seconds < NAMED_WITHIN_S, output[-3000:]
    for survivor in (0, 1, 3):
        assert f"fleetlite: rank 2 on node-b is gone: stopping rank {survivor} too" in output, output[-3000:]
    assert_nothing_left(slurm)


def test_the_documented_sbatch_script_trains_to_its_end(slurm, tmp_path):
    for folder in ("examples", "configs"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    result = slurm.run(["sbatch", "--wait", "examples/slurm/train_digits.sbatch"], JOB_TIMEOUT_S, cwd=tmp_path,
                       env=environment())
    (log,) = tmp_path.glob("fleetlite-digits-*.out")
    assert result.returncode == 0, log.read_text()[-3000:]
    assert "over 4 workers" in log.read_text() and "test accuracy" in log.read_text()


def test_fleetrun_in_an_allocation_fans_out_over_its_hosts(slurm, tmp_path, one_process):
    result = slurm.run(["salloc", "-N", "2", "--ntasks-per-node", "2", sys.executable, "-m", "fleetlite.launcher",
                        TRAIN, "--steps", str(STEPS), "--out", "w.npy"], JOB_TIMEOUT_S, cwd=tmp_path, env=environment())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "one fleetrun on each of its 2 hosts (node-a, node-b), 2 workers per host" in result.stderr
    assert "4 workers on 2 hosts" in result.stderr and "  3     node-b  cpu" in result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "w.npy"), one_process, rtol=1e-5)


def test_mpirun_over_ssh_trains_like_one_process_with_true_endpoints(slurm, tmp_path, one_process):
    result = slurm.hosts.run("node-a", mpirun(slurm, tmp_path, *train("--steps", str(STEPS), "--out", "w.npy",
                                                                       "--endpoints", ".")),
                             JOB_TIMEOUT_S, cwd=tmp_path, env=environment(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_trained_like_one_process(tmp_path, one_process)


def test_a_rank_killed_under_mpirun_is_named_by_the_survivors_within_10_s(slurm, tmp_path):
    seconds, output = slurm.kill_rank_during(mpirun(slurm, tmp_path, *train("--steps", "200", "--step_seconds", "0.2")),
                                             tmp_path, environment(), rank=2)
    assert seconds < NAMED_WITHIN_S, output[-3000:]
    assert "fleetlite: rank 2 on node-b is gone: stopping rank" in output, output[-3000:]
    assert_nothing_left(slurm)
