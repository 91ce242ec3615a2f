"""Run chosen ops of a built PIR forward in a low-precision dtype, with casts at the edges.

Paddle 3 inserts AMP casts while ops are built (`paddle.amp.auto_cast`); nothing recasts a
forward that was built in float32, which is what a Fleet script hands to `minimize`. This
module does it before backward exists, so backward differentiates the casts (each `cast` has
a gradient that casts back): a low op gets its float32 operands cast once per value and its
float results retyped; a float32 op that reads a low value gets it cast back, once per value.
Parameters stay float32 and are cast where they are used, so they remain the master copy the
optimizer updates.

Which ops run low is the caller's decision (`cast_forward(..., runs_low)`); what can be
retyped is decided here: ops that set their own dtype (`cast`, `full`, ...), builtin and
control-flow ops, and ops with non-tensor float results are left as they are.

bfloat16 on CPU runs on oneDNN kernels, and two of Paddle 3.3.1's oneDNN bfloat16 gradient
kernels write every gradient without checking that backward asked for it: `MatmulGradKernel`
(paddle/phi/kernels/onednn/matmul_grad_kernel.cc) and `PReluGradKernel`. A bfloat16 matmul whose
operand needs no gradient (the input batch, a frozen weight) gets a null output and the process
dies with SIGSEGV in `DenseTensor::operator=`. `ask_for_every_gradient` routes around it before
backward; `missing_gradients` finds any case left after it (an operand in the user's no_grad_set).
"""
import contextlib
import sys

import paddle

from fleetlite.compile import program_edit

FLOAT32 = paddle.float32
FP16_GUARD = "fleetlite_fp16_guard"   # attribute of the ops built under fp16_guard()


@contextlib.contextmanager
def fp16_guard():
    """Mark the ops built inside as the only ones O2 AMP may run in low precision (with
    amp_configs.use_fp16_guard). Paddle 3's paddle.static.amp.fp16_guard leaves no mark on PIR
    ops, so fleetlite cannot see it."""
    block = paddle.static.default_main_program().global_block()
    existing = {op.id() for op in block.ops}
    yield
    for op in block.ops:
        if op.id() not in existing:
            op.set_bool_attr(FP16_GUARD, True)


_explaining = []        # non-empty while a job is explained rather than run here
_warned = set()


@contextlib.contextmanager
def explaining():
    """While a job is explained (`fleetlite explain`, `fleetrun --explain`) it may run on other
    machines: what this CPU lacks is then a warning, not a refusal (see lacks_on_this_cpu)."""
    _explaining.append(True)
    try:
        yield
    finally:
        _explaining.pop()


def explain_for_the_rest_of_the_process():
    """`fleetrun --explain`'s worker only explains, from fleet.init to the report: explaining() for good."""
    _explaining.append(True)


def lacks_on_this_cpu(error):
    """Raise `error` (a capability of this CPU the job needs), or under explaining() print it once
    to stderr as a warning: the explained job may run on CPUs that have it."""
    if not _explaining:
        raise error
    if str(error) not in _warned:
        _warned.add(str(error))
        print(f"fleetlite: warning: {error} (this machine only explains the job; it refuses to train it)",
              file=sys.stderr, flush=True)


def without_cpu_float16(names):
    """Of these op names (PIR, without dialect), those this Paddle runs on CPU but not in float16
    (forward or gradient kernel): Paddle refuses to build the backward of such a float16 op
    (`TypeError: (InvalidType) ... matmul_grad ... float16`). Read from Paddle's kernel registry, so
    a later Paddle with float16 CPU kernels is refused nothing."""
    kernels = paddle.base.core._get_registered_phi_kernels("function")

    def on_cpu(kernel, dtype=""):
        return any(key.startswith("(CPU") and key.endswith(f"{dtype})") for key in kernels.get(kernel, ()))

    return sorted({name for name in names if any(on_cpu(kernel) and not on_cpu(kernel, " float16")
                                                 for kernel in (name, f"{name}_grad"))})


def cpu_has_bfloat16():
    """Whether this CPU runs Paddle's bfloat16 kernels: they are oneDNN's, which need AVX512-BF16
    (on an AVX2-only CPU a bfloat16 program builds, then its first run dies in oneDNN). A function
    of its own so tests can stand for either kind of CPU."""
    return paddle.base.core.supports_bfloat16()


def name_of(op):
    """The op's name without its dialect, e.g. 'matmul' for pd_op.matmul."""
    return op.name().split(".", 1)[-1]


def _retypable(op):
    """Whether an op's results can simply be retyped to the low dtype."""
    return (op.name().startswith("pd_op.") and not op.has_attr("dtype") and op.num_regions() == 0
            and any(_is_float(source) for source in op.operands_source())
            and all(result.is_dense_tensor_type() for result in op.results() if result.initialized()))


def float_operands(op):
    return [source for source in op.operands_source() if _is_float(source)]


def cast_forward(context, ops, low_dtype, runs_low):
    """Retype every op of `ops` (program order) for which `runs_low(op, is_low)` is true to
    `low_dtype`, where `is_low(value)` says whether a value is low at that point. Returns the
    ops made low and the number of casts inserted."""
    to_low, to_float32 = {}, {}        # value key -> its cast
    low_ops, casts = [], 0

    def is_low(value):
        return _dtype(value) == low_dtype

    def cast(op, value, dtype, cache):
        nonlocal casts
        if program_edit.key(value) not in cache:
            with context.edit(before=op):
                cache[program_edit.key(value)] = paddle.cast(value, dtype)
            casts += 1
        return cache[program_edit.key(value)]

    for op in ops:
        if _retypable(op) and runs_low(op, is_low):
            for operand in op.operands():
                if _dtype(operand.source()) == FLOAT32:
                    operand.set_source(cast(op, operand.source(), low_dtype, to_low))
            template = next(source for source in float_operands(op) if is_low(source)).type()
            for result in op.results():
                if _dtype(result) == FLOAT32:
                    result.set_type(paddle.pir.create_shaped_type(template, result.shape))
            low_ops.append(op)
        elif not op.has_attr("dtype"):
            for operand in op.operands():
                if is_low(operand.source()):
                    operand.set_source(cast(op, operand.source(), FLOAT32, to_float32))
    return low_ops, casts


UNCHECKED_GRADIENTS = {"matmul": "pd_op.matmul_grad", "prelu": "pd_op.prelu_grad"}   # op: its oneDNN grad op


def ask_for_every_gradient(low_ops):
    """Mark every float operand of the UNCHECKED_GRADIENTS ops among `low_ops` as needing a gradient,
    so backward builds their grad ops with all outputs (one extra product for an operand that
    needs none; its producer is off the path from the parameters, so nothing further is
    differentiated). Returns how many operands were marked."""
    marked = 0
    for op in low_ops:
        if name_of(op) in UNCHECKED_GRADIENTS:
            for source in float_operands(op):
                if source.stop_gradient:
                    source.stop_gradient = False
                    marked += 1
    return marked


def missing_gradients(block, low_dtype):
    """The UNCHECKED_GRADIENTS grad ops of `block` in `low_dtype` that lack a gradient output."""
    return [op for op in block.ops if op.name() in UNCHECKED_GRADIENTS.values()
            and _dtype(op.operand_source(0)) == low_dtype and not all(r.initialized() for r in op.results())]


def _dtype(value):
    """The dtype of a dense tensor value; None for vectors and absent optional operands."""
    return value.dtype if value.initialized() and value.is_dense_tensor_type() else None


def _is_float(value):
    """float32 or a 16-bit float (float64 is left alone: it was asked for on purpose)."""
    return _dtype(value) in (FLOAT32, paddle.float16, paddle.bfloat16)
