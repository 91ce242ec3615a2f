"""The Fleet-compatible API in real processes: init before or after enable_static, the worker
queries, barrier in static mode, bounded bring-up with errors naming the endpoint, the
explain-only mode fleetrun --explain uses, and the `fleetlite explain` command."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fleetlite as fleet
from fleetlite import api
from fleetlite.topology.env_contract import EXPLAIN_ONLY, worker_env
from fleetlite.topology.topology import Topology
from support.multiprocess import RESULT_ENV, JobFailed, free_port, run_job

ROOT = Path(__file__).resolve().parents[2]
API_WORKER = ROOT / "tests" / "workers" / "api_worker.py"
QUICK_INIT = {"FLEETLITE_INIT_TIMEOUT": "2"}


@pytest.mark.parametrize("mode", ["init_after_static", "init_before_static"])
def test_a_job_of_2_nodes_x_2(mode):
    ranks = run_job(API_WORKER, 4, 2, args=[mode], timeout=120)
    for rank, result in enumerate(ranks):
        assert (result["worker_index"], result["worker_num"], result["node_num"]) == (rank, 4, 2)
        assert (result["local_rank"], result["local_size"]) == (rank % 2, 2)
        assert result["is_first_worker"] == (rank == 0)
        assert result["worker_endpoints"][2].startswith("127.0.0.2:")
        assert result["fp16_sum"] == [10.0] * 3                 # 1+2+3+4; raw gloo gives inf
        assert result["printed_report"] == (rank == 0)
        assert result["applied"][:2] == ["data_parallel", "fuse_all_reduce_ops"]
    assert ranks[0]["barrier_wait"] > 0.8                          # rank 3 came 1 s late


def test_one_worker_needs_no_process_group():
    (result,) = run_job(API_WORKER, 1, args=["init_after_static"], timeout=60)
    assert (result["worker_num"], result["is_first_worker"], result["node_num"]) == (1, True, 1)
    assert "data_parallel" not in result["applied"]


def test_an_unreachable_master_fails_fast_naming_the_endpoint():
    with pytest.raises(JobFailed, match=r"rank 1 could not reach the master endpoint 127\.0\.0\.1:\d+ "
                                        r"\(rank 0's rendezvous store\) within 2 s"):
        run_job(API_WORKER, 2, args=["init_after_static"], ranks=[1], extra_env=QUICK_INIT, timeout=30)


def test_a_master_whose_workers_never_come_fails_fast():
    with pytest.raises(JobFailed, match=r"rank 0 hosts the rendezvous store at 127\.0\.0\.1:\d+, but not all "
                                        r"3 other ranks connected within 2 s"):
        run_job(API_WORKER, 4, args=["init_after_static"], ranks=[0], extra_env=QUICK_INIT, timeout=30)


def test_explain_only_prints_the_report_and_trains_nothing(tmp_path):
    """What `fleetrun --explain` does: rank 0's environment of the job, alone."""
    result = tmp_path / "result.json"
    env = {**os.environ, **worker_env(Topology.grid(4, 2, base_port=free_port())), EXPLAIN_ONLY: "1",
           RESULT_ENV: str(result)}
    # through the worker's bootstrap, as fleetrun starts it: it ends the script where minimize is done
    run = subprocess.run([sys.executable, "-m", "fleetlite.launcher.bootstrap", str(API_WORKER), "minimize_only"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("fleetlite compile report: rank 0/4 (local 0/2, node 0/2, cpu, gloo)")
    assert "gloo_lowering" in run.stdout and not result.exists()


def test_api_misuse_is_an_error(monkeypatch):
    monkeypatch.setattr(api, "_job", None)     # a process where init has not run (other tests call it)
    with pytest.raises(fleet.FleetliteError, match="pass one of fleetlite's role makers"):
        fleet.init(role_maker=object())
    with pytest.raises(fleet.StrategyConflictError, match="parameter-server training is not supported"):
        fleet.init(is_collective=False)
    with pytest.raises(fleet.FleetliteError, match=r"fleet.init\(is_collective=True\) has not been called"):
        fleet.distributed_optimizer(object())


def explain_cli(*args):
    return subprocess.run([sys.executable, "-m", "fleetlite.cli", "explain", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_explain_command_shows_a_32_rank_gpu_job_without_training():
    run = explain_cli("--strategy", "configs/resnet50_4x8_gpu.yaml", "--world", "32", "--nodes", "4",
                      "--device", "gpu", "--rank", "9", "--model", "resnet50", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["topology"] == "rank 9/32 (local 1/8, node 1/4, gpu, nccl)"
    status = {r["name"]: r["status"] for r in report["records"]}
    assert status["nccl_comm_num"] == "applied" and status["gloo_lowering"] == "skipped"
    assert status["amp"] == "skipped"                               # float16 on GPU needs a GPU build of Paddle: said so
    assert [r["ring"] for r in report["rings"]] == [0, 1] and len(report["buckets"]) == 10
    assert report["runtime_flags"] == {"FLAGS_sync_nccl_allreduce": True, "FLAGS_new_executor_serial_run": False,
                                       "FLAGS_pir_apply_inplace_pass": True}   # num_threads: 3, enable_inplace


def test_explain_command_errors_name_the_cause():
    run = explain_cli("--world", "6", "--nodes", "4")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == "fleetlite: error: 6 ranks cannot be spread evenly over 4 nodes (6 % 4 = 2)"


def test_nccl_rings_are_created_in_id_order_with_this_ranks_group(monkeypatch):
    """The GPU ring setup, with Paddle's communicator factory replaced by a recorder."""
    from fleetlite.runtime import process_group
    from fleetlite.runtime.explain_strategy import explain
    created = []

    class Recorder:
        @staticmethod
        def create_nccl_comm_context(store, ring, rank, size, hash_key):
            created.append((ring, rank, size, hash_key))

    monkeypatch.setattr(process_group.core, "CommContextManager", Recorder)
    monkeypatch.setattr(process_group, "_store", "store")
    strategy = fleet.DistributedStrategy()
    strategy.use_hierarchical_allreduce = True
    keys = {}
    for rank in (9, 10, 17):
        topology = Topology.grid(32, 4, rank=rank, device="gpu")
        created.clear()
        process_group.create_nccl_rings(explain(strategy, topology).rings, topology)
        assert [(ring, index, size) for ring, index, size, _ in created] == [
            ("0", rank, 32), ("1", rank % 8, 8), ("2", rank // 8, 4)]
        keys[rank] = [key for *_, key in created]
    assert keys[9][0] == keys[10][0] == keys[17][0]          # ring 0: one world communicator
    assert keys[9][1] == keys[10][1] != keys[17][1]          # intra: node 1 vs node 2
    assert keys[9][2] == keys[17][2] != keys[10][2]          # inter: position 1 vs position 2
