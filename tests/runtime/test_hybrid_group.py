"""`hybrid_configs` and `fleet.get_hybrid_communicate_group()` in fleetlite's dp-only topology:
Paddle's sub-sections accepted and validated, other degrees refused at fleet.init with one line,
dp_degree checked against the world, and the group's all_reduce over a real 2-rank fleetrun job."""
import json
import os
from pathlib import Path

import pytest

import fleetlite as fleet
from fleetlite.errors import FieldRangeError, StrategyConflictError
from fleetlite.topology.topology import Topology
from support.isolated import isolated
from support.multiprocess import fleetrun

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "launcher_scripts" / "hybrid_group_job.py"
PADDLE_NLP_STYLE = {"dp_degree": 2, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1}


def test_paddles_sub_sections_and_order_are_accepted_with_every_other_degree_1():
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {**PADDLE_NLP_STYLE, "order": ["dp", "pp", "sharding", "sep", "mp"],
                               "mp_configs": {"sync_param": False, "nccl_config": {"commName": "tp"}},
                               "pp_configs": {"delay_scale_loss": True}, "sharding_configs": {"comm_buffer_size_MB": 128},
                               "dp_configs": {"check_nccl_config": {"nchannels": 4}}, "ep_configs": {}, "cp_mp_configs": {}}
    strategy.validate(Topology.grid(2, 1))
    assert strategy.hybrid_configs.mp_configs.nccl_config.commName == "tp"
    assert strategy.hybrid_configs.order == ["dp", "pp", "sharding", "sep", "mp"]
    assert len([f for f in strategy.hybrid_configs if f.endswith("_configs")]) == 14


@isolated(timeout=120)
def test_the_compile_report_lists_the_sub_sections_as_skipped_and_not_the_degrees():
    from support.in_process import compile_only
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {**PADDLE_NLP_STYLE, "pp_configs": {"delay_scale_loss": True}}
    _, _, built = compile_only(strategy, Topology.grid(2, 1))
    skipped = {r.name: r.reason for r in built.report.records if r.status == "skipped"}
    assert skipped["hybrid"] == ("it configures the groups of hybrid parallelism's other axes (model, pipeline, "
                                 "sharding, ...), which are one rank each in fleetlite's dp-only topology "
                                 "(set: hybrid_configs.pp_configs.delay_scale_loss)")


@pytest.mark.parametrize("configs, error, message", [
    ({"mp_degree": 2}, StrategyConflictError,
     "hybrid_configs.mp_degree = 2, but fleetlite runs data parallelism only; set mp_degree to 1 and let dp_degree "
     "span the job (paddle.distributed.fleet runs hybrid parallelism)"),
    ({"dp_degree": 1, "pp_degree": 2}, StrategyConflictError, "hybrid_configs.pp_degree = 2, but fleetlite"),
    ({"sharding_degree": 4}, StrategyConflictError, "hybrid_configs.sharding_degree = 4, but fleetlite"),
    ({"dp_degree": 4}, StrategyConflictError,
     "hybrid_configs.dp_degree = 4 but the job has 2 ranks (with every other degree 1, dp_degree is the world "
     "size); set dp_degree to 2 or -1"),
    ({"dp_degree": 0}, StrategyConflictError, "hybrid_configs.dp_degree = 0 is no data-parallel degree"),
    ({"order": ["dp", "tp"]}, FieldRangeError, "strategy field 'hybrid_configs.order' = 'tp' is out of range"),
    ({"mp_configs": {"sync_mode": "sum"}}, FieldRangeError,
     "strategy field 'hybrid_configs.mp_configs.sync_mode' = 'sum' is out of range; allowed: one of 'broadcast', 'average'"),
])
def test_what_the_dp_only_topology_cannot_run_is_one_line(configs, error, message):
    strategy = fleet.DistributedStrategy()
    with pytest.raises(error) as info:
        strategy.hybrid_configs = configs
        strategy.validate(Topology.grid(2, 1))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@isolated(timeout=120)
def test_fleet_init_refuses_a_model_parallel_degree_and_a_wrong_dp_degree():
    """Posing as rank 1 of 2 (static mode connects lazily, so nothing waits for rank 0)."""
    import paddle
    os.environ.update({"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:36001,127.0.0.1:36002"})
    paddle.enable_static()
    for configs, words in (({"mp_degree": 2}, "mp_degree = 2"), ({"dp_degree": 3}, "dp_degree = 3 but the job has 2")):
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = configs
        with pytest.raises(StrategyConflictError, match=words):
            fleet.init(is_collective=True, strategy=strategy)


@isolated(timeout=120)
def test_one_process_gets_the_dp_only_group_of_one_rank():
    import paddle
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {**PADDLE_NLP_STYLE, "dp_degree": -1}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    assert hcg is fleet.get_hybrid_communicate_group()
    assert (hcg.get_global_rank(), hcg.get_parallel_mode()) == (0, 0)
    assert (hcg.get_data_parallel_rank(), hcg.get_data_parallel_world_size()) == (0, 1)
    assert (hcg.get_model_parallel_rank(), hcg.get_model_parallel_world_size()) == (0, 1)
    assert (hcg.get_stage_id(), hcg.get_pipe_parallel_world_size()) == (0, 1)
    assert (hcg.get_sharding_parallel_rank(), hcg.get_sharding_parallel_world_size()) == (0, 1)
    assert (hcg.get_sep_parallel_rank(), hcg.get_sep_parallel_world_size()) == (0, 1)
    value = paddle.to_tensor([3.0])
    paddle.distributed.all_reduce(value, group=hcg.get_data_parallel_group())
    assert value.numpy().tolist() == [3.0]


def test_two_ranks_through_fleetrun_all_reduce_over_the_data_group(tmp_path):
    run = fleetrun(["--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"), str(SCRIPT), str(tmp_path)],
                   cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"result.{rank}.json").read_text())
        assert result.pop("eager_step_max_difference") < 1e-6       # the eager loop trains with the dp-only strategy
        assert result == {"global_rank": rank, "data": [rank, 2, 2], "model": [0, 1], "pipe": [0, 1],
                          "sharding": [0, 1], "data_sum": 3.0, "model_sum": float(rank + 1)}
