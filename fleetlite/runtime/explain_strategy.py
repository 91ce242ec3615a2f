"""`fleetlite explain`: the compile report of a strategy for any topology, in one process.

Builds a stand-in training program (a small MLP, or ResNet-50 for realistic bucket sizes:
161 gradients, 97.5 MiB), compiles it for the rank of the job given on the command line
(`Topology.grid`) and returns the report. Nothing runs: no process group, no executor.
"""
import paddle

from fleetlite.runtime import training_program

MODELS = ("mlp", "resnet50")


def _mlp_loss():
    x = paddle.static.data("x", [8, 64], "float32")
    label = paddle.static.data("label", [8, 1], "int64")
    hidden = paddle.nn.functional.relu(paddle.nn.Linear(64, 128)(x))
    return paddle.nn.functional.cross_entropy(paddle.nn.Linear(128, 10)(hidden), label)


def _resnet50_loss():
    image = paddle.static.data("image", [2, 3, 32, 32], "float32")   # parameter shapes do not depend on it
    label = paddle.static.data("label", [2, 1], "int64")
    return paddle.nn.functional.cross_entropy(paddle.vision.models.resnet50()(image), label)


def explain(strategy, topology, model="mlp"):
    """The CompileReport of `model` trained with Momentum under `strategy` on `topology` (with Adam
    under lamb, which rewrites an Adam update)."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        loss = _mlp_loss() if model == "mlp" else _resnet50_loss()
        optimizer = paddle.optimizer.Adam(0.001) if strategy.lamb else paddle.optimizer.Momentum(0.1, momentum=0.9)
        return training_program.build(loss, optimizer, strategy, topology, startup).report
