"""The worker's entry point: `python -u -m fleetlite.launcher.bootstrap script.py args...`.

It runs the user's unchanged script as `__main__` and adds what the launcher needs:
- the worker dies with its fleetrun, even a SIGKILLed one (PR_SET_PDEATHSIG);
- an uncaught exception goes to the error file as well as to stderr, so the failure report can
  show the traceback once without parsing logs (with the fix, for names Paddle 3 removed and
  fleetlite replaces);
- every `Executor.run` and `Tensor.backward` entered bumps the progress file, so a collective
  timeout can name the ranks that were behind; the fleet-level collective the worker waits in
  goes there too (fleetlite.runtime.collective_waits), so fleetrun sees ranks stuck in different ones;
- a run of a program fleetlite compiled is a training step: it is timed (step_records, two clock
  reads), its samples counted, and what the script reports (fleet.report_progress) kept, for
  fleetrun's live progress line and its end-of-job summary; the step records are written when
  the script ends;
- SIGTERM (fleetrun stopping the job) ends the worker quietly, not with Paddle's crash report;
- ranks on the store's host other than rank 0 wait until the store listens before they connect:
  Paddle's store client retries only every 3 s, so connecting early costs seconds;
- Paddle's start-up messages that are no user's business stay out of the log (paddle_noise).
The Paddle hooks are installed the moment the script imports paddle; a script that never does
pays nothing for them.
"""
import contextlib
import ctypes
import functools
import importlib.abc
import importlib.util
import ipaddress
import os
import runpy
import signal
import sys
import traceback

from fleetlite.errors import ScriptDone
from fleetlite.interprocess import tcp_ports
from fleetlite.launcher import step_records, worker_records
from fleetlite.paddle_compat import quiet_warnings as paddle_noise
from fleetlite.paddle_compat import removed_names, termination
from fleetlite.runtime import collective_waits, training_steps
from fleetlite.topology import env_contract

PR_SET_PDEATHSIG = 1
STORE_WAIT_S = 60  # then connect anyway and let Paddle's own retries and errors speak


def die_with_launcher(environ):
    """Ask the kernel to SIGKILL this worker when its fleetrun dies. False if it already has."""
    launcher = environ.get(env_contract.LAUNCHER_PID)
    if not launcher:
        return True
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == int(launcher)  # it may have died before prctl took effect


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` right after module `name` is first imported; the module itself runs
    inside the context manager `around()`."""

    def __init__(self, name, callback, around=contextlib.nullcontext):
        self.name, self.callback, self.around = name, callback, around

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def execute_then_call_back(module):
            with self.around():
                execute(module)
            self.callback(module)

        spec.loader.exec_module = execute_then_call_back
        return spec


def _count_entries(owner, name, progress):
    original = getattr(owner, name)

    @functools.wraps(original)
    def counted(*args, **kwargs):
        progress.enter_step()
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def _batch_size(feed):
    """Rows of the first fed array (0 when there is none to count)."""
    try:
        return len(next(iter(feed.values())))
    except (AttributeError, StopIteration, TypeError):
        return 0


def _time_training_steps(executor_class, progress, recorder, default_program):
    """Executor.run bumps the progress record; a run of a compiled program is a timed training step."""
    original = executor_class.run

    @functools.wraps(original)
    def run(executor, *args, **kwargs):
        program = kwargs["program"] if "program" in kwargs else (args[0] if args else None)
        if program is None and training_steps.any_compiled():
            program = default_program()
        if not training_steps.is_compiled(program):
            progress.enter_step()
            return original(executor, *args, **kwargs)
        progress.enter_step(_batch_size(kwargs["feed"] if "feed" in kwargs else (args[1] if len(args) > 1 else None)))
        recorder.begin()
        try:
            return original(executor, *args, **kwargs)
        finally:
            recorder.end(training_steps.step_events(program))

    executor_class.run = run


def _store_is_on_this_host(environ):
    master_host = environ[env_contract.MASTER].rpartition(":")[0]
    my_host = environ[env_contract.CURRENT_ENDPOINT].rpartition(":")[0]
    try:
        return master_host == my_host or ipaddress.ip_address(master_host).is_loopback
    except ValueError:
        return False


def _wait_for_store_first(distributed, port):
    original = distributed.init_parallel_env

    @functools.wraps(original)
    def init_parallel_env(*args, **kwargs):
        if not distributed.is_initialized():   # after fleet.init the store no longer listens
            tcp_ports.wait_until_listening(port, STORE_WAIT_S)
        return original(*args, **kwargs)

    distributed.init_parallel_env = init_parallel_env
    distributed.parallel.init_parallel_env = init_parallel_env


def instrument_paddle(paddle, environ, recorder):
    termination.quiet_sigterm()
    paddle_noise.spend_the_out_tensor_line(paddle)
    progress_file = environ.get(env_contract.PROGRESS_FILE)
    if progress_file:
        progress = worker_records.ProgressWriter(progress_file)
        _time_training_steps(paddle.static.Executor, progress, recorder, paddle.static.default_main_program)
        _count_entries(paddle.Tensor, "backward", progress)
        collective_waits.listen(progress)
        training_steps.listen(progress)
    if (environ.get(env_contract.TRAINER_ID, "0") != "0" and env_contract.MASTER in environ
            and env_contract.CURRENT_ENDPOINT in environ and _store_is_on_this_host(environ)):
        _wait_for_store_first(paddle.distributed, int(environ[env_contract.MASTER].rpartition(":")[2]))


def _traceback_from(script, exc):
    """The traceback without the frames of this bootstrap and runpy (from the script's first frame)."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_frame.f_code.co_filename != script:
        frame = frame.tb_next
    return "".join(traceback.format_exception(type(exc), exc, frame or exc.__traceback__))


def with_fix(exc, text):
    """`text` (exc's traceback) plus the fix fleetlite knows for exc, if any."""
    fix = removed_names.fix_for(exc)
    return f"{text}{fix}\n" if fix else text


def main(argv=None, environ=os.environ):
    script, *args = sys.argv[1:] if argv is None else argv
    if not die_with_launcher(environ):
        return 1
    recorder = step_records.StepRecorder(int(environ.get(env_contract.TRAINER_ID, "0")),
                                         timeline=environ.get(env_contract.STEP_EVENTS) == "1")
    sys.meta_path.insert(0, _AfterImport("paddle", lambda paddle: instrument_paddle(paddle, environ, recorder),
                                         around=paddle_noise.importing_paddle))
    script = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
    except ScriptDone:
        return 0
    except Exception as exc:
        text = with_fix(exc, _traceback_from(script, exc))
        sys.stderr.write(text)
        if environ.get(env_contract.ERROR_FILE):
            worker_records.write_error(environ[env_contract.ERROR_FILE], exc, text)
        return 1
    finally:
        if environ.get(env_contract.STEPS_FILE) and recorder.record.step_s:
            step_records.write_steps(environ[env_contract.STEPS_FILE], recorder.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
