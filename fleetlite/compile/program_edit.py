"""Safe, traceable edits of Paddle PIR static programs.

Every pass edits programs through `inserting`, which avoids the measured traps of PIR
rewriting and leaves a trace:
- `paddle.static.program_guard` moves the insertion point to the end of the block, so the
  point is set *inside* the guard (set outside, ops silently land after the optimizer);
- every op created inside is tagged with the attribute `fleetlite_pass` = the pass's name, so
  tests read back exact op sequences per pass and the report attributes every change;
- `pir.Value.__eq__` builds an `equal` op (and a dangling one aborts the process at exit), so
  values are never compared with `==` or used as dict keys here: `key(value)` is.
"""
import contextlib
import math

import paddle

from fleetlite.errors import CompileError

PROVENANCE = "fleetlite_pass"
BUCKET = "fleetlite_bucket"        # index of the gradient bucket a collective belongs to
EMULATES = "fleetlite_emulates"    # ring id a ring-0 collective stands in for (gloo lowering)
# On an all-gather: its rows land on elements no other row touches, so it moves values and sums
# nothing (hierarchical top-k hands each member's share of pairs to the whole node).
PLACES = "fleetlite_places"

FORWARD, BACKWARD, OPTIMIZE = 0, 1, 2   # Paddle's op roles


def key(value):
    """A hashable identity for a pir.Value (never hash or compare the Value itself)."""
    return value.id


def provenance(op):
    return op.str_attr(PROVENANCE) if op.has_attr(PROVENANCE) else None


def int_attr(op, name, default=None):
    return op.attrs()[name] if op.has_attr(name) else default


def walk(block):
    """Every op of `block` and of the blocks nested in its ops (an `if`'s branches), in order."""
    for op in block.ops:
        yield op
        if op.num_regions():    # iterating op.blocks() of an op without regions costs ~10 us
            for inner in op.blocks():
                yield from walk(inner)


def created_by(block, pass_name):
    """The ops of `block` (nested blocks included) that `pass_name` created, in program order."""
    return [op for op in walk(block) if provenance(op) == pass_name]


@contextlib.contextmanager
def inserting(program, tag, before=None, after=None, role=None):
    """Build ops into `program` before/after an op (default: at the end), tagged with `tag`.

    Yields a list that, on exit, holds the created ops in program order.
    """
    block = program.global_block()
    existing = {op.id() for op in walk(block)}
    created = []
    guard_role = paddle.base.framework.pir_op_role_guard(role) if role is not None else contextlib.nullcontext()
    with paddle.static.program_guard(program), guard_role:
        if before is not None:
            paddle.pir.set_insertion_point(before)
        elif after is not None:
            paddle.pir.set_insertion_point_after(after)
        try:
            yield created
        finally:
            paddle.pir.reset_insertion_point_to_end()
    for op in walk(block):
        if op.id() not in existing:
            op.set_str_attr(PROVENANCE, tag)
            created.append(op)


def remove_ops(block, ops):
    """Remove `ops` of `block` or of its nested blocks (results unused outside the set), last first
    so uses go before defs."""
    position = {op.id(): i for i, op in enumerate(walk(block))}
    for op in sorted(ops, key=lambda o: position[o.id()], reverse=True):
        for result in op.results():
            if not result.use_empty():
                users = ", ".join(user.name() for user in result.all_used_ops())
                raise CompileError(f"cannot remove {op.name()}: its result is still read by {users}")
        op.get_parent_block().remove_op(op)


def clone_ops(ops, role):
    """Clone `ops` (in program order) at the insertion point with op role `role`; each clone reads
    the clones of the ops before it in `ops` and the original of anything else. Returns the
    IrMapping from each original result to its clone's (`mapping.look_up(result)`)."""
    produced = {key(result) for op in ops for result in op.results()}
    mapping, outside = paddle.pir.IrMapping(), set()
    for op in ops:
        for source in op.operands_source():
            if key(source) not in produced and key(source) not in outside:
                outside.add(key(source))
                mapping.add(source, source)
    for op in ops:
        clone = op.clone(mapping, paddle.pir.CloneOptions(False, True, True))
        clone.set_int_attr("op_role", role)
    return mapping


def nbytes(value):
    return math.prod(value.shape) * value.element_size()


def dtype_name(value):
    return str(value.dtype).replace("paddle.", "")


def tag_untagged_roles(block, role):
    """Give every op without a role (-1, as Paddle leaves plain programs) the role `role`."""
    for op in block.ops:
        if op.op_role == -1:
            op.set_int_attr("op_role", role)
