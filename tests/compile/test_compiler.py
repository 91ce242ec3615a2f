"""The compiler's contract: ordering, requires/conflicts, skips and strict mode, knob
accounting, provenance, invariants after every pass, the gloo guard, and the report.

Synthetic passes (built by `make_pass`) exercise the machinery; broken passes show that each
invariant stops the compile at the pass that broke it.
"""
import json

import paddle
import pytest

from fleetlite import CompileError, DistributedStrategy, StrategyConflictError, Topology
from fleetlite.compile import compiler, invariants, program_edit
from fleetlite.compile.report import APPLIED, OFF, SKIPPED
from fleetlite.strategies import REGISTRY
from fleetlite.compile.pass_contract import CompileContext, Pass, PassResult, Phase
from fleetlite.strategies.data_parallel import DataParallel
from fleetlite.strategies.gloo_lowering import GlooLowering
from support.models import backward_program

CPU_2 = Topology.grid(2)


class Quiet(Pass):
    """A pass that is always on and changes nothing."""
    phase = Phase.COMM_LAYOUT

    def enabled(self):
        return True

    def apply(self, context):
        return PassResult("nothing")


def make_pass(name, base=Quiet, **attributes):
    return type(name, (base,), {"name": name, **attributes})


def strategy(**fields):
    s = DistributedStrategy()
    for name, value in fields.items():
        setattr(s, name, value)
    return s


def compile_with(registry, topology=CPU_2, **fields):
    main, _, params_grads = backward_program()
    return compiler.compile(main, params_grads, strategy(**fields), topology, registry)


# --- ordering --------------------------------------------------------------------------
def test_order_is_phase_then_declared_edges_then_registry_position():
    registry = [make_pass("a"), make_pass("b", phase=Phase.COMMUNICATION), make_pass("c", before=("a",)),
                make_pass("d", phase=Phase.EXECUTION), make_pass("e")]
    _, report = compile_with(registry)
    assert report.applied == ["b", "c", "a", "e", "d"]
    _, report = compile_with([registry[4], registry[0]])
    assert report.applied == ["e", "a"]


def test_a_cycle_is_an_error_naming_its_passes():
    registry = [make_pass("a", after=("b",)), make_pass("b", after=("c",)), make_pass("c", after=("a",)),
                make_pass("d", after=("a",))]
    with pytest.raises(CompileError, match=r"passes declare a cycle: a -> c -> b -> a"):
        compile_with(registry)


def test_an_edge_against_the_phase_order_is_an_error():
    registry = [make_pass("late", phase=Phase.LOWERING, before=("early",)),
                make_pass("early", phase=Phase.COMMUNICATION)]
    with pytest.raises(CompileError, match=r"'late' \(LOWERING\) is declared to run before 'early' \(COMMUNICATION\)"):
        compile_with(registry)


# --- requires, conflicts, skips, strict ----------------------------------------------------
def on_when_set(name, **attributes):
    """A synthetic pass enabled by the real strategy field `name`."""
    return make_pass(name, enabled=Pass.enabled, reads=(name,), **attributes)


def test_a_missing_requirement_names_both_fields():
    with pytest.raises(StrategyConflictError, match=r"'lars' needs 'lamb', which is off; turn 'lamb' on, or 'lars' off"):
        compile_with([on_when_set("lars", requires=("lamb",)), on_when_set("lamb")], lars=True)


def test_conflicting_knobs_name_both_fields_the_reason_and_the_fix():
    registry = [on_when_set("dgc", conflicts={"sync_batch_norm": "dgc compresses what sync_batch_norm needs"}),
                on_when_set("sync_batch_norm")]
    with pytest.raises(StrategyConflictError, match=r"'dgc' and 'sync_batch_norm' cannot be used together: dgc "
                                                   r"compresses.*turn 'dgc' or 'sync_batch_norm' off"):
        compile_with(registry, dgc=True, sync_batch_norm=True)
    compile_with(registry, dgc=True)


def test_a_no_op_is_skipped_with_its_reason_and_so_are_passes_that_need_it():
    registry = [on_when_set("lamb", applicable=lambda self, topology, program: "not on this topology"),
                on_when_set("fp16_allreduce", requires=("lamb",))]
    _, report = compile_with(registry, lamb=True, fp16_allreduce=True)
    assert (report.record("lamb").status, report.record("lamb").reason) == ("skipped", "not on this topology")
    assert report.record("fp16_allreduce").reason == "needs lamb, which was skipped (not on this topology)"


def test_strict_turns_a_requested_skip_into_an_error():
    """(dgc: a field a real pass reads, since validate() refuses a knob no registered pass reads under strict.)"""
    registry = [on_when_set("dgc", applicable=lambda self, topology, program: "not on this topology")]
    with pytest.raises(CompileError, match="strict: dgc was requested but does nothing here: not on this topology"):
        compile_with(registry, dgc=True, strict=True)


def test_strict_allows_skips_of_knobs_the_user_did_not_set():
    _, report = compile_with(REGISTRY, Topology.grid(1), strict=True)
    assert report.record("data_parallel").status == "skipped"


def test_requested_knobs_no_pass_reads_are_reported_or_rejected_under_strict():
    _, report = compile_with(REGISTRY, find_unused_parameters=True, data_configs={"seed": 3})
    assert report.record("find_unused_parameters").reason.startswith("not needed")
    assert "data_configs" not in {r.name for r in report.records}
    with pytest.raises(CompileError, match="strict: find_unused_parameters was requested but not needed"):
        compile_with(REGISTRY, find_unused_parameters=True, strict=True)
    with pytest.raises(StrategyConflictError, match=r"^pipeline: fleetlite does not implement it \(set: "
                                                   r"pipeline_configs.micro_batch_size\); pipeline parallelism"):
        compile_with(REGISTRY, pipeline_configs={"micro_batch_size": 2})


def test_topology_rules_are_checked_with_the_arithmetic():
    with pytest.raises(StrategyConflictError, match=r"hierarchical_allreduce_inter_nranks = 3 does not divide "
                                                   r"the world size 32 \(32 % 3 = 2\)"):
        compile_with(REGISTRY, Topology.grid(32, 4, device="gpu"), use_hierarchical_allreduce=True,
                     hierarchical_allreduce_inter_nranks=3)
    with pytest.raises(StrategyConflictError, match=r"does not divide the 4 ranks per node \(4 % 8 = 4\)"):
        compile_with(REGISTRY, Topology.grid(32, 8, device="gpu"), use_hierarchical_allreduce=True,
                     hierarchical_allreduce_inter_nranks=8)
    uneven = Topology(rank=0, world_size=3, local_size=2, node_count=2, endpoints=["a:1", "a:2", "b:1"])
    with pytest.raises(StrategyConflictError, match="this job has 3 ranks but 2 nodes x 2 local ranks"):
        compile_with(REGISTRY, uneven, use_hierarchical_allreduce=True)


# --- provenance and invariants --------------------------------------------------------------
def broken(name, apply):
    return make_pass(name, after=("data_parallel",), requires=("data_parallel",), apply=apply)


def reduce_again(self, context):
    for grad in context.gradients:
        with context.edit(after=grad.synced.get_defining_op()):
            grad.synced = paddle._C_ops.all_reduce(grad.synced, 0, 0)
    return PassResult("")


def scale_again(self, context):
    for grad in context.gradients:
        with context.edit(after=grad.synced.get_defining_op()):
            grad.synced = paddle.scale(grad.synced, 0.5)
    return PassResult("")


def forget_reduction(self, context):
    context.gradients[0].synced = context.gradients[0].grad
    return PassResult("")


def unknown_ring(self, context):
    next(op for op in context.block.ops if op.has_attr("ring_id")).set_int_attr("ring_id", 7)
    return PassResult("")


def untagged(self, context):
    with paddle.static.program_guard(context.program):
        paddle.full([1], 0.0)
    return PassResult("")


def unnamed_persistable(self, context):
    context.gradients[0].grad.persistable = True     # what the copy-free buckets once did
    return PassResult("")


@pytest.mark.parametrize("apply, message", [
    (reduce_again, "the gradient of linear_1.b_0 is summed over 4 ranks on its way to the optimizer, expected 2"),
    (scale_again, "the gradient of linear_1.b_0 is scaled by 0.25, expected 0.5"),
    (forget_reduction, "the gradient of linear_1.b_0 is summed over 1 ranks"),
    (unknown_ring, "pd_op.all_reduce_ uses ring 7, which no pass registered"),
    (untagged, "created ops without its provenance tag: pd_op.full"),
    (unnamed_persistable, r"pd_op.add_grad \(op \d+\) makes a persistable value without a name"),
])
def test_a_broken_pass_is_stopped_at_the_pass_that_broke_the_program(apply, message):
    registry = [DataParallel, broken("breaker", apply)]
    with pytest.raises(CompileError, match=r"in pass breaker \(after data_parallel\): " + message):
        compile_with(registry)


def test_reading_a_value_before_it_is_written_is_caught():
    main, _, params_grads = backward_program()
    with program_edit.inserting(main, "probe", before=main.global_block().ops[0]) as created:
        paddle.scale(params_grads[0][1], 2.0)
    try:
        with pytest.raises(CompileError, match=r"pd_op.scale \(op 1\) reads a value that pd_op.add_grad "
                                               r"\(op \d+\) only writes later"):
            invariants.check_defined_before_use(main.global_block())
    finally:
        program_edit.remove_ops(main.global_block(), created)   # Paddle aborts destroying such a program


def test_the_optimizer_must_read_the_reduced_gradient():
    main, startup, params_grads = backward_program()
    gradients, _ = compiler.compile(main, params_grads, strategy(), CPU_2)
    with paddle.static.program_guard(main, startup):
        paddle.optimizer.SGD(0.1).apply_gradients(params_grads)       # the raw gradients
    with pytest.raises(CompileError, match="reads the gradient before it is reduced"):
        invariants.check_optimizer_reads_synced(main.global_block(), gradients)


# --- the gloo guard: each measured silent-wrong result is caught or avoided ----------------------------
def test_without_lowering_a_second_ring_on_cpu_is_rejected():
    registry = [p for p in REGISTRY if p is not GlooLowering]
    with pytest.raises(CompileError, match="uses ring 1 on CPU: Paddle.s CPU collective kernels ignore the ring id"):
        compile_with(registry, nccl_comm_num=2, fuse_grad_size_in_TFLOPS=2, last_comm_group_size_MB=0)


def test_a_ring_added_after_the_lowering_is_caught_at_that_pass():
    def add_ring(self, context):
        op = next(op for op in context.block.ops if op.has_attr("ring_id"))
        op.set_int_attr("ring_id", context.rings.add_world())
        return PassResult("")
    late = make_pass("late_ring", phase=Phase.EXECUTION, requires=("data_parallel",), apply=add_ring)
    with pytest.raises(CompileError, match=r"in pass late_ring \(after data_parallel, gloo_lowering\): "
                                           r"pd_op.all_reduce_ uses ring 1 on CPU"):
        compile_with([DataParallel, GlooLowering, late])


def one_collective(dtype, build):
    paddle.enable_static()
    main = paddle.static.Program()
    with paddle.static.program_guard(main):
        build(paddle.static.data("x", [4], dtype))
    return main


@pytest.mark.parametrize("dtype, build, message", [
    ("float16", lambda x: paddle._C_ops.all_reduce(x, 0, 0), "sums float16: gloo returns inf"),
    ("float32", lambda x: paddle._C_ops.all_reduce(x, 0, 4), "reduce_type AVG: gloo has no AVG reduce"),
    ("float32", lambda x: paddle._C_ops.reduce_scatter(x, 0, 2), "reduce_scatter has no CPU kernel"),
    ("float32", lambda x: paddle._C_ops.coalesce_tensor([x], paddle.float32, True, False, False, 0.0, False,
                                                        -1, -1, [], []), "coalesce_tensor: its views do not see"),
])
def test_the_gloo_guard_rejects_what_gloo_gets_silently_wrong(dtype, build, message):
    main = one_collective(dtype, build)     # keep the program alive while its block is read
    with pytest.raises(CompileError, match=message):
        invariants.check_gloo(main.global_block())


def test_lowering_sums_float16_in_float32():
    main = one_collective("float16", lambda x: paddle._C_ops.all_reduce(x, 0, 0))
    context = CompileContext(main, strategy(), CPU_2, [])
    context.current_pass = "gloo_lowering"
    GlooLowering(context.strategy).apply(context)
    names = [op.name() for op in main.global_block().ops]
    assert names == ["pd_op.data", "pd_op.cast", "pd_op.all_reduce_", "pd_op.cast"]
    invariants.check_gloo(main.global_block())


# --- the report ---------------------------------------------------------------------------
def test_the_report_lists_every_pass_and_dumps_as_json():
    _, report = compile_with(REGISTRY, Topology.grid(4, 2), nccl_comm_num=2, use_hierarchical_allreduce=True)
    table = report.table()
    for name in ("data_parallel", "fuse_all_reduce_ops", "nccl_comm_num", "use_hierarchical_allreduce",
                 "gloo_lowering", "sync_nccl_allreduce"):
        assert name in table
    assert "rank 0/4 (local 0/2, node 0/2, cpu, gloo)" in table and "buckets (issue order):" in table
    dumped = json.loads(report.to_json())
    assert [r["name"] for r in dumped["records"]][:4] == ["data_parallel", "fuse_all_reduce_ops", "nccl_comm_num",
                                                           "use_hierarchical_allreduce"]
    assert dumped["records"][1]["config"]["fuse_grad_size_in_MB"] == 32
    assert dumped["rings"] == [{"ring": 0, "kind": "world", "size": 4, "groups": 1, "members": [0, 1, 2, 3]}]


def test_the_table_has_a_row_per_pass_applied_or_skipped_and_names_the_knobs_that_are_off_in_one_line():
    _, report = compile_with(REGISTRY, Topology.grid(4, 2), nccl_comm_num=2)
    lines = report.table().splitlines()
    header = lines.index(next(line for line in lines if line.startswith("#  ")))
    off_line = next(i for i, line in enumerate(lines) if line.startswith("off: "))
    rows = [line.split()[1] for line in lines[header + 1:off_line]]
    assert rows == [r.name for r in report.records if r.status in (APPLIED, SKIPPED)]
    assert {"data_parallel", "fuse_all_reduce_ops", "nccl_comm_num", "gloo_lowering"} <= set(rows)
    off = [r.name for r in report.records if r.status == OFF]
    assert "amp" in off and "use_hierarchical_allreduce" in off
    assert lines[off_line] == "off: " + ", ".join(off) and sum(line.startswith("off") for line in lines) == 1
    assert not any(f" {OFF} " in line for line in lines[header:off_line])
    assert [r["name"] for r in json.loads(report.to_json())["records"] if r["status"] == OFF] == off
