"""recompute: the backward re-runs the forward segments between checkpoints (docs/knobs/recompute.md).

Parity: one fleetrun job of 2 ranks runs workers/recompute_worker.py (rank r feeds rows r::2)
for each way of naming checkpoints (the PIR values, layer names, fleet.utils.recompute marks);
each rank trains beside the same program without recompute on the full batch, and every rank's
parameters and the mean of the ranks' losses must equal it to 1e-6. fleet.train_step's parity is
in tests/runtime/test_dygraph_train_step.py (case "recompute"). Structure, the stored values and
the refusals run in this process; the memory it saves is measured by benchmarks/memory/recompute.py.
"""
from pathlib import Path

import numpy as np
import paddle
import pytest

from fleetlite import CompileError, DistributedStrategy, StrategyConflictError, Topology
from fleetlite.compile import program_edit
from fleetlite.runtime import training_program
from fleetlite.strategies.recompute import kept
from support.rank_results import assert_ranks_equal_the_reference, run_through_fleetrun
from workers import recompute_worker

WORKER = Path(__file__).resolve().parents[1] / "workers" / "recompute_worker.py"
TOLERANCE = 1e-6
IN_ORDER = "FLAGS_new_executor_sequential_run"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_through_fleetrun(WORKER, tmp_path_factory.mktemp("recompute"))


@pytest.mark.parametrize("case", recompute_worker.CASES)
def test_two_ranks_through_fleetrun_equal_one_process_without_recompute(ranks, case):
    assert_ranks_equal_the_reference([result[case] for result in ranks], TOLERANCE, "recompute")


def test_each_way_of_naming_checkpoints_gives_its_segments(ranks):
    segments = {case: ranks[0][case]["details"]["segments"] for case in recompute_worker.CASES}
    assert [len(s) for s in segments.values()] == [2, 2, 4]    # two checkpoints; four marked calls
    assert [s["recomputed"] for s in segments["values"]] == [["pd_op.matmul", "pd_op.add", "pd_op.tanh",
                                                             "pd_op.matmul"]] * 2
    assert [s["recomputed"] for s in segments["marks"]] == [["pd_op.matmul", "pd_op.add", "pd_op.tanh"]] * 4


def build(configs=None, marked=False, topology=Topology.grid(2), recompute=True, **fields):
    """(main, startup, loss, forward outputs, report) of the worker's model compiled in this
    process; `configs(outputs)` gives recompute_configs."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 64], "float32")
        y = paddle.static.data("y", [8, 1], "int64")
        outputs, loss = recompute_worker.forward(x, y, marked)
        strategy = DistributedStrategy()
        strategy.recompute = recompute
        for name, value in fields.items():
            setattr(strategy, name, value)
        if configs is not None:
            strategy.recompute_configs = configs(outputs)
        built = training_program.build(loss, paddle.optimizer.SGD(0.1), strategy, topology, startup)
    return main, startup, loss, outputs, built.report


def backward_readers(value):
    return [user for user in value.all_used_ops() if user.op_role == program_edit.BACKWARD]


def test_the_backward_reads_only_checkpoints_and_clones_of_the_segments():
    main, _, _, outputs, report = build(lambda outputs: {"checkpoints": [outputs[1], outputs[3]]})
    ops = list(main.global_block().ops)
    position = {op.id(): i for i, op in enumerate(ops)}
    last_checkpoint = position[outputs[3].get_defining_op().id()]
    checkpoints = {position[outputs[1].get_defining_op().id()], last_checkpoint}
    in_segments = [op for op in ops[:last_checkpoint] if op.op_role == program_edit.FORWARD and not kept(op)
                   and position[op.id()] not in checkpoints]
    assert len(in_segments) == 2 * 5      # matmul, add, tanh, matmul, add before each checkpoint's tanh
    for op in in_segments:                # their results die with the forward
        assert all(backward_readers(result) == [] for result in op.results()), op.name()
    clones = program_edit.created_by(main.global_block(), "recompute")
    assert [op.name() for op in clones] == ["pd_op.matmul", "pd_op.add", "pd_op.tanh", "pd_op.matmul"] * 2
    loss_op = max(position[op.id()] for op in ops if op.op_role == program_edit.FORWARD)
    for clone in clones:
        assert clone.op_role == program_edit.BACKWARD and position[clone.id()] > loss_op
        for result in clone.results():
            assert all(position[user.id()] > position[clone.id()] for user in result.all_used_ops())
    record = report.record("recompute")
    assert record.summary == "2 segments, 8 forward ops recomputed in backward (4, 4); ops run in program order"
    assert report.runtime_flags == {IN_ORDER: True}


def test_one_rank_trains_exactly_as_without_recompute():
    """Without communication the rewrite is the whole difference: bit-exact, not just close."""
    x, y = np.random.RandomState(0).rand(8, 64).astype("float32"), np.arange(8).reshape(8, 1).astype("int64")
    trained = []
    for recompute in (False, True):
        main, startup, loss, _, _ = build(lambda outputs: {"checkpoints": [outputs[2]]} if recompute else {},
                                          topology=Topology.grid(1), recompute=recompute)
        exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            paddle.seed(3)
            exe.run(startup)
            trained.append([float(exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss])[0]) for _ in range(3)])
    assert trained[0] == trained[1]


def test_a_value_is_stored_as_a_token_and_layer_names_validate_without_a_program():
    paddle.enable_static()
    main = paddle.static.Program()       # held: a value outlives its program only as a dangling pointer
    with paddle.static.program_guard(main):
        h = paddle.tanh(paddle.static.data("x", [2, 2], "float32"))
    strategy = DistributedStrategy()
    strategy.recompute = True
    strategy.recompute_configs = {"checkpoints": [h, "linear_2"]}
    assert strategy.recompute_configs.checkpoints == [f"value:pd_op.tanh#{h.get_defining_op().id()}:0", "linear_2"]
    strategy.validate()


@pytest.mark.parametrize("configs, message", [
    (lambda outputs: {"checkpoints": ["linear_9"]},
     "recompute checkpoint 'linear_9' names no layer of this program: a name is a layer's, whose parameters are "
     "'<name>.*' (here: linear_0, linear_1, linear_2, linear_3, linear_4, linear_5, linear_6)"),
    (lambda outputs: {"checkpoints": ["value:pd_op.tanh#1:0"]},
     "recompute checkpoint value:pd_op.tanh#1:0 is no forward value of the program being compiled"),
    (lambda outputs: {}, "recompute has nothing to recompute: recompute_configs.checkpoints is empty and no op was "
                         "built inside paddle.distributed.fleet.utils.recompute(...)"),
])
def test_checkpoints_that_name_nothing_are_errors_naming_them(configs, message):
    with pytest.raises(CompileError) as info:
        build(configs)
    assert message in str(info.value)


@pytest.mark.parametrize("fields, words", [
    ({"recompute_configs": {"enable_offload": True, "checkpoint_shape": [8, 32]}},
     "on CPU the checkpoints are in host memory already: there is nothing to offload to"),
    ({"build_strategy": {"enable_sequential_execution": False}}, "recompute needs the program to run in program order"),
    ({"recompute_configs": {"enable_tuning": True}}, "recompute_configs.enable_tuning is not implemented"),
])
def test_what_cannot_work_on_cpu_is_refused_at_validate(fields, words):
    strategy = DistributedStrategy()
    strategy.recompute = True
    for name, value in fields.items():
        setattr(strategy, name, value)
    with pytest.raises(StrategyConflictError, match=words):
        strategy.validate(Topology.grid(2))
