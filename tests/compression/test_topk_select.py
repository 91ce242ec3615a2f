"""fleetlite.compression.topk_select: MSTopK and exact top-k on NumPy arrays, eager tensors and static programs.

MSTopK returns exactly k elements. When at least k elements pass its sampled threshold, those are
a superset of the true top-k and the exact trim keeps exactly the top-k, so recall is 1 up to ties;
the tests ask for the issue's 0.95 and check the count, the signs and the indices on every kind of
gradient. Sizes above topk.MIN_SAMPLED take the sampled path (sample, one masked pass, trim),
which every such test runs through both implementations: the compiled kernel (what CPUs run; a
failed build fails these tests instead of falling back) and the Paddle-op composition (GPUs).
"""
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import paddle
import pytest

from fleetlite.compression import mstopk_kernel, topk_select as topk
from fleetlite.interprocess.file_lock import FileLock

SAMPLED = 200_000      # > topk.MIN_SAMPLED: the sampled path
RNG = np.random.default_rng(7)
GRADIENTS = {
    "gaussian": lambda n: RNG.standard_normal(n),
    "heavy_tailed": lambda n: RNG.standard_cauchy(n),
    "sparse": lambda n: RNG.standard_normal(n) * (RNG.random(n) < 0.02),
}


@pytest.fixture(params=["kernel", "ops"])
def implementation(request):
    return request.param


def tie_aware_recall(x, indices, k):
    """Share of the selected elements whose |x| reaches the k-th largest |x| (equal values are interchangeable)."""
    kth = np.sort(np.abs(x))[-k]
    return np.count_nonzero(np.abs(x[indices]) >= kth) / k


def check_selection(x, values, indices, k):
    assert values.shape == (k,) and indices.shape == (k,) and indices.dtype == np.int64
    assert len(np.unique(indices)) == k
    np.testing.assert_array_equal(values, x.reshape(-1)[indices])   # signed values of x itself


@pytest.mark.parametrize("kind", GRADIENTS)
@pytest.mark.parametrize("density", [0.001, 0.01, 0.1])
def test_mstopk_selects_exactly_k_with_recall_of_the_exact_top_k(kind, density, implementation):
    x = GRADIENTS[kind](SAMPLED).astype("float32")
    k = int(SAMPLED * density)
    values, indices = topk.mstopk(x, k, implementation=implementation)
    check_selection(x, values, indices, k)
    assert tie_aware_recall(x, indices, k) >= 0.95
    exact_values, _ = topk.exact_topk(x, k)
    np.testing.assert_array_equal(np.sort(np.abs(values)), np.sort(np.abs(exact_values)))


def test_small_tensors_and_matrices_are_selected_exactly_by_flat_index():
    x = RNG.standard_normal((64, 50)).astype("float64")
    values, indices = topk.mstopk(x, 40)
    check_selection(x, values, indices, 40)
    np.testing.assert_array_equal(indices, np.argsort(-np.abs(x.reshape(-1)), kind="stable")[:40])


def test_ties_give_k_distinct_elements_of_the_tied_value(implementation):
    x = np.full(SAMPLED, -0.5, "float32")
    values, indices = topk.mstopk(x, 300, implementation=implementation)
    check_selection(x, values, indices, 300)
    np.testing.assert_array_equal(values, -0.5)


def test_all_zero_gives_k_zeros(implementation):
    values, indices = topk.mstopk(np.zeros(SAMPLED, "float32"), 50, implementation=implementation)
    check_selection(np.zeros(SAMPLED), values, indices, 50)


def test_too_few_survivors_of_the_sampled_threshold_fall_back_to_the_exact_top_k(implementation):
    """Large values only where the strided sample looks: its threshold passes about `target`
    elements, far fewer than k, so the exact branch must run."""
    n, k = SAMPLED, 40_000
    stride = topk.sample_stride(n, k)
    x = RNG.uniform(0, 1, n).astype("float32")
    x[::stride] += 10.0
    assert np.count_nonzero(x > 10) < k
    values, indices = topk.mstopk(x, k, implementation=implementation)
    check_selection(x, values, indices, k)
    np.testing.assert_array_equal(np.sort(values), np.sort(x)[-k:])


def test_k_at_least_numel_returns_every_element_in_index_order():
    x = RNG.standard_normal(10).astype("float32")
    for k in (10, 25):
        values, indices = topk.mstopk(x, k)
        np.testing.assert_array_equal(values, x)
        np.testing.assert_array_equal(indices, np.arange(10))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("n", [1000, SAMPLED])
def test_inf_or_nan_is_a_clear_error(bad, n, implementation):
    x = RNG.standard_normal(n).astype("float32")
    x[n // 3] = bad
    with pytest.raises(FloatingPointError, match="top-k selection of x: it holds inf or NaN"):
        topk.mstopk(x, 10, implementation=implementation)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        topk.mstopk(np.ones(5, "float32"), 0)
    with pytest.raises(TypeError, match="takes float32 or float64, got int32"):
        topk.exact_topk(np.ones(5, "int32"), 2)
    with pytest.raises(ValueError, match="implementation must be one of auto, kernel, ops, got 'fast'"):
        topk.mstopk(np.ones(5, "float32"), 2, implementation="fast")


def test_tensors_in_tensors_out(implementation):
    x = RNG.standard_normal(SAMPLED).astype("float32")
    values, indices = topk.mstopk(paddle.to_tensor(x), 500, implementation=implementation)
    assert isinstance(values, paddle.Tensor) and isinstance(indices, paddle.Tensor)
    check_selection(x, values.numpy(), indices.numpy(), 500)


def test_a_numpy_array_is_selected_in_its_own_memory_and_the_results_are_the_callers(implementation,
                                                                                     monkeypatch):
    x = RNG.standard_normal(SAMPLED).astype("float32")
    assert topk.tensor_over(x).data_ptr() == x.ctypes.data          # shared, not copied
    expected = topk.mstopk(paddle.to_tensor(x), 500, implementation=implementation)
    with monkeypatch.context() as patch:
        patch.setattr(paddle, "to_tensor", lambda *args, **kwargs: pytest.fail("the array was copied"))
        values, indices = topk.mstopk(x, 500, implementation=implementation)
        everything, _ = topk.mstopk(x[:100], 100)
    np.testing.assert_array_equal(values, expected[0].numpy())
    np.testing.assert_array_equal(indices, expected[1].numpy())
    assert not np.shares_memory(everything, x)                     # k >= numel: a copy of x, not x


@pytest.mark.parametrize("array", [RNG.standard_normal(2 * SAMPLED).astype("float32")[::2],
                                   np.asfortranarray(RNG.standard_normal((500, 400)))], ids=["strided", "fortran"])
def test_an_array_paddle_cannot_share_is_copied_and_selected_right(array, implementation):
    assert topk.tensor_over(array).data_ptr() != array.ctypes.data
    values, indices = topk.mstopk(array, 300, implementation=implementation)
    check_selection(array, values, indices, 300)
    assert tie_aware_recall(array.reshape(-1), indices, 300) >= 0.95


KERNEL_OPS = {"custom_op.fleetlite_mstopk", "pd_op.assert"}           # the kernel, then the finite check
COMPOSITION_OPS = {"pd_op.nonzero", "pd_op.strided_slice", "pd_op.if", "pd_op.assert"}


@pytest.mark.parametrize("implementation, dtype, built_ops, absent_ops, topk_ops", [
    ("auto", "float32", KERNEL_OPS, {"pd_op.nonzero", "pd_op.if"}, 0),   # on a CPU "auto" is the kernel
    ("kernel", "float64", KERNEL_OPS, {"pd_op.nonzero", "pd_op.if"}, 0),
    ("ops", "float32", COMPOSITION_OPS, {"custom_op.fleetlite_mstopk"}, 1),  # the trim lives in the branch
])
def test_the_static_program_runs_the_same_kernel_with_the_same_result(implementation, dtype, built_ops, absent_ops,
                                                                       topk_ops):
    x = RNG.standard_normal(SAMPLED).astype(dtype)
    eager = topk.mstopk(x, 400, implementation=implementation)
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            data = paddle.static.data("x", [SAMPLED], dtype)
            built = topk.mstopk(data, 400, name="g", implementation=implementation)
        names = [op.name() for op in main.global_block().ops]
        assert built_ops <= set(names) and not absent_ops & set(names)
        assert names.count("pd_op.topk") == topk_ops
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            exe.run(startup)
            values, indices = exe.run(main, feed={"x": x}, fetch_list=list(built))
            np.testing.assert_array_equal(values, eager[0])
            np.testing.assert_array_equal(indices, eager[1])
            x[5] = np.nan
            with pytest.raises(ValueError, match="'top-k of g is finite"):
                exe.run(main, feed={"x": x}, fetch_list=list(built))
    finally:
        paddle.disable_static()


def test_the_bucket_ops_select_each_gradients_own_top_k_keep_the_rest_and_scatter_in_rank_order():
    """The topk pass's CPU bucket path, eagerly: a sampled and an exact-sized gradient with their residuals,
    a float16 wire (the residual keeps the rounding); then two ranks' pairs scattered back, scaled by 1/2."""
    assert mstopk_kernel.load_error() is None
    shapes, ks = [(400, 500), (3000,)], [200, 30]
    grads = [RNG.standard_normal(s).astype("float32") for s in shapes]
    residuals = [RNG.standard_normal(int(np.prod(s))).astype("float32") for s in shapes]
    sampling = [topk.sampling(g.size, k) for g, k in zip(grads, ks)]
    tensors = [paddle.to_tensor(r) for r in residuals]
    values, offsets = mstopk_kernel.select_bucket(
        [paddle.to_tensor(g) for g in grads], ks, [s for s, _ in sampling], [t for _, t in sampling], 20, ["a", "b"],
        tensors, wire_float16=True)[:2]
    expected, start = [], 0
    for g, r, k, left in zip(grads, residuals, ks, tensors):
        acc = g.reshape(-1) + r
        chosen = np.argsort(-np.abs(acc), kind="stable")[:k]
        expected.append(start + chosen)
        acc[chosen] -= acc[chosen].astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(left.numpy(), acc)
        start += g.size
    np.testing.assert_array_equal(offsets.numpy(), np.concatenate(expected))
    assert offsets.dtype == paddle.int32
    pairs = (paddle.concat([values, -2 * values]), paddle.concat([offsets, offsets]))
    reduced = mstopk_kernel.scatter_bucket([paddle.to_tensor(g) for g in grads], *pairs, 0.5)
    summed = np.zeros(start, np.float32)
    np.add.at(summed, offsets.numpy(), values.numpy())
    np.add.at(summed, offsets.numpy(), -2 * values.numpy())
    np.testing.assert_array_equal(np.concatenate([r.numpy().reshape(-1) for r in reduced]), summed * np.float32(0.5))
    assert [list(r.shape) for r in reduced] == [list(s) for s in shapes]
    grads[1][7] = np.nan
    with pytest.raises(Exception, match="top-k selection of the gradient of b: it holds inf or NaN"):
        mstopk_kernel.select_bucket([paddle.to_tensor(g) for g in grads], ks, [s for s, _ in sampling],
                                    [t for _, t in sampling], 20, ["a", "b"])


def test_the_kernel_orders_equal_magnitudes_by_index():
    x = np.tile(np.array([1.0, -3.0, 3.0, 2.0], "float32"), SAMPLED // 4)
    values, indices = topk.mstopk(x, 1000, implementation="kernel")
    np.testing.assert_array_equal(indices, np.sort(np.flatnonzero(np.abs(x) == 3))[:1000])
    np.testing.assert_array_equal(values, x[indices])


# ---- building and loading the kernel ---------------------------------------------------------

def start_child(code, cache, **env):
    """A fresh Python running `code`, its kernel cache at `cache`."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, mstopk_kernel.CACHE_ENV: str(cache), **env})


def finish(child):
    """(exit status, stdout, stderr) of a child started by start_child."""
    out, err = child.communicate(timeout=120)
    return child.returncode, out, err


def wait_until_opened(pid, path, timeout=60):
    """Until process `pid` holds `path` open (as a rank waiting for the build lock does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == path for fd in os.listdir(f"/proc/{pid}/fd")):
                return
        except FileNotFoundError:       # an fd closed while we looked
            pass
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not open {path} within {timeout} s")


SELECT_IN_CHILD = """
    import numpy as np
    from fleetlite.compression import topk_select as topk
    x = np.random.default_rng(3).standard_normal(200_000).astype("float32")
    for _ in range(2):
        values, indices = topk.mstopk(x, 500)
    assert np.array_equal(np.sort(indices), np.sort(np.argsort(-np.abs(x))[:500]))
    try:
        topk.mstopk(x, 500, implementation="kernel")
    except RuntimeError as error:
        print(error)
    else:
        print("kernel ran")
"""


def test_without_a_compiler_mstopk_warns_once_and_runs_as_paddle_ops(tmp_path):
    status, out, err = finish(start_child(SELECT_IN_CHILD, tmp_path, CXX="no-such-compiler"))
    assert status == 0, err[-3000:]
    cause = "no C++ compiler ('no-such-compiler' is not on PATH; install g++ or set CXX)"
    warnings = [line for line in err.splitlines() if line.startswith("fleetlite:")]
    assert warnings == [f"fleetlite: warning: MSTopK runs as Paddle ops, slower on CPU: {cause}"]
    assert out.strip() == (f"implementation='kernel': the compiled MSTopK kernel is not available: {cause}; "
                           "use implementation='ops' or 'auto'")


def test_a_rank_waits_for_the_neighbour_that_builds_the_kernel_and_loads_its_library(tmp_path, monkeypatch):
    """This process holds the build lock, as a rank that is compiling would; the child (which has
    no compiler, so building itself would fail) must wait for it, then load the library put in place."""
    assert mstopk_kernel.load_error() is None
    built = mstopk_kernel.library_path()
    monkeypatch.setenv(mstopk_kernel.CACHE_ENV, str(tmp_path))
    library = mstopk_kernel.library_path()
    with FileLock(library + ".lock", 10, "hold the lock for a test", TimeoutError):
        child = start_child(SELECT_IN_CHILD, tmp_path, CXX="no-such-compiler")
        try:
            wait_until_opened(child.pid, library + ".lock")
        except AssertionError:
            child.kill()
            raise
        shutil.copy(built, library + ".partial")
        os.replace(library + ".partial", library)
    status, out, err = finish(child)
    assert status == 0, err[-3000:]
    assert out.strip() == "kernel ran" and "fleetlite: warning" not in err
