"""Rewrite a single-process training program into its data-parallel form (no processes touched).

`build` is what `DistributedOptimizer.minimize` and `fleetlite explain` share: compile (its
forward passes, backward, the rest, and the inner optimizer's `apply_gradients` on the reduced
gradients before the passes that rewrite the update), then the startup program broadcasts every
parameter from rank 0, so ranks start identical whatever their seeds. The optimizer's gradient
clip and weight decay are part of `apply_gradients`, so they read the reduced gradients: a
global norm is the norm of the averaged gradient, as in one process (`gradient_clip` builds the
clip Paddle cannot build in PIR). Ops carry Paddle's op roles (forward 0, backward and
gradient communication 1, optimizer 2), which plain PIR programs leave at -1.
"""
from dataclasses import dataclass
from typing import Any, List

import paddle
from paddle.base.framework import pir_op_role_guard

from fleetlite.compile import compiler, program_edit
from fleetlite.paddle_compat import value_clip as gradient_clip, quiet_warnings as paddle_noise
from fleetlite.compile.report import CompileReport
from fleetlite.errors import CompileError
from fleetlite.runtime import process_group

BROADCAST = "broadcast_parameters"


@dataclass
class DataParallelProgram:
    optimize_ops: List[Any]
    params_grads: List[Any]     # (parameter, reduced gradient) pairs
    report: CompileReport


def build(loss, optimizer, strategy, topology, startup_program=None, parameter_list=None, no_grad_set=None,
          timeline=False):
    main = loss.block.program
    check_built_in_one_program(main)
    startup = startup_program or paddle.static.default_startup_program()
    program_edit.tag_untagged_roles(main.global_block(), program_edit.FORWARD)

    def backward(differentiated_loss):
        with pir_op_role_guard(program_edit.BACKWARD), paddle_noise.differentiating():
            return optimizer.backward(differentiated_loss, startup, parameter_list, no_grad_set)

    def update(reduced, found_inf):
        if found_inf is not None:   # Paddle's Adam family then skips the step, moments included
            optimizer._set_auxiliary_var("found_inf", found_inf)
        with pir_op_role_guard(program_edit.OPTIMIZE), gradient_clip.buildable(optimizer):
            optimizer.apply_gradients(reduced)

    with paddle.static.program_guard(main, startup):     # state a pass creates is initialised in `startup`
        gradients, report = compiler.compile(main, None, strategy, topology, loss=loss, backward=backward,
                                             update=update, optimizer=optimizer, timeline=timeline)
    reduced = [(g.param, g.synced) for g in gradients if g.synced is not None]   # pto on GPU: the owned ones
    optimize_ops = [op for op in program_edit.walk(main.global_block()) if op.op_role == program_edit.OPTIMIZE]
    if topology.world_size > 1:
        report.startup[BROADCAST] = broadcast_parameters(startup)
    if topology.device == "cpu" and topology.world_size > 1:     # the gloo groups its rings run on
        process_group.create_subgroups(report.record("gloo_lowering").details.get("communicators", []),
                                       topology.rank)
    return DataParallelProgram(optimize_ops, reduced, report)


def check_built_in_one_program(main):
    """Refuse a loss that reads values of another program: a model built outside
    `program_guard` puts its parameters in Paddle's default programs, backward then finds no
    gradient to reduce or update, and the executor fails only at the first run (`Not found key
    in IRMapping`)."""
    own = {op.id() for op in program_edit.walk(main.global_block())}
    foreign = []
    for op in program_edit.walk(main.global_block()):
        for source in op.operands_source():
            producer = source.get_defining_op()
            if producer is not None and producer.id() not in own:
                name = source.name if source.has_name else producer.name()
                foreign += [name] if name not in foreign else []
    if foreign:
        raise CompileError(f"the loss reads {', '.join(foreign)} from another program: the model was built "
                           f"outside `with paddle.static.program_guard(main, startup):`, so its parameters "
                           f"are in Paddle's default programs; create the layers inside the program_guard "
                           f"that builds the data and the loss")


def broadcast_parameters(startup):
    """Put a broadcast from rank 0 before each parameter is stored; returns how many."""
    setters = [op for op in startup.global_block().ops if op.name() == "builtin.set_parameter"]
    for setter in setters:
        with program_edit.inserting(startup, BROADCAST, before=setter):
            paddle._C_ops.broadcast_(setter.operand_source(0), 0, 0)
    return len(setters)
