"""`DistributedOptimizer`: the user's optimizer plus the data-parallel rewrite of its program.

`minimize` is backward -> compile -> apply_gradients (training_program.build), then what the
job needs before the first step: NCCL rings on GPUs, the flags the passes ask for. Under
`fleetrun --explain` (FLEETLITE_EXPLAIN_ONLY=1) it prints the compile report and ends the
script instead (ScriptDone). `fleet.distributed_optimizer` in api.py builds it.
"""
import os

import paddle

from fleetlite.errors import FleetliteError, ScriptDone
from fleetlite.runtime import eager_data_parallel, process_group, steps_per_run, training_program
from fleetlite.runtime.optimizer_state import CompiledOptimizerState
from fleetlite.topology.env_contract import EXPLAIN_ONLY


def explain_only():
    """True in the one process `fleetrun --explain` runs: compile and report, train nothing."""
    return os.environ.get(EXPLAIN_ONLY) == "1"


class DistributedOptimizer:
    """The inner optimizer plus the data-parallel rewrite; other attributes pass through."""

    def __init__(self, optimizer, strategy, topology, after_minimize=None):
        self.inner_opt = optimizer
        self.after_minimize = after_minimize    # f(program, params_grads, strategy, topology), e.g. a trial's timer
        self.user_defined_strategy = strategy
        self.topology = topology
        self.compile_report = None
        self._program = None        # the training program minimize() built
        self.compiled_state = CompiledOptimizerState(optimizer)   # what fleet.train_step's program holds
        self._eager_step_checked = False

    def __getattr__(self, name):
        if name == "inner_opt":          # not set yet (e.g. during copy): do not recurse
            raise AttributeError(name)
        return getattr(self.inner_opt, name)

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        if paddle.in_dynamic_mode():      # the eager loop's minimize: an optimizer step on the gradients
            self._check_eager_step()
            return self.inner_opt.minimize(loss, startup_program, parameter_list, no_grad_set)
        built = training_program.build(loss, self.inner_opt, self.user_defined_strategy, self.topology,
                                       startup_program, parameter_list, no_grad_set)
        self.compile_report = built.report
        if explain_only():
            print(built.report.table(), flush=True)
            raise ScriptDone("fleetrun --explain: the compile report is printed")
        if self.topology.device == "gpu" and self.topology.world_size > 1:
            process_group.connect("minimize (its NCCL rings)")
            process_group.create_nccl_rings(built.report.rings, self.topology)
        if built.report.runtime_flags:
            paddle.set_flags(built.report.runtime_flags)
        self._program = loss.block.program
        if self.after_minimize is not None:
            self.after_minimize(self._program, built.params_grads, self.user_defined_strategy, self.topology)
        if self.topology.rank == 0:
            print(built.report.table(), flush=True)
        return built.optimize_ops, built.params_grads

    def step(self):
        """Fleet's eager loop (loss.backward(); opt.step()), data parallel through distributed_model."""
        self._check_eager_step()
        return self.inner_opt.step()

    def _check_eager_step(self):
        """Refuse what the eager loop cannot do (checked at the first step: the strategy and the
        parameters do not change); under `fleetrun --explain`, say what it does and end the script."""
        if self._eager_step_checked:
            return
        explain = explain_only()
        eager_data_parallel.check_step(self.inner_opt, self.user_defined_strategy, self.topology,
                                       wrapped_only=not explain)
        if explain:
            print(eager_data_parallel.EXPLAINED, flush=True)
            raise ScriptDone("fleetrun --explain: the eager loop has nothing to compile")
        self._eager_step_checked = True

    def state_dict(self):
        """The optimizer's state; in a script trained by fleet.train_step, its compiled program's."""
        return self.compiled_state.state_dict() if self.compiled_state.bound else self.inner_opt.state_dict()

    def set_state_dict(self, state_dict):
        """Load `state_dict`; in a dygraph script it is also what fleet.train_step's program starts from."""
        if paddle.in_dynamic_mode():
            self.compiled_state.set_state_dict(state_dict)
        if not self.compiled_state.bound:
            self.inner_opt.set_state_dict(state_dict)

    def prepare_executor(self, executor):
        """Set up `executor` for the program `minimize` built; returns it.

        With `execution_strategy.num_iteration_per_run` N > 1, each `executor.run` of that program
        then takes N batches stacked along axis 0, runs N steps and fetches N values per target
        (see steps_per_run; run the startup program before, or with another executor).
        """
        if self._program is None:
            raise FleetliteError("prepare_executor() needs the program minimize() builds: call minimize() first")
        steps = self.user_defined_strategy.execution_strategy.num_iteration_per_run
        return steps_per_run.install(executor, self._program, steps) if steps > 1 else executor
