"""Jobs started by other schedulers' variables alone, on loopback: what mpirun and srun give each
process is set here by hand (the real daemons run in tests/launcher/test_schedulers.py, where the
machine allows). Open MPI's ranks exchange their endpoints through the store and train like one
process on the full batch; under srun's variables a killed rank is named by the survivor within
10 s, in fleetlite's words."""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from support.multiprocess import QUIET_CPU, clean_environment, free_port

TRAIN = str(Path(__file__).resolve().parents[1] / "launcher_scripts" / "train_linear.py")
STEPS, JOB_TIMEOUT_S, NAMED_WITHIN_S = 4, 120, 10


def start(tmp_path, env, *args):
    return subprocess.Popen([sys.executable, TRAIN, "--fleet", *args], cwd=tmp_path,
                            env={**clean_environment(), **QUIET_CPU, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(processes):
    try:
        return [process.communicate(timeout=JOB_TIMEOUT_S) for process in processes]
    finally:
        for process in processes:
            process.kill()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("one-process")
    (out, err), = finish([start(cwd, {}, "--steps", str(STEPS), "--out", "w.npy")])
    assert (cwd / "w.npy").exists(), err
    return np.load(cwd / "w.npy")


def test_open_mpi_ranks_train_like_one_process_with_endpoints_from_the_store(tmp_path, one_process):
    master = f"127.0.0.1:{free_port()}"
    ranks = [start(tmp_path, {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2",
                              "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                              "PADDLE_MASTER": master},
                   "--steps", str(STEPS), "--out", "w.npy", "--endpoints", ".") for rank in range(2)]
    outputs = finish(ranks)
    assert [r.returncode for r in ranks] == [0, 0], outputs
    np.testing.assert_allclose(np.load(tmp_path / "w.npy"), one_process, rtol=1e-5)
    port = int(master.rsplit(":", 1)[1])
    for rank in range(2):   # rank 1's own endpoint, exchanged: not a guess on rank 0's host
        said = json.loads((tmp_path / f"endpoints.{rank}.json").read_text())
        assert said["endpoints"] == [master, f"127.0.0.1:{port + 1}"]


def test_a_rank_killed_under_srun_is_named_by_the_survivor_within_10_s(tmp_path):
    job = {"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": str(free_port()),
           "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2"}
    ranks = [start(tmp_path, {**job, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
                   "--steps", "100", "--step_seconds", "0.2", "--fail", "1:3:kill") for rank in range(2)]
    ranks[1].wait(JOB_TIMEOUT_S)
    killed_at = time.monotonic()
    outputs = finish(ranks)
    survived_s = time.monotonic() - killed_at
    assert ranks[1].returncode == -9
    assert ranks[0].returncode == 1 and survived_s < NAMED_WITHIN_S, (survived_s, outputs[0][1][-2000:])
    assert f"fleetlite: rank 1 on {socket.gethostname()} is gone: stopping rank 0 too" in outputs[0][1]
    assert "Traceback" not in outputs[0][1]


def test_paddlejob_pods_find_each_other_at_the_master_and_train_like_one_process(tmp_path, one_process):
    """Kubeflow's contract, with one fleetrun per "pod" on loopback addresses (no Kubernetes here)."""
    master = f"127.0.0.1:{free_port()}"
    pods = []
    for pod_ip in ("127.0.0.1", "127.0.0.2"):
        folder = tmp_path / pod_ip
        folder.mkdir()
        pods.append(subprocess.Popen(
            [sys.executable, "-m", "fleetlite.launcher", TRAIN, "--fleet", "--steps", str(STEPS), "--out", "w.npy"],
            cwd=folder, env={**clean_environment(), **QUIET_CPU, "PADDLE_MASTER": master, "PADDLE_NNODES": "2",
                             "PADDLE_JOB_ID": "fleetlite-digits", "POD_IP": pod_ip},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = finish(pods)
    assert [pod.returncode for pod in pods] == [0, 0], outputs
    assert f"the 2 pods met at {master}: --ips 127.0.0.1,127.0.0.2, this pod 127.0.0.2" in outputs[1][1]
    np.testing.assert_allclose(np.load(tmp_path / "127.0.0.1" / "w.npy"), one_process, rtol=1e-5)
