"""The Fleet API collective scripts use (role makers, fleet.util, saving, the collective no-ops),
`fleetlite run`, and the refusal to train under PaddlePaddle's own launcher.

One `fleetlite run` job of 2 ranks exercises the whole surface (launcher_scripts/fleet_surface.py)
and the tests read what each rank wrote; the rest are single processes or in-process units.
"""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import fleetlite as fleet
from fleetlite import api
from fleetlite.runtime import checkpoint
from fleetlite.topology import foreign_launcher
from fleetlite.base.role_maker import PaddleCloudRoleMaker, Role, UserDefinedRoleMaker
from fleetlite.topology.env_contract import LAUNCHER_PID, worker_env
from fleetlite.errors import FleetliteError, ForeignLauncherError, StrategyConflictError, TopologyError
from fleetlite.fleet_surface import UNSUPPORTED
from fleetlite.runtime.job_values import JobValues
from fleetlite.topology.topology import Topology
from launcher_scripts.fleet_surface import file_digests
from support.multiprocess import clean_environment

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "launcher_scripts"
SURFACE = SCRIPTS / "fleet_surface.py"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """(rank 0's result, rank 1's result, the job's output folder) of one 2-rank job."""
    cwd = tmp_path_factory.mktemp("surface")
    run = subprocess.run([sys.executable, "-m", "fleetlite.cli", "run", "--nproc_per_node", "2",
                          "--job_id", "fleet-surface", str(SURFACE), str(cwd / "out")],
                         cwd=cwd, env=clean_environment(), capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fleetrun: job succeeded" in run.stderr
    results = [json.loads((cwd / "out" / f"result.{rank}.json").read_text()) for rank in (0, 1)]
    return results[0], results[1], cwd / "out"


def test_role_makers_place_each_rank_where_the_launcher_did(job):
    for rank, result in enumerate(job[:2]):
        assert (result["rank"], result["world"], result["nranks"]) == (rank, 2, 2)   # UserDefinedRoleMaker
        assert result["cloud_role_maker_agrees"] is True
        assert (result["is_worker"], result["is_server"]) == (True, False)
        assert (result["init_worker"], result["stop_worker"]) == (None, None)


def test_fleet_util_reduces_and_gathers_numpy_values_across_the_job(job):
    for rank, result in enumerate(job[:2]):
        util = result["util"]
        assert (util["sum"], util["max"], util["min"]) == ([3.0, 30.0], [2.0, 20.0], [1.0, 10.0])
        assert util["sum_dtype"] == "float32" and util["count_true"] == 1
        assert util["gathered"] == [0, 1]
        assert util["gathered_objects"] == [{"rank": 0, "r2": 0}, {"rank": 1, "r2": 1}]
        assert util["printed"] == ("printed by rank 1\n" if rank == 1 else "")
        assert util["file_shard"] == (["a", "b"] if rank == 0 else ["c"])


def test_a_checkpoint_saved_by_rank_0_loads_back_identically_on_every_rank(job):
    first, second, out = job
    assert first["losses"] != second["losses"]                 # each rank trained on its own slice
    assert first["trained"] == second["trained"]                # ... of one data-parallel model
    assert first["loaded"] == first["trained"] and second["loaded"] == second["trained"]
    assert first["reloaded_matches"] and second["reloaded_matches"]   # saved again over itself
    expected = {"learning_rate_0", "linear_0.w_0", "linear_0.b_0"} | {
        f"linear_0.{p}_0_{state}" for p in "wb" for state in ("moment1_0", "moment2_0", "beta1_pow_acc_0",
                                                                  "beta2_pow_acc_0")}
    assert set(first["ckpt_files"]) == expected == set(second["fleet_save_files"])


def test_a_failed_save_raises_on_the_first_worker_and_leaves_the_previous_checkpoint(job):
    first, second, out = job
    for target in ("ckpt", "ckpt_new"):
        assert first[f"failed_save_{target}"] == "OSError: injected failure: the disk filled up"
        assert second[f"failed_save_{target}"] == "no error"    # it does not write: nothing to fail
    assert first["after_failed_save_matches"] and second["after_failed_save_matches"]
    assert first["out_listing"] == ["ckpt"]                    # no ckpt_new, no partial directory


def test_fleets_save_idiom_saves_on_the_first_worker_alone_and_every_rank_reads_it(tmp_path):
    """`if fleet.is_first_worker(): fleet.save_persistables(...)`, then fleet.util.barrier():
    a save with a collective inside would leave rank 0 in it and rank 1 in the barrier."""
    run = subprocess.run([sys.executable, "-m", "fleetlite.launcher", "--nproc_per_node", "2",
                          "--job_id", "save-idiom", str(SCRIPTS / "fleet_save_idiom.py"), str(tmp_path / "out")],
                         cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    first, second = [json.loads((tmp_path / "out" / f"result.{rank}.json").read_text()) for rank in (0, 1)]
    assert first["loaded_matches"] and second["loaded_matches"]
    assert first["ckpt"] == second["ckpt"] and len(first["ckpt"]) == 11       # parameters and Adam's state
    assert first["saved"] == first["ckpt"] and first["inference"] == second["inference"]
    assert first["hidden"] == second["hidden"] == []                          # no partial directories


def test_inference_models_are_saved_once_and_run_on_every_rank(job):
    first, second, _ = job
    assert first["inference"] == second["inference"]
    np.testing.assert_allclose(first["inference"], first["inference_reference"], rtol=1e-5)
    assert first["fleet_save_inference_files"] == ["model.json", "model.pdiparams"]


def test_a_save_killed_halfway_leaves_the_previous_checkpoint_at_the_target(tmp_path):
    run = subprocess.run([sys.executable, str(SURFACE), str(tmp_path), "--kill-mid-save"],
                         env=clean_environment(), capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, run.stdout + run.stderr
    before = json.loads((tmp_path / "ckpt.sha256.json").read_text())
    assert file_digests(tmp_path / "ckpt") == before and len(before) == 11
    (partial,) = [name for name in os.listdir(tmp_path) if name.startswith(".ckpt.partial-")]
    assert len(os.listdir(tmp_path / partial)) == 2               # where the kill came
    checkpoint.write_atomically(tmp_path / "ckpt", lambda folder: (Path(folder) / "marker").write_text("next save"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "ckpt.sha256.json"]   # the killed write's partial is gone
    assert os.listdir(tmp_path / "ckpt") == ["marker"]


def test_paddles_own_launcher_is_refused_in_one_line_naming_the_fix(tmp_path):
    """The real paddle.distributed.launch (what Paddle installs as `fleetrun`) on 2 CPU workers."""
    run = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                          "--max_restart", "0", "--log_dir", "plog", str(SURFACE), "out"],
                         cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, timeout=180)
    assert run.returncode != 0
    expected = ("fleetlite: this worker was started by PaddlePaddle's launcher (paddle.distributed.launch, "
                "which Paddle also installs as `fleetrun`), not by fleetlite's launcher, and cannot train "
                f"under it; start the job with: fleetlite run --nproc_per_node 2 --max_restart 0 --log_dir "
                f"plog {SURFACE} out")
    last_lines = [(tmp_path / "plog" / f"workerlog.{rank}").read_text().rstrip().splitlines()[-1]
                  for rank in (0, 1)]
    # fleet.init raises it (library code exits nothing): the script's traceback ends in that line.
    # Paddle's launcher SIGTERMs the other worker at once, and shows the failed worker's log.
    assert f"fleetlite.errors.ForeignLauncherError: {expected}" in last_lines
    assert expected in run.stdout + run.stderr
    assert not (tmp_path / "out").exists()


PADDLE_LAUNCH_ENV = {  # what paddle.distributed.launch gave rank 0 of 2 CPU workers (Paddle 3.3.1)
    "PADDLE_AUTO_CLUSTER": "0", "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:46249", "PADDLE_DISTRI_BACKEND": "gloo",
    "PADDLE_GLOBAL_RANK": "0", "PADDLE_GLOBAL_SIZE": "2", "PADDLE_LOCAL_RANK": "0", "PADDLE_LOCAL_SIZE": "2",
    "PADDLE_LOG_DIR": "/tmp/log", "PADDLE_MASTER": "127.0.0.1:46248", "PADDLE_NNODES": "1",
    "PADDLE_RANK_IN_NODE": "0", "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:46249,127.0.0.1:46250",
    "PADDLE_TRAINER_ID": "0", "POD_NAME": "lbhmbp"}
LEGACY_LAUNCH_ENV = {  # paddle.distributed.fleet.launch's start_local_trainers
    "PADDLE_TRAINER_ID": "0", "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:6170", "PADDLE_TRAINERS_NUM": "1",
    "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6170", "PADDLE_RANK_IN_NODE": "0", "PADDLE_LOCAL_DEVICE_IDS": "",
    "PADDLE_WORLD_DEVICE_IDS": ""}


def test_which_launcher_started_a_worker_is_read_from_its_environment():
    fleetrun = {**worker_env(Topology.grid(2)), LAUNCHER_PID: "123"}
    assert foreign_launcher.paddle_launcher(PADDLE_LAUNCH_ENV).startswith("PaddlePaddle's launcher")
    assert foreign_launcher.paddle_launcher(LEGACY_LAUNCH_ENV).startswith("PaddlePaddle's legacy launcher")
    assert foreign_launcher.paddle_launcher(fleetrun) is None
    assert foreign_launcher.paddle_launcher({**PADDLE_LAUNCH_ENV, **fleetrun}) is None   # fleetrun inside it
    assert foreign_launcher.paddle_launcher({**PADDLE_LAUNCH_ENV, "FLEETLITE_EXPLAIN_ONLY": "1"}) is None
    assert foreign_launcher.paddle_launcher({"OMPI_COMM_WORLD_RANK": "0", "SLURM_PROCID": "0"}) is None
    assert foreign_launcher.paddle_launcher({}) is None


@pytest.mark.parametrize("launcher_argv, command", [
    (["/v/bin/python", "-m", "paddle.distributed.launch", "--gpus", "0,1", "t.py", "--lr", "0.1"],
     "fleetlite run --gpus 0,1 t.py --lr 0.1"),
    (["/v/bin/python", "/v/bin/fleetrun", "--ips", "a,b", "my dir/t.py"], "fleetlite run --ips a,b 'my dir/t.py'"),
    (["python", "-m", "paddle.distributed.fleet.launch", "t.py"], "fleetlite run t.py"),
    (["bash"], "fleetlite run <the launcher's flags> t.py --lr 0.1"),
])
def test_the_fix_is_fleetlite_run_with_the_launchers_own_arguments(launcher_argv, command):
    assert foreign_launcher.rerun_command(launcher_argv, ["t.py", "--lr", "0.1"]) == command


def test_init_under_paddles_launcher_raises_that_one_line(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(PADDLE_LAUNCH_ENV))
    monkeypatch.setattr(foreign_launcher, "parent_argv", lambda: ["python", "-m", "paddle.distributed.launch",
                                                                  "--nproc_per_node", "2", "t.py"])
    monkeypatch.setattr(sys, "argv", ["t.py"])
    with pytest.raises(ForeignLauncherError, match=r"start the job with: fleetlite run --nproc_per_node 2 t\.py$"):
        fleet.init(is_collective=True)


ENDPOINTS = ["10.0.0.1:6070", "10.0.0.1:6071", "10.0.0.2:6070", "10.0.0.2:6071"]


def test_user_defined_role_maker_maps_onto_the_topology():
    role = UserDefinedRoleMaker(is_collective=True, current_id=3, role=Role.WORKER, worker_num=4,
                                worker_endpoints=ENDPOINTS)
    assert role.topology({}) == Topology(rank=3, world_size=4, local_rank=1, local_size=2, node_rank=1,
                                         node_count=2, endpoints=ENDPOINTS)
    launched = worker_env(Topology(rank=3, world_size=4, local_rank=1, local_size=2, node_rank=1,
                                   node_count=2, endpoints=ENDPOINTS))
    assert role.topology(launched).rank == 3                     # agrees with fleetrun's environment
    with pytest.raises(TopologyError, match=r"says rank 2 of .* but the launcher started this process as rank 3"):
        UserDefinedRoleMaker(is_collective=True, current_id=2, worker_endpoints=ENDPOINTS).topology(launched)
    assert UserDefinedRoleMaker(is_collective=True, current_id=1, worker_endpoints=ENDPOINTS[:2]).topology(
        {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
         "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PADDLE_MASTER": "10.0.0.9:7000"}).endpoints == tuple(ENDPOINTS[:2])


@pytest.mark.parametrize("make, error, words", [
    (lambda: UserDefinedRoleMaker(current_id=0, worker_endpoints=ENDPOINTS), StrategyConflictError,
     r"UserDefinedRoleMaker\(is_collective=False\) asks for parameter-server training.*pass "
     r"UserDefinedRoleMaker\(is_collective=True\)"),
    (lambda: UserDefinedRoleMaker(is_collective=True, role=Role.SERVER, server_endpoints=ENDPOINTS),
     StrategyConflictError, r"role=Role.SERVER\) is a parameter-server role.*pass role=Role.WORKER"),
    (lambda: UserDefinedRoleMaker(is_collective=True, worker_endpoints=ENDPOINTS, server_endpoints=ENDPOINTS[:1]),
     StrategyConflictError, "remove server_endpoints"),
    (lambda: UserDefinedRoleMaker(is_collective=True, worker_num=3, worker_endpoints=ENDPOINTS),
     TopologyError, r"worker_num=3\) but worker_endpoints lists 4 endpoints"),
    (lambda: UserDefinedRoleMaker(is_collective=True, current_id=4, worker_endpoints=ENDPOINTS).topology({}),
     TopologyError, r"PADDLE_TRAINER_ID=4 is not in \[0, PADDLE_TRAINERS_NUM=4\)"),
    (lambda: UserDefinedRoleMaker(is_collective=True), TopologyError, "needs worker_endpoints"),
    (lambda: PaddleCloudRoleMaker(), StrategyConflictError, r"pass PaddleCloudRoleMaker\(is_collective=True\)"),
    (lambda: PaddleCloudRoleMaker(is_collective=True, path="./gloo"), FleetliteError, "options path configure"),
])
def test_role_maker_mistakes_name_the_fix(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_init_takes_fleetlites_role_makers_only(monkeypatch):
    monkeypatch.setattr(api, "_job", None)
    monkeypatch.setattr(os, "environ", {})
    with pytest.raises(FleetliteError, match=r"got a builtins.object: pass one of fleetlite's role makers"):
        fleet.init(object())
    fleet.init(fleet.UserDefinedRoleMaker(is_collective=True, current_id=0, worker_endpoints=["127.0.0.1:6070"]))
    assert (fleet.worker_index(), fleet.worker_num(), fleet.rank_in_node()) == (0, 1, 0)
    assert fleet.util.all_reduce([1, 2], "max").tolist() == [1, 2] and fleet.util.all_gather(5) == [5]
    assert fleet.fleet is fleet and fleet.base.role_maker.Role.WORKER == 1


def test_fleet_util_mistakes_name_the_fix():
    util = JobValues(lambda: Topology())
    with pytest.raises(FleetliteError, match=r"mode='mean': use one of sum, max, min"):
        util.all_reduce(1.0, mode="mean")
    with pytest.raises(FleetliteError, match="a collective job has workers only; use comm_world='worker'"):
        util.all_gather(1, comm_world="server")
    with pytest.raises(FleetliteError, match="reduces numbers, got dtype <U1"):
        util.all_reduce("a")
    assert util.all_reduce(np.array([True, False])).dtype == np.int64


@pytest.mark.parametrize("files, world, shares", [
    (list("abcde"), 2, [list("abc"), list("de")]),
    (list("ab"), 3, [["a"], ["b"], []]),
])
def test_file_shards_are_contiguous_and_the_first_ranks_take_the_remainder(files, world, shares):
    assert [JobValues(lambda r=r: Topology.grid(world, rank=r)).get_file_shard(files) for r in range(world)] == shares


def write_files(**contents):
    def write(folder):
        for name, text in contents.items():
            Path(folder, name).write_text(text)
    return write


def test_a_checkpoint_directory_replaces_the_previous_one_whole(tmp_path):
    target = tmp_path / "deep" / "ckpt"
    checkpoint.write_atomically(target, write_files(a="1", b="1"))
    checkpoint.write_atomically(target, write_files(a="2"))
    assert {p.name: p.read_text() for p in target.iterdir()} == {"a": "2"}
    assert os.listdir(target.parent) == ["ckpt"]


def test_without_the_atomic_exchange_the_previous_one_is_renamed_aside_first(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.ctypes, "CDLL", lambda *args, **kwargs: types.SimpleNamespace())
    checkpoint.write_atomically(tmp_path / "ckpt", write_files(a="1"))
    checkpoint.write_atomically(tmp_path / "ckpt", write_files(a="2"))
    assert (tmp_path / "ckpt" / "a").read_text() == "2" and os.listdir(tmp_path) == ["ckpt"]


def test_a_write_that_raises_leaves_the_target_as_it_was(tmp_path):
    checkpoint.write_atomically(tmp_path / "ckpt", write_files(a="1"))

    def half_then_fail(folder):
        write_files(a="2")(folder)
        raise OSError("disk full")

    for target in ("ckpt", "other"):
        with pytest.raises(OSError, match="disk full"):
            checkpoint.write_atomically(tmp_path / target, half_then_fail)
    assert os.listdir(tmp_path) == ["ckpt"] and (tmp_path / "ckpt" / "a").read_text() == "1"
    (tmp_path / "file").write_text("")
    with pytest.raises(FleetliteError, match="it is a file; pass a directory path"):
        checkpoint.write_atomically(tmp_path / "file", half_then_fail)


def test_every_name_of_paddles_fleet_is_provided_or_refused_with_its_reason():
    import paddle.distributed.fleet as paddle_fleet
    names = [n for n in dir(paddle_fleet) if not n.startswith("_")
             and not isinstance(getattr(paddle_fleet, n), types.ModuleType)]
    table = (ROOT / "docs" / "fleet_compatibility.md").read_text()
    for name in names + ["save", "load"]:
        assert f"`{name}`" in table, f"docs/fleet_compatibility.md does not list {name}"
        if name in UNSUPPORTED:
            with pytest.raises(AttributeError, match=f"fleetlite does not provide fleet.{name}: .+"):
                getattr(fleet, name)
        else:
            assert getattr(fleet, name) is not None, name


def test_paddle_static_execution_strategy_gets_the_fleetlite_spelling(tmp_path):
    """Where fleetlite sees the AttributeError (fleetrun's worker bootstrap), it adds the fix."""
    run = subprocess.run([sys.executable, "-m", "fleetlite.launcher.bootstrap",
                          str(SCRIPTS / "paddle_static_execution_strategy.py")],
                         env=clean_environment(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.rstrip().splitlines()[-2:] == [
        "AttributeError: module 'paddle.static' has no attribute 'ExecutionStrategy'",
        "fleetlite: Paddle 3 removed paddle.static.ExecutionStrategy; build it with fleetlite.ExecutionStrategy() "
        "(same fields; assign it to strategy.execution_strategy)"]


def test_fleetlite_run_is_installed_beside_the_interpreter():
    result = subprocess.run([str(Path(sys.executable).parent / "fleetlite"), "run", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage: fleetlite run [-h] [--ips IPS]")
    assert "--explain" in result.stdout
