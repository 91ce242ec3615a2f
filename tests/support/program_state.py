"""Paddle's invariants for the persistable values of a program, as user code relies on them.

A compiled program must look like an uncompiled one to `[v.name for v in program.list_vars()
if v.persistable]`, Paddle's save/load and `program.state_dict()`: every persistable value has
a name, the startup program creates it, and after a run it is in the scope.
"""
import paddle


def persistable_names(program):
    """The names of `program`'s persistable values, as user scripts list them (an unnamed one
    raises Paddle's ValueError, as it does for them)."""
    return [v.name for v in program.list_vars() if v.persistable]


def startup_creates(startup):
    """The names of the variables `startup` writes into the scope."""
    names = set()
    for op in startup.global_block().ops:
        if op.name() == "builtin.set_parameter":
            names.add(op.attrs()["parameter_name"])
        elif op.name() == "builtin.shadow_output":
            names.add(op.attrs()["output_name"])
    return names


def problems(main, startup, scope=None):
    """What breaks the invariants, as readable lines ([] when they hold): unnamed persistable
    values, persistable names the startup program does not create, and (given the `scope` the
    programs ran in) names not found there."""
    unnamed = [f"unnamed: a result of {v.get_defining_op().name()}"
               for v in main.list_vars() if v.persistable and not v.has_name]
    if unnamed:
        return unnamed
    names = persistable_names(main)
    found = [f"not created by the startup program: {name}" for name in names
             if name not in startup_creates(startup)]
    if scope is not None:
        found += [f"not in the scope: {name}" for name in names if scope.find_var(name) is None]
    return found


def in_scope(names, scope=None):
    """{name: array} of `names` from `scope` (default: the global scope)."""
    scope = scope or paddle.static.global_scope()
    return {name: scope.find_var(name).get_tensor().__array__() for name in names}
