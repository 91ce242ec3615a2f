"""`fleet.train_step(model, loss_fn, opt)`: an eager model trained by fleetlite's compiled program.

    step = fleet.train_step(model, loss_fn, opt)   # opt from fleet.distributed_optimizer
    loss = step(x, y)                              # NumPy arrays or Tensors; one Executor run

The first call traces `loss_fn(model, *batch)` into a PIR program (traced_loss), compiles it with
the distributed optimizer's unchanged `minimize` (every knob, the same passes and compile
report as static scripts), runs its startup program for the optimizer's state only, and lets
every parameter variable of the program's scope share its buffer with the eager parameter
(and batch-norm statistic): the program updates the eager model in place, so eager
evaluation, `state_dict` and `paddle.save` see the trained values with no copy. Rank 0's
initial values are then broadcast, eagerly, to every rank. Each call feeds the batch, runs one
compiled step and returns the loss as a Tensor (`set_state_dict` writes into the shared buffers,
so what it loads is what trains next). Paddle's own `paddle.distributed.to_static`/`DistModel` works this way.
"""
from dataclasses import dataclass
from typing import Any, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from fleetlite.compile import bucket_views, program_edit
from fleetlite.runtime import process_group, sharded_state
from fleetlite.errors import CompileError, DygraphError
from fleetlite.paddle_compat import static_execution
from fleetlite.runtime import optimizer_state, traced_loss

_MODEL_INITIALISERS = ("builtin.set_parameter", "pd_op.full", "pd_op.broadcast_")


@dataclass
class _Compiled:
    signature: Tuple
    program: Any           # the compiled PIR main program
    loss: Any              # its loss value
    feeds: Tuple[str, ...]
    scope: Any
    executor: Any


class TrainStep:
    """One compiled training step of an eager `model`; see the module docstring."""

    def __init__(self, model, loss_fn, optimizer, job_values):
        if not isinstance(model, paddle.nn.Layer):
            raise DygraphError(f"fleet.train_step needs a paddle.nn.Layer as its model, got a {type(model).__name__}")
        if not callable(loss_fn):
            raise DygraphError("fleet.train_step needs loss_fn(model, *batch) -> scalar loss as its second argument")
        parameters = optimizer.inner_opt._parameter_list
        if not parameters:
            raise DygraphError("fleet.train_step needs an optimizer built with parameters=model.parameters()")
        if any(isinstance(group, dict) for group in parameters):
            raise DygraphError("fleet.train_step does not support parameter groups (parameters=[{...}, ...]) with "
                               "their own settings: pass one list of parameters to the optimizer")
        self._model = model._layers if isinstance(model, paddle.DataParallel) else model
        self._loss_fn = loss_fn
        self._optimizer = optimizer
        self._job_values = job_values
        self._compiled = None

    def __call__(self, *batch):
        if not paddle.in_dynamic_mode():
            raise DygraphError("fleet.train_step runs dygraph scripts: call it in dynamic mode (static programs "
                               "train with fleet.distributed_optimizer(opt).minimize(loss) and an Executor)")
        signature = traced_loss.signature(batch)
        if self._compiled is None:
            self._compiled = self._compile(signature)
        elif signature != self._compiled.signature:
            raise DygraphError(f"fleet.train_step was compiled for inputs {traced_loss.describe(self._compiled.signature)} "
                               f"and got {traced_loss.describe(signature)}: only the batch dimension may change; "
                               f"pad or resize the inputs to the first batch's shape")
        return self._run(self._compiled, batch)

    def _compile(self, signature):
        traced = traced_loss.trace(self._model, self._loss_fn, signature)
        main, startup, (loss,) = traced.main_program, traced.startup_program, traced.outputs
        eager, values = traced.parameters
        trained = {param.name for param in self._optimizer.inner_opt._parameter_list if not param.stop_gradient}
        with static_execution.eager_parameters_hidden(self._optimizer.inner_opt), static_execution.static_mode(), \
                paddle.static.program_guard(main, startup):
            self._optimizer.minimize(loss, startup, [value for value in values if value.name in trained])
        model_names = {param.name for param in eager}
        _drop_initialisers(startup, model_names)
        scope = paddle.static.Scope()
        executor = paddle.static.Executor(paddle.framework._current_expected_place())
        with static_execution.static_mode(scope):
            executor.run(startup, scope=scope)
        learning_rate = self._optimizer.inner_opt._learning_rate_map.get(main)   # configuration, not state
        not_state = model_names | {learning_rate.name} if learning_rate is not None else model_names
        state_names = [name for name in _initialised(startup)
                       if name not in not_state and not bucket_views.is_bucket_variable(name)]
        structured = {param.name: key for key, param in self._model.state_dict().items()}
        self._optimizer.compiled_state.bind(scope, optimizer_state.state_keys(state_names, structured),
                                            self._gathered_others(scope))
        for param in eager:
            scope.var(param.name).get_tensor()._share_data_with(param.get_tensor())
        self._broadcast_from_rank_0(eager)
        executor = self._optimizer.prepare_executor(executor)
        return _Compiled(signature, main, loss, traced_loss.input_names(signature), scope, executor)

    def _gathered_others(self, scope):
        owners = sharded_state.state_owners(self._optimizer.compile_report)
        if owners is None:
            return None
        rank = self._optimizer.topology.rank
        return lambda: sharded_state.gather(self._job_values, owners, rank, scope)

    def _broadcast_from_rank_0(self, tensors):
        if self._optimizer.topology.world_size > 1 and process_group.is_up():
            with paddle.no_grad():
                for tensor in tensors:
                    dist.broadcast(tensor, src=0)

    def _run(self, compiled, batch):
        feed = {name: value.numpy() if isinstance(value, paddle.Tensor) else value
                for name, value in zip(compiled.feeds, batch)}
        with static_execution.static_mode(compiled.scope):
            loss, = compiled.executor.run(compiled.program, feed=feed, fetch_list=[compiled.loss],
                                          scope=compiled.scope)
        return paddle.to_tensor(np.asarray(loss))


def _initialised(startup):
    """Names of the persistable variables `startup` initialises."""
    names = []
    for op in startup.global_block().ops:
        if op.name() == "builtin.set_parameter":
            names.append(op.attrs()["parameter_name"])
        elif op.name() == "builtin.shadow_output":
            names.append(op.attrs()["output_name"])
    return names


def _drop_initialisers(startup, model_names):
    """Remove the startup ops that would set the model's parameters (to_static's placeholder
    zeros and the compiler's broadcast of them): the eager values are shared and broadcast instead."""
    block = startup.global_block()
    doomed = {}
    for op in block.ops:
        if op.name() == "builtin.set_parameter" and op.attrs()["parameter_name"] in model_names:
            placeholder = op.operand_source(0).get_defining_op()
            for user in [placeholder, *placeholder.result(0).all_used_ops()]:
                if user.name() not in _MODEL_INITIALISERS:
                    raise CompileError(f"the startup program reads {op.attrs()['parameter_name']}'s initial "
                                       f"value in {user.name()}, which fleet.train_step does not expect")
                doomed[user.id()] = user
    program_edit.remove_ops(block, list(doomed.values()))
