"""Top-k selection by magnitude: MSTopK (a sampled threshold, no sort of the whole tensor) and exact.

`mstopk(x, k)` and `exact_topk(x, k)` return the (values, indices) of the k elements of largest
|x| in the flattened x: signed values, int64 indices into x.reshape(-1), in descending |x| order
(when k >= numel: every element, in index order). They take a NumPy array (and return NumPy
arrays; on a CPU a C-contiguous float array is read in place, see `tensor_over`) or a Paddle
tensor or static value (and return the same). The one function runs eagerly
and builds the static (PIR) ops the `topk` pass puts in training programs, with the same kernel,
so what benchmarks/topk/topk_select.py measures eagerly is what training runs.

MSTopK (Shi et al., MLSys'21) bisects a threshold mean(a) + r * (max(a) - mean(a)) on a = |x|
instead of sorting. A bisection over the whole tensor costs a full pass per iteration (on CPU,
slower than numpy.argpartition), so here it runs on a strided sample:
1. sample: every s-th element (s prime, so the rows of a weight matrix do not alias with it),
   with s chosen so that about SAMPLE_HITS of the true top-k fall into the sample;
2. the bisection's result on the sample after `iterations` steps (computed in closed form, see
   `sampled_threshold`): a threshold that leaves at least `target` sample elements at or above
   it, `target` being the expected top-k hits plus MARGIN_SIGMAS standard deviations, so the
   full tensor has at least k elements above it except with vanishing probability;
3. one pass over x lists the elements with |x| >= threshold (and every inf or NaN): about
   1.9 k survivors;
4. an exact top-k of the survivors' |x| trims them to exactly k; in the rare case that fewer
   than k survived (an unlucky sample, or many zeros), the exact top-k of x runs instead, so
   the result is always exactly k elements.
Everything at or above the threshold survives, so whenever k survive, the trim returns the
exact top-k (up to ties): the sample decides only how much work the trim has. Tensors of at
most MIN_SAMPLED elements go straight to the exact top-k.

Two implementations of steps 1-4, chosen by `implementation`:
- "kernel": one compiled CPU operator (mstopk_select.cc, built on first use by
  fleetlite.compression.mstopk_kernel): a sample pass and one full pass, equal magnitudes ordered by index;
- "ops": a composition of Paddle ops, for GPUs and wherever the kernel cannot be built. Each op
  is a full pass with a fresh allocation, so step 3 runs in chunks of CHUNK elements:
  trunc(x / threshold) != 0 marks |x| >= threshold (and every inf or NaN), nonzero() lists them;
  chunks keep each temporary small enough that the allocator reuses it (a fresh tensor the size
  of x costs more in page faults than the pass itself). The fallback to the exact top-k is a
  conditional branch in a static program.
"auto" (the default) takes the kernel for CPU tensors, and for static programs when Paddle's
device is the CPU, if it loaded; the ops otherwise.
A non-finite element always survives step 3 (and the kernel ranks NaN with inf), so checking
the survivors (ops) or the k values (kernel) for inf/NaN costs nothing; `mstopk` then raises
(eagerly) or fails the program run (statically) with a message naming the tensor (gradients
must be finite; with loss scaling an overflow is expected, so the `topk` pass zeroes a
non-finite gradient before selecting and lets AMP's agreed overflow flag drop the step).
"""
import math

import numpy as np

from fleetlite.paddle_compat import quiet_warnings as paddle_noise

with paddle_noise.importing_paddle():       # a plain `import fleetlite.topk` may be Paddle's first
    import paddle
    from paddle.pir.core import create_persistable_value

    from fleetlite.compression import mstopk_kernel

# Expected true top-k elements in the sample. 32 rather than 128: a 4x smaller sample (its strided
# reads touch every cache line of a gradient below a stride of 16) halves the CPU kernel's time at
# density 0.001 (8.8 -> 4.4 ms for a 4.2M-element bucket), for ~1.9 k survivors instead of ~1.3 k;
# the threshold still sits MARGIN_SIGMAS below the expected k-th value.
SAMPLE_HITS = 32
MARGIN_SIGMAS = 5        # how far below the expected k-th value the sampled threshold sits
CHUNK = 1 << 18          # elements per chunk of the masked pass (1 MiB of float32)
MIN_SAMPLED = 1 << 14    # up to this many elements a sort is cheaper than MSTopK's ops: exact top-k
FLOAT_DTYPES = ("float32", "float64")
IMPLEMENTATIONS = ("auto", "kernel", "ops")


def mstopk(x, k, iterations=20, name="x", implementation="auto"):
    """(values, indices) of the k elements of largest |x| (see the module doc): exactly k, and
    the exact top-k up to ties; `iterations` bisection steps place the sampled threshold;
    `implementation` is "auto", "kernel" (an error where it cannot be built) or "ops"."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
    return _call(lambda flat, n: _mstopk(flat, n, k, iterations, name, implementation), x, k)


def exact_topk(x, k):
    """(values, indices) of exactly the k elements of largest |x|: paddle.topk of |x|."""
    return _call(lambda flat, n: _exact(flat, min(k, n)), x, k)


def sample_stride(numel, k):
    """The sampling stride: a prime close to k / SAMPLE_HITS (1: sample everything)."""
    if k <= SAMPLE_HITS:
        return 1
    return _prime_at_most(max(2, min(k // SAMPLE_HITS, numel // MIN_SAMPLED)))


def sample_target(numel, k, stride):
    """How many sample elements the threshold must leave above it (see the module doc)."""
    sampled = -(-numel // stride)
    if stride == 1:
        return k
    hits = sampled * k / numel
    return min(sampled, int(math.ceil(hits + MARGIN_SIGMAS * math.sqrt(hits))) + 1)


def sampling(numel, k):
    """(stride, target) of MSTopK's sample for the top-k of `numel` elements; (1, k) where the
    exact top-k runs (at most MIN_SAMPLED elements): the whole tensor is the sample."""
    if numel <= MIN_SAMPLED:
        return 1, k
    stride = sample_stride(numel, k)
    return stride, sample_target(numel, k, stride)


def _call(kernel, x, k):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    as_numpy = isinstance(x, np.ndarray)
    if as_numpy:
        x = tensor_over(x)
    dtype = str(x.dtype).replace("paddle.", "")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"top-k selection takes float32 or float64, got {dtype}")
    n = math.prod(x.shape)
    if n < 1:
        raise ValueError(f"top-k selection of an empty tensor (shape {list(x.shape)})")
    flat = x if len(x.shape) == 1 else paddle.reshape(x, [-1])
    values, indices = (flat, paddle.arange(n, dtype="int64")) if k >= n else kernel(flat, n)
    if as_numpy:
        return values.numpy(), indices.numpy()
    return values, indices


def tensor_over(array):
    """A Paddle tensor for a NumPy array: eagerly on a CPU device, over the array's own memory
    (DLPack; paddle.to_tensor copies, 100 MB for a 25M-element gradient, several times the cost of
    the selection itself); a copy where the array cannot be shared as it is (not C-contiguous, not
    native float32/float64), Paddle's device is not the CPU, or static mode is on."""
    if (array.flags.c_contiguous and array.dtype in (np.float32, np.float64)
            and paddle.in_dynamic_mode() and paddle.device.get_device() == "cpu"):
        return paddle.utils.dlpack.from_dlpack(array)
    return paddle.to_tensor(array)


def _exact(flat, k):
    _, indices = paddle.topk(paddle.abs(flat), k)
    return paddle.gather(flat, indices), indices


def _mstopk(flat, n, k, iterations, name, implementation):
    if n <= MIN_SAMPLED:
        _check_finite(flat, name)
        return _exact(flat, k)
    stride, target = sampling(n, k)
    if _takes_kernel(flat, implementation):
        values, indices = mstopk_kernel.select(flat, k, stride, target, iterations)
        _check_finite(values, name)
        return values, indices
    threshold = sampled_threshold(flat, stride, target, iterations)
    survivors = _at_least(flat, n, threshold)
    candidates = paddle.gather(flat, survivors)
    _check_finite(candidates, name)
    enough = paddle.shape(survivors)[0] >= k
    if paddle.in_dynamic_mode():
        return _trim(candidates, survivors, k) if bool(enough) else _exact(flat, k)
    return paddle.static.nn.cond(enough, lambda: _trim(candidates, survivors, k), lambda: _exact(flat, k))


def _takes_kernel(flat, implementation):
    if implementation == "ops":
        return False
    if implementation == "kernel":
        error = mstopk_kernel.load_error()
        if error is not None:
            raise RuntimeError(f"implementation='kernel': the compiled MSTopK kernel is not available: {error}; "
                               "use implementation='ops' or 'auto'")
        return True
    on_cpu = flat.place.is_cpu_place() if paddle.in_dynamic_mode() else paddle.device.get_device() == "cpu"
    return on_cpu and mstopk_kernel.load_error() is None


def sampled_threshold(flat, stride, target, iterations):
    """Where the paper's bisection of mean + r * (max - mean) on the sample a = |every stride-th
    element of flat| ends after `iterations` steps: the lower end of its final bracket, the
    largest point of the grid base + j * (max - base) / 2**iterations (j = 0 .. 2**iterations)
    that still leaves `target` sample elements >= it. base is mean(a), or 0 when fewer than
    `target` elements reach the mean.

    Computed in closed form from v, the target-th largest element of a (a partial sort of the
    sample): the bracket's lower end is the grid point at or below v. Stepping the bisection
    costs ~10 tiny ops per step, and a static program pays the executor's per-op overhead for
    each; this costs ~15 ops whatever the steps. `target` is an int, or a tensor (a sort then).
    """
    sample = flat if stride == 1 else paddle.strided_slice(flat, [0], [0], [flat.shape[0]], [stride])
    sample = paddle.abs(sample)
    if isinstance(target, int):
        kth = paddle.topk(sample, target)[0][target - 1]
    else:
        kth = paddle.gather(paddle.sort(sample, descending=True), paddle.reshape(target - 1, [1]))[0]
    high, mean = paddle.max(sample), paddle.mean(sample)
    base = paddle.where(kth >= mean, mean, paddle.zeros_like(mean))
    span = high - base
    steps = float(2 ** iterations)
    grid = base + paddle.floor((kth - base) / span * steps) * (span / steps)
    return paddle.where(span > 0, paddle.minimum(grid, kth), kth)


def _at_least(flat, n, threshold):
    """int64 indices of the elements with |x| >= threshold (and of every inf and NaN), one pass.

    trunc(x * (1 / threshold)) is 0 exactly for |x| < threshold; an overflow or NaN converts to
    INT_MIN, never 0. A zero threshold makes 1/threshold inf and selects everything.
    """
    inverse = paddle.reciprocal(threshold)
    found = []
    for start in range(0, n, CHUNK):
        chunk = paddle.slice(flat, [0], [start], [min(n, start + CHUNK)])
        marked = paddle.nonzero(paddle.cast(paddle.scale(chunk, inverse), "int32"))
        found.append(marked + start if start else marked)
    return paddle.reshape(found[0] if len(found) == 1 else paddle.concat(found), [-1])


def _trim(candidates, survivors, k):
    _, best = paddle.topk(paddle.abs(candidates), k)
    return paddle.gather(candidates, best), paddle.gather(survivors, best)


def _check_finite(candidates, name):
    finite = paddle.all(paddle.isfinite(candidates))
    if paddle.in_dynamic_mode():
        if not bool(finite):
            raise FloatingPointError(f"top-k selection of {name}: it holds inf or NaN; gradients must be finite")
        return
    # pd_op.assert names only its condition variable in the error, so that name says what failed.
    flag = create_persistable_value("bool", [], paddle.utils.unique_name.generate(f"top-k of {name} is finite"),
                                    initializer=paddle.nn.initializer.Constant(1))
    paddle.static.nn.control_flow.Assert(paddle.assign(finite, output=flag))


def _prime_at_most(value):
    for candidate in range(value, 1, -1):
        if all(candidate % d for d in range(2, int(math.isqrt(candidate)) + 1)):
            return candidate
    return 2
