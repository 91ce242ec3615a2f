"""Copy-free gradient buckets on CPU (strategies/copy_free_buckets.py, fleetlite/compile/bucket_views.py).

Numbers are checked by the parity and knob-pair tests (every preset and knob combination runs
on 2 and 4 ranks against one process); here: that the steady state really is copy-free, that
saving never writes the buckets' buffers, what the compile report says per bucket, and the
concat/split fallback where the kernels cannot be built.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import paddle
import pytest

from fleetlite import DistributedStrategy, Topology
from fleetlite.compile import bucket_views, gradient_buckets, group_collectives, program_edit
from fleetlite.compile.kernel_library import CACHE_ENV
from support.multiprocess import clean_environment, run_job
from support.models import compiled_program

WORKER = Path(__file__).resolve().parents[1] / "workers" / "copy_free_worker.py"
CPU_2 = Topology.grid(2, 1, rank=0)
CPU_4 = Topology.grid(4, 2, rank=3)
ONE_BUCKET = {"fuse_grad_size_in_MB": 64, "fuse_grad_size_in_TFLOPS": 0, "last_comm_group_size_MB": 0}


def strategy(**fields):
    s = DistributedStrategy()
    for name, value in {**ONE_BUCKET, **fields}.items():
        setattr(s, name, value)
    return s


def compile_mlp(topology, **fields):
    main, _, built = compiled_program(strategy(**fields), topology)
    return main, built.report


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("copy_free")
    return run_job(WORKER, 2, args=[folder], timeout=120)


def test_from_the_second_step_backward_writes_every_gradient_into_its_slot(trained):
    """Step 1 copies each member in and points it at its slot; from then on the conv, batch-norm
    and linear gradient kernels write into the slots (they stay alive because they are persistable)
    and neither kernel copies anything."""
    for rank in trained:
        members = rank["members"]
        assert rank["buckets"][0]["path"] == "copy-free"
        first, *later = rank["counts"]
        assert first == {"packed_in_place": 0, "packed_copied": members,
                         "aliased_in_place": members, "aliased_copied": 0}
        for step, counts in enumerate(later, start=2):
            assert counts == {"packed_in_place": members * (step - 1), "packed_copied": members,
                              "aliased_in_place": members * step, "aliased_copied": 0}, f"step {step}"


def test_checkpoints_and_inference_models_hold_no_bucket_buffer_or_gradient(trained):
    saved = trained[0]["saved"]
    assert saved and not [name for name in saved if bucket_views.BUFFER_PREFIX in name or "GRAD" in name]
    assert {"conv2d_0.w_0", "batch_norm2d_0.w_0", "linear_0.w_0"} <= set(saved)
    assert "conv2d_0.w_0" in trained[0]["inference"] and bucket_views.BUFFER_PREFIX not in trained[0]["inference"]


def test_the_report_shows_each_bucket_copy_free_and_the_pack_carries_the_mean():
    main, report = compile_mlp(CPU_2)
    assert [b["path"] for b in report.buckets] == ["copy-free"]
    assert report.record("copy_free_buckets").summary == "1 of 1 multi-gradient buckets copy-free"
    names = [op.name() for op in program_edit.created_by(main.global_block(), "copy_free_buckets")]
    assert names == ["pd_op.data"] + ["builtin.shadow_output"] * 4 + [
                     "builtin.combine", "custom_op.fleetlite_bucket_pack_", "pd_op.all_reduce_",
                     "builtin.combine", "custom_op.fleetlite_bucket_alias_", "builtin.split"]
    pack = next(op for op in main.global_block().ops if op.name() == "custom_op.fleetlite_bucket_pack_")
    assert pack.attrs()["scale"] == pytest.approx(0.5)
    assert "pd_op.concat" not in {op.name() for op in main.global_block().ops}


def test_the_kept_gradients_are_named_persistables_the_startup_program_creates():
    main, startup, built = compiled_program(strategy(), CPU_2)
    kept = [v for v in main.list_vars() if v.persistable and v.name.endswith("@GRAD")]
    assert sorted(v.name for v in kept) == sorted(f"{name}@GRAD" for name in built.report.buckets[0]["gradients"])
    assert all(v.get_defining_op().name().endswith("_grad") for v in kept)       # backward's own values
    created = {op.attrs()["output_name"] for op in startup.global_block().ops if op.name() == "builtin.shadow_output"}
    assert {v.name for v in kept} <= created


def test_under_several_steps_per_run_the_gradients_are_not_kept_and_the_report_says_so():
    """Paddle 3.3.1's N-step plan segfaults building the pack when its inputs are named
    persistables: the pack copies them in instead (still one collective per bucket)."""
    main, report = compile_mlp(CPU_2, execution_strategy={"num_iteration_per_run": 2})
    assert not [v for v in main.list_vars() if v.persistable and v.name.endswith("@GRAD")]
    assert [b["path"] for b in report.buckets] == ["copy-free"]
    assert report.record("copy_free_buckets").summary == (
        "1 of 1 multi-gradient buckets copy-free (the pack copies every gradient in at each step: Paddle's "
        "N-step plan (execution_strategy.num_iteration_per_run) cannot run with the gradients kept as "
        "persistable variables)")


def test_single_gradient_buckets_are_reduced_in_place_and_loss_side_scaling_leaves_the_pack_at_1():
    _, report = compile_mlp(CPU_2, fuse_grad_size_in_MB=0)
    assert {b["path"] for b in report.buckets} == {gradient_buckets.IN_PLACE}
    assert report.record("copy_free_buckets").summary.startswith("no bucket holds several gradients")
    main, _ = compile_mlp(CPU_2, gradient_scale_configs={"scale_gradient": True})
    pack = next(op for op in main.global_block().ops if op.name() == "custom_op.fleetlite_bucket_pack_")
    assert pack.attrs()["scale"] == 1.0


AMP_ON_CPU = {"custom_black_list": ["matmul", "conv2d", "relu", "elementwise_add", "flatten"],
              "custom_white_list": ["pool2d"]}


@pytest.mark.parametrize("fields", [
    {"amp": True, "amp_configs": AMP_ON_CPU},
    {"sync_batch_norm": True},
    {"pto": True},
    {"topk": True, "topk_configs": {"density": 0.1, "min_numel": 200}},
    {"dgc": True},
], ids=["amp", "sync_batch_norm", "pto", "topk", "dgc"])
def test_knobs_that_leave_the_bucket_a_sum_on_ring_0_keep_it_copy_free(fields):
    paddle.enable_static()     # dgc needs Momentum, which Paddle builds only in static mode here
    _, _, built = compiled_program(strategy(**fields), CPU_2, model_name="convbn",
                                   optimizer=paddle.optimizer.Momentum(0.1))
    buckets = [b for b in built.report.buckets if len(b["gradients"]) > 1]
    assert buckets and {b["path"] for b in buckets} == {"copy-free"}


def test_with_two_rings_the_world_rings_buckets_stay_copy_free_and_a_sub_group_ones_copy():
    """Ring 1 is a real gloo sub-group where its op builds: the lowering rewrites that bucket's
    collective, so it copies (concat/split) and says why; ring 0's stay copy-free."""
    paddle.enable_static()
    _, _, built = compiled_program(strategy(nccl_comm_num=2, fuse_grad_size_in_TFLOPS=2), CPU_2, model_name="convbn",
                                   optimizer=paddle.optimizer.Momentum(0.1))
    buckets = [b for b in built.report.buckets if len(b["gradients"]) > 1]
    on_ring_0 = {b["path"] for b in buckets if b["ring"] == 0}
    elsewhere = {b["path"] for b in buckets if b["ring"] != 0}
    assert on_ring_0 == {"copy-free"}
    expected = "copy-free" if group_collectives.load_error() else "concat/split: a layout pass rewrote its collective"
    assert elsewhere == {expected}


@pytest.mark.parametrize("fields, reason", [
    ({"fp16_allreduce": True}, "a layout pass rewrote its collective"),
    ({"use_hierarchical_allreduce": True}, "a layout pass rewrote its collective"),
    ({"gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}},
     "its gradients are gradient merge's copies, which run inside the update branch"),
])
def test_buckets_that_cannot_be_copy_free_say_why(fields, reason):
    _, report = compile_mlp(CPU_4, **fields)
    assert [b["path"] for b in report.buckets] == [f"concat/split: {reason}"]
    assert report.record("copy_free_buckets").summary == f"0 of 1 multi-gradient buckets copy-free; bucket 0 copies: {reason}"


def test_gpu_programs_keep_their_concat_split_buckets():
    _, report = compile_mlp(Topology.grid(8, 1, rank=0, device="gpu"))
    assert [b["path"] for b in report.buckets] == ["concat/split"]
    assert report.record("copy_free_buckets").reason == "nccl keeps its concat/split buckets around the collective"


WITHOUT_A_COMPILER = f"""
    from fleetlite import DistributedStrategy, Topology
    from support.models import compiled_program
    strategy = DistributedStrategy()
    for name, value in {ONE_BUCKET!r}.items():
        setattr(strategy, name, value)
    _, _, built = compiled_program(strategy, Topology.grid(2, 1, rank=0))
    print(built.report.record("copy_free_buckets").reason)
    print([b["path"] for b in built.report.buckets])
"""


def test_without_a_compiler_the_report_says_so_in_one_line_and_buckets_copy(tmp_path):
    tests = Path(__file__).resolve().parents[1]
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(WITHOUT_A_COMPILER)], capture_output=True,
                           text=True, timeout=120, cwd=tests,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tests), CACHE_ENV: str(tmp_path),
                                "CXX": "no-such-compiler", "HOME": str(tmp_path)})
    assert child.returncode == 0, child.stderr[-3000:]
    cause = "no C++ compiler ('no-such-compiler' is not on PATH; install g++ or set CXX)"
    reason, paths = child.stdout.strip().splitlines()
    assert reason == f"the bucket kernels cannot be built here ({cause}): buckets copy through concat/split"
    assert paths == "['concat/split']"
    assert f"fleetlite: warning: gradient buckets copy through concat and split, slower on CPU: {cause}" in child.stderr


def test_importing_the_bucket_views_first_prints_nothing(tmp_path):
    """Its kernel library imports Paddle's C++ op builder, whose "No ccache found" is noise."""
    env = {name: value for name, value in clean_environment().items() if name != "PYTHONWARNINGS"}
    result = subprocess.run([sys.executable, "-c", "import fleetlite.compile.bucket_views"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
