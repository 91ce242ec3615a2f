"""Canaries: each workaround in fleetlite/paddle_compat/ is for a problem of the installed Paddle.
Each test shows the problem is still there, without the workaround; once one fails, Paddle fixed
it: delete the workaround and its entry in version_gate.LAST_NEEDED.

Also: the gate itself (a workaround stands aside on a Paddle release after its last needed one),
and a workaround no other test reaches (quiet_sigterm).
"""
import os
import shutil
import signal
import subprocess
import sys
import warnings

import numpy as np
import paddle
import pytest

from fleetlite.paddle_compat import quiet_warnings, removed_names, version_gate


def _installed_release_is_gated(workaround):
    assert version_gate.needed(workaround), (
        f"the installed Paddle is past version_gate.LAST_NEEDED[{workaround!r}]: run this canary on it and "
        f"move the bound, or delete the workaround")


def test_a_workaround_stands_aside_after_its_last_needed_release():
    assert version_gate.needed("ccache warning", {"paddlepaddle": "3.3.1"})
    assert not version_gate.needed("ccache warning", {"paddlepaddle": "3.4.0"})
    assert version_gate.needed("ccache warning", {"paddlepaddle": "0.0.0"})        # a develop build: unknown
    assert version_gate.needed("ccache warning", {})


@pytest.mark.skipif(shutil.which("ccache") is not None, reason="ccache is installed: Paddle has nothing to warn about")
def test_importing_paddle_still_warns_that_ccache_is_missing():
    _installed_release_is_gated("ccache warning")
    run = subprocess.run([sys.executable, "-W", "always", "-c", "import paddle"], capture_output=True, text=True,
                         timeout=120)
    assert quiet_warnings.CCACHE in run.stderr


def test_static_backward_still_asks_the_loss_for_its_place():
    _installed_release_is_gated("place warning")
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with warnings.catch_warnings(record=True) as seen, paddle.static.program_guard(main, startup):
        warnings.simplefilter("always")
        x = paddle.static.data("x", [4, 3], "float32")
        loss = paddle.mean(paddle.nn.Linear(3, 1)(x))
        paddle.optimizer.SGD(0.1).backward(loss)
    assert any(quiet_warnings.PLACE in str(w.message) for w in seen)


def test_a_static_mean_still_logs_the_out_tensor_glog_line():
    _installed_release_is_gated("out tensor glog line")
    script = ("import paddle; paddle.enable_static(); "
              "paddle.mean(paddle.static.data('x', [4, 3], 'float32'))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GLOG_minloglevel": "0"})
    assert quiet_warnings.EMPTY_OUT in run.stderr


def test_clip_grad_by_value_still_cannot_build_a_pir_clip():
    _installed_release_is_gated("PIR value clip")
    with pytest.raises(NotImplementedError):
        paddle.nn.ClipGradByValue(1.0)._pir_clip([])


def _program_with_lr_scheduler():
    """(main, startup, loss) of a linear model trained by SGD with an LRScheduler; builds in static mode."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [4, 3], "float32")
        loss = paddle.mean(paddle.nn.Linear(3, 1)(x))
        paddle.optimizer.SGD(paddle.optimizer.lr.StepDecay(0.1, step_size=1)).minimize(loss)
    return main, startup, loss


def test_the_pir_executor_still_looks_for_the_learning_rate_in_the_global_scope():
    _installed_release_is_gated("LR scheduler in the global scope")
    main, startup, loss = _program_with_lr_scheduler()
    scope, executor = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    executor.run(startup, scope=scope)
    with pytest.raises(RuntimeError, match=r"learning_rate_\d+ is not found in scope"):
        executor.run(main, feed={"x": np.ones((4, 3), "float32")}, fetch_list=[loss], scope=scope)


def test_minimize_in_a_static_program_still_takes_an_eager_optimizers_parameters():
    _installed_release_is_gated("eager parameter list")
    optimizer = paddle.optimizer.SGD(0.1, parameters=paddle.nn.Linear(3, 1).parameters())
    paddle.enable_static()
    with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
        loss = paddle.mean(paddle.nn.Linear(3, 1)(paddle.static.data("x", [4, 3], "float32")))
        with pytest.raises(TypeError, match="Value Wrapper is only support None and pir.Value"):
            optimizer.minimize(loss)


def test_sigterm_still_ends_a_paddle_process_with_a_crash_report():
    _installed_release_is_gated("SIGTERM crash report")
    script = "import os, signal, paddle; os.kill(os.getpid(), signal.SIGTERM)"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "`Termination signal` is detected" in run.stdout + run.stderr   # Paddle prints it to stdout


def test_paddle_static_still_has_no_execution_strategy():
    _installed_release_is_gated("ExecutionStrategy removed")
    with pytest.raises(AttributeError) as removed:
        paddle.static.ExecutionStrategy
    assert removed_names.fix_for(removed.value) is not None


def test_quiet_sigterm_ends_a_paddle_process_without_the_report():
    script = ("import os, signal, paddle; from fleetlite.paddle_compat import termination; "
              "termination.quiet_sigterm(); os.kill(os.getpid(), signal.SIGTERM)")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGTERM
    assert "Termination signal" not in run.stdout + run.stderr


NAMED_PERSISTABLE_IN_A_PLAN = """
import numpy as np, paddle
from fleetlite.compile import bucket_views
from fleetlite.runtime import steps_per_run
paddle.enable_static()
assert bucket_views.load_error() is None
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    gradient = paddle.scale(paddle.static.data("x", [2, 4], "float32"), 2.0)
    buffer = bucket_views.new_buffer("float32", 8)
    if KEEP:
        bucket_views.keep_in_scope(gradient, bucket_views.new_gradient_variable(gradient, "w"))
    (view,) = bucket_views.alias(bucket_views.pack([gradient], buffer, 1.0), [gradient])
    out = paddle.scale(view, 1.0)
paddle.static.Executor(paddle.CPUPlace()).run(startup)
plan = steps_per_run.install(paddle.static.Executor(paddle.CPUPlace()), main, 2)
print(plan.run(main, feed={"x": np.ones((4, 4), "float32")}, fetch_list=[out])[0].sum())
"""


@pytest.mark.parametrize("keep", [True, False])
def test_an_n_step_plan_still_cannot_feed_a_named_persistable_to_a_custom_op(keep):
    """The copy-free buckets' pack over a kept (named persistable) gradient in a 2-step plan: it
    fails (a child process: it may segfault); the same program without keeping the gradient runs."""
    _installed_release_is_gated("N-step plan and named persistable custom-op inputs")
    run = subprocess.run([sys.executable, "-c", NAMED_PERSISTABLE_IN_A_PLAN.replace("KEEP", str(keep))],
                         capture_output=True, text=True, timeout=120)
    assert (run.returncode != 0) == keep, run.stdout[-2000:] + run.stderr[-2000:]
    if not keep:
        assert run.stdout.split()[-1] == "32.0"


# One process, one gloo communicator registered as ring 5 (a group of 1): a static program whose
# second all-reduce names ring 9, which nobody registered, still runs (on ring 5's communicator).
RING_ID_IGNORED = """
import socket
import numpy as np
import paddle
from paddle.base import core
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); port = listener.getsockname()[1]; listener.close()
core.CommContextManager.create_gloo_comm_context(core.TCPStore("127.0.0.1", port, True, 1, 30), "5", 0, 1)
paddle.enable_static()
main = paddle.static.Program()
with paddle.static.program_guard(main):
    x = paddle.static.data("x", [2], "float32")
    y = paddle._C_ops.all_reduce(paddle._C_ops.all_reduce(x, 5, 0), 9, 0)
print(paddle.static.Executor(paddle.CPUPlace()).run(main, feed={"x": np.ones(2, "float32")}, fetch_list=[y])[0].sum())
"""


def test_cpu_collectives_still_ignore_their_ring_id():
    _installed_release_is_gated("CPU collectives ignore ring_id")
    run = subprocess.run([sys.executable, "-c", RING_ID_IGNORED], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split()[-1] == "2.0", run.stdout[-2000:] + run.stderr[-2000:]
