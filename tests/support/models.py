"""The small models of the compiler tests, on scikit-learn's digits (8x8 images, 10 classes).

`loss(x, y, shards)` splits the batch into `shards` equal parts and averages their losses:
with batch norm, N ranks normalise over their own shard, so the one-process oracle must
normalise over the same shards to compute the same function (without batch norm the
split changes nothing). `compiled_program` builds one for the structural tests;
`with_raw_gradients` builds a wider MLP with the plain-backward twin the exchange workers read.
"""
import paddle
from sklearn.datasets import load_digits

from fleetlite.compile import program_edit
from fleetlite.runtime import training_program

MODELS = ("mlp", "convbn")


def digits(rows):
    data = load_digits()
    x = (data.data[:rows] / 16.0).astype("float32")
    y = data.target[:rows].astype("int64").reshape(-1, 1)
    return x, y


class Mlp(paddle.nn.Layer):
    def __init__(self, hidden_weight_attr=None):
        super().__init__()
        self.hidden = paddle.nn.Linear(64, 32, weight_attr=hidden_weight_attr)
        self.out = paddle.nn.Linear(32, 10)

    def forward(self, x):
        return self.out(paddle.nn.functional.relu(self.hidden(x)))


class ConvBn(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(1, 4, 3, padding=1)
        self.norm = paddle.nn.BatchNorm2D(4)
        self.out = paddle.nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        h = paddle.nn.functional.relu(self.norm(self.conv(paddle.reshape(x, [-1, 1, 8, 8]))))
        return self.out(paddle.flatten(paddle.nn.functional.max_pool2d(h, 2), 1))


def loss(model_name, x, y, shards):
    model = Mlp() if model_name == "mlp" else ConvBn()
    parts = [paddle.nn.functional.cross_entropy(model(xs), ys)
             for xs, ys in zip(paddle.split(x, shards), paddle.split(y, shards))]
    return paddle.add_n(parts) / shards if shards > 1 else parts[0]


def compiled_program(strategy, topology, model_name="mlp", rows=8, optimizer=None, timeline=False):
    """`model_name`'s training program compiled in this process for any rank of any job (with the
    step timeline's timestamp ops if `timeline`).

    Returns (main, startup, training_program.DataParallelProgram); nothing runs.
    """
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        built = training_program.build(loss(model_name, x, y, 1), optimizer or paddle.optimizer.SGD(0.1),
                                       strategy, topology, startup, timeline=timeline)
    return main, startup, built


def wide_mlp_loss(x, y, hidden):
    """64 -> hidden -> 10: with 300 hidden units the first weight (19,200 elements) is large
    enough for MSTopK's sampled path and for dgc (>= 16,384)."""
    activations = paddle.nn.functional.relu(paddle.nn.Linear(64, hidden)(x))
    return paddle.nn.functional.cross_entropy(paddle.nn.Linear(hidden, 10)(activations), y)


def with_raw_gradients(strategy, topology, make_optimizer, rows, hidden):
    """The wide MLP's training program compiled for `strategy`, and beside it the same model with
    plain backward (same parameter names), whose gradients run on the same scope and batch just
    before a training step are exactly what backward computes inside the compiled program.

    Returns (main, startup, loss, training_program.DataParallelProgram, plain program, {param: raw grad}).
    """
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = wide_mlp_loss(x, y, hidden)
        built = training_program.build(loss, make_optimizer(), strategy, topology, startup)
    plain, plain_startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(plain, plain_startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        raw = paddle.static.append_backward(wide_mlp_loss(x, y, hidden))
    return main, startup, loss, built, plain, {p.name: g for p, g in raw}


def backward_program():
    """(main, startup, params_grads) of the MLP after plain backward: the program compile rewrites."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 64], "float32")
        y = paddle.static.data("y", [8, 1], "int64")
        params_grads = paddle.optimizer.SGD(0.1).backward(loss("mlp", x, y, 1))
    return main, startup, params_grads


def sequence(main, pass_name):
    """The ops `pass_name` created that are still in the program, compactly named."""
    names = []
    for op in program_edit.created_by(main.global_block(), pass_name):
        name = op.name().replace("pd_op.", "")
        ring = program_edit.int_attr(op, "ring_id")
        names.append(name if ring is None else f"{name}(ring={ring})")
    return names
