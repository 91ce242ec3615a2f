"""The executor knobs that survive in Paddle 3, and what each becomes.

Paddle 3 removed ExecutionStrategy; its PIR interpreter is configured by process-wide flags:
- `execution_strategy.num_threads`: 1 -> FLAGS_new_executor_serial_run (ops run one at a time,
  on the calling thread); more -> the interpreter's concurrent mode, whose pool Paddle sizes
  itself (4 host threads on CPU), so the number is not a pool size any more. Math-library
  threads are not touched: they follow OMP_NUM_THREADS (fleetrun sets 1 when workers share a
  host) or `paddle.set_num_threads`.
- `build_strategy.enable_sequential_execution` -> FLAGS_new_executor_sequential_run (ops run
  in program order).
- `build_strategy.enable_inplace` -> FLAGS_pir_apply_inplace_pass (Paddle's in-place buffer
  reuse when it lowers the program; on by default in Paddle 3, so `false` is the value that
  changes something).
- `execution_strategy.num_iteration_per_run` -> N training steps per executor call, through a
  core.Plan of N micro-batch jobs (see fleetlite/runtime/steps_per_run.py), installed by
  `DistributedOptimizer.prepare_executor`.
`num_iteration_per_drop_scope` and `use_thread_barrier` have no Paddle 3 equivalent; the
compile report says so (knob accounting).
"""
from fleetlite.compile.pass_contract import Pass, PassResult, Phase
from fleetlite.strategies.flag_knob import FlagKnob

POOL = "Paddle sizes the interpreter's pool itself (4 host threads on CPU)"


class ExecutorThreads(FlagKnob):
    name = "execution_strategy.num_threads"
    flag = "FLAGS_new_executor_serial_run"

    def flag_value(self):
        return self.strategy.execution_strategy.num_threads == 1

    def explain(self, value):
        if value:
            return f"{self.flag} = True: ops run one at a time on the calling thread"
        threads = self.strategy.execution_strategy.num_threads
        return f"{self.flag} = False: ops run concurrently; {POOL}, so {threads} is not a pool size"


class SequentialExecution(FlagKnob):
    name = "build_strategy.enable_sequential_execution"
    flag = "FLAGS_new_executor_sequential_run"


class InplaceReuse(FlagKnob):
    name = "build_strategy.enable_inplace"
    flag = "FLAGS_pir_apply_inplace_pass"


class StepsPerRun(Pass):
    name = "execution_strategy.num_iteration_per_run"
    phase = Phase.EXECUTION
    reads = ("execution_strategy.num_iteration_per_run",)

    def enabled(self):
        return self.strategy.execution_strategy.num_iteration_per_run > 1

    def apply(self, context):
        steps = self.strategy.execution_strategy.num_iteration_per_run
        return PassResult(f"{steps} steps per executor call (a core.Plan of {steps} micro-batch jobs, installed by "
                          f"optimizer.prepare_executor(exe)): feed {steps} batches stacked on axis 0",
                          {"steps_per_run": steps})
