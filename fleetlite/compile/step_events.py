"""The step timeline's events, compiled into the training program: a timestamp pair around each
collective the passes placed, each run of top-k exchange ops, and the optimizer update.

Runs after every pass (compile's last act, and only when a timeline is asked for), so it sees
the program that runs: the buckets' all-reduces with their bucket number, the lowering's
collectives, the top-k exchange wherever its pass put it (found by the ops' provenance, not by
its internals). A stamp is in place on the value the instrumented op reads (before) or writes
(after, every later reader then reads the stamp's result), so data dependencies order it
whatever the executor schedules. Each event is a plain dict (name, kind, begin and end slot,
args): the report lists them and the worker turns each step's stamps into timeline events.
"""
import itertools

from fleetlite.compile import program_edit, step_stamps

TAG = "step_timeline"
TOPK_PASSES = ("topk", "dgc")          # passes whose ops make a top-k selection and exchange
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
_slots = itertools.count()             # slots are per process: several compiled programs never share one


def collective_kind(op):
    """'all_reduce' for pd_op.all_reduce_ (and the like), None for an op that is no collective."""
    name = op.name().split(".")[-1]
    return next((kind for kind in COLLECTIVE_KINDS if kind in name), None)


def instrument(program):
    """Put the timestamp pairs into `program`'s global block; returns the events, in program order.
    Nothing is changed (and None returned) when the kernel cannot load here."""
    if step_stamps.load_error() is not None:
        return None
    ops = list(program.global_block().ops)
    spans = _spans(ops)
    events = []
    for name, kind, first, last, args in spans:
        begin, end = next(_slots), next(_slots)
        if begin >= step_stamps.SLOTS - 1:
            break
        _stamp_before(program, first, begin)
        _stamp_after(program, last, end)
        events.append({"name": name, "kind": kind, "begin": begin, "end": end, "args": args})
    return events


def _spans(ops):
    """(name, kind, first op, last op, args) for each event to time."""
    spans, counts = [], {}
    for op in ops:
        kind = collective_kind(op)
        if kind is None or not op.num_operands() or not op.num_results():
            continue
        bucket = program_edit.int_attr(op, program_edit.BUCKET)
        number = counts[kind] = counts.get(kind, -1) + 1
        name = f"{kind} bucket {bucket}" if bucket is not None else f"{kind} #{number}"
        spans.append((name, kind, op, op, {"collective": op.name(), "bytes": program_edit.nbytes(op.operand_source(0)),
                                           "ring": program_edit.int_attr(op, "ring_id")}))
    for group, run in itertools.groupby(ops, key=lambda op: program_edit.provenance(op) in TOPK_PASSES):
        run = [op for op in run if op.num_operands()]
        if group and run and run[-1].num_results():
            spans.append((f"topk selection and exchange ({program_edit.provenance(run[0])})", "topk",
                          run[0], run[-1], {"ops": len(run)}))
    update = [op for op in ops if op.op_role == program_edit.OPTIMIZE and op.num_operands() and op.num_results()]
    if update:
        spans.append(("optimizer update", "optimizer", update[0], update[-1], {"ops": len(update)}))
    return spans


def _stamp_before(program, op, slot):
    """Stamped in place on the operand made last, so the stamp cannot run long before `op`."""
    position = {other.id(): i for i, other in enumerate(program.global_block().ops)}

    def made_at(index):
        maker = op.operand_source(index).get_defining_op()
        return position.get(maker.id(), -1) if maker is not None else -1

    index = max(range(op.num_operands()), key=made_at)
    with program_edit.inserting(program, TAG, before=op):
        stamped = step_stamps.stamp(op.operand_source(index), slot)
    op.operand(index).set_source(stamped)


def _stamp_after(program, op, slot):
    result = op.result(0)
    readers = result.all_used_ops()
    with program_edit.inserting(program, TAG, after=op):
        stamped = step_stamps.stamp(result, slot)
    for reader in readers:
        for index in range(reader.num_operands()):
            if reader.operand_source(index).is_same(result):
                reader.operand(index).set_source(stamped)
