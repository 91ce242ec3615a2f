"""compile(): turn a strategy into a data-parallel rewrite of a static program.

Runs between backward and the optimizer update (`minimize` is backward -> compile ->
apply_gradients), so everything the optimizer adds (gradient clipping, weight decay, the
update ops) reads the reduced gradients. Steps:
1. validate the strategy against the topology;
2. instantiate the registered passes and keep those whose knob is on;
3. check `requires` and `conflicts` (errors name both fields), and find the knobs the user
   set that no pass reads (reported as skipped; an error under `strict`), all before the
   program is touched;
4. order the passes: by phase, then declared before/after edges, then registry position (a
   cycle is an error naming its passes);
5. per pass: skip it with a reason if it (or a pass it requires) is a no-op here — an error
   under `strict` when the user set one of its fields — else apply it, check that every op
   it created carries its name, and check the invariants (on CPU, from the lowering on, the
   gloo guard too).
A failure inside a pass is re-raised as "in pass X (after A, B)".

FORWARD_REWRITE passes (AMP's casts) must see the forward before backward exists, so that
backward differentiates what they built. `training_program.build` therefore hands compile the
loss and a `backward` function instead of gradients: the forward passes run, then backward (of
the loss they leave, e.g. AMP's scaled loss), then each applied forward pass checks the backward
built from its rewrite (`Pass.check_backward`), then the rest. Given gradients, the forward
passes are skipped with that reason.

With `timeline`, compile's last act compiles the step timeline's timestamp pairs in
(step_events: around each collective, top-k exchange and the optimizer update); the report
lists them as `step_events`.

UPDATE_REWRITE passes (gradient merge's conditional branch, merged_adam_) rewrite the optimizer
update, so they need it built: given an `update` function (the inner optimizer's
apply_gradients), compile calls it on the reduced gradients before the first of them.
"""
import heapq

from fleetlite.compile import invariants, program_edit, step_events
from fleetlite.compile.report import APPLIED, OFF, SKIPPED, CompileReport, PassRecord
from fleetlite.errors import CompileError, FleetliteError
from fleetlite.strategy import pass_registry
from fleetlite.strategy.knob_accounting import unclaimed_under_strict
from fleetlite.compile.pass_contract import (IN_ORDER, CompileContext, GradientSync, Phase, check_combination, required_skipped,
                                             strict_refusal)

BACKWARD_EXISTS = "it rewrites the forward before backward, and this program already has backward"


def compile(program, params_grads, strategy, topology, registry=None, loss=None, backward=None, update=None,
            optimizer=None, timeline=False):
    """Rewrite `program` for `topology`; returns ([GradientSync], CompileReport).

    Each GradientSync's `synced` is the value the optimizer must read for its parameter.
    Either `params_grads` (backward already ran) or `loss` and `backward` (loss -> params_grads),
    which compile calls after the FORWARD_REWRITE passes. `update([(param, reduced grad)], found_inf)`
    builds the optimizer update; compile calls it before the UPDATE_REWRITE passes. `optimizer` is
    the inner optimizer `update` applies, for passes that depend on it (dgc needs Momentum's).
    `registry`: the pass classes to run (default: the registered passes, see pass_registry).
    """
    strategy.validate(topology)
    passes, enabled, unclaimed = check_knobs(strategy, registry)
    context = CompileContext(program, strategy, topology, [])
    context.loss = context.user_loss = loss
    context.optimizer = optimizer
    ordered = order_passes(enabled)
    forward = [p for p in ordered if p.phase == Phase.FORWARD_REWRITE]
    report = CompileReport(topology.describe())
    state = _RunState()
    report.records = _run_passes(forward, context, state)
    if backward is not None:
        params_grads = _differentiate(backward, context, state.done)
        for applied in (p for p in forward if p.name in state.done):
            applied.check_backward(context)
    context.gradients = gradients_in_ready_order(program, params_grads)
    rest = ordered[len(forward):]
    before_update = [p for p in rest if p.phase < Phase.UPDATE_REWRITE]
    report.records += _run_passes(before_update, context, state)
    if update is not None:
        update([(g.param, g.synced) for g in context.gradients], context.found_inf)
        invariants.check_defined_before_use(context.block)
        invariants.check_optimizer_reads_synced(context.block, context.gradients)
    report.records += _run_passes(rest[len(before_update):], context, state)
    report.records += [PassRecord(p.name, p.phase.name, OFF, p.config()) for p in passes if not p.enabled()]
    report.records += [PassRecord(knob, "-", SKIPPED, reason=reason) for knob, reason in unclaimed]
    if topology.device == "cpu":
        invariants.check_gloo(context.block)      # also when no lowering pass ran
    invariants.check_persistables_named(context.block)   # also what the optimizer's update made
    report.buckets = [b.describe(context.gradients) for b in context.buckets]
    used = {program_edit.int_attr(op, "ring_id") for op in program_edit.walk(context.block)} - {None}
    report.rings = [ring.describe(topology.rank) for ring in context.rings if ring.ring_id in used]
    report.runtime_flags = dict(context.runtime_flags)
    if timeline:
        report.step_events = step_events.instrument(program)
        if report.step_events:     # a span over independent ops (the update) is bracketed only in order
            report.runtime_flags[IN_ORDER] = True
    return context.gradients, report


class _RunState:
    """What the passes run so far did, carried from the forward passes to the rest."""

    def __init__(self):
        self.skipped = {}     # pass name: reason
        self.done = []        # names of the passes applied, in order
        self.count = 0        # passes run or skipped so far


def _run_passes(ordered, context, state):
    """Apply or skip each pass in order; one PassRecord each."""
    requested = set(context.strategy.non_default())
    records, skipped, done = [], state.skipped, state.done
    for current in ordered:
        state.count += 1
        order = state.count
        reason = _skip_reason(current, skipped, context)
        if reason is None:
            records.append(_run(current, context, order, done))
            done.append(current.name)
            continue
        if context.strategy.strict and requested & set(current.reads):
            raise CompileError(strict_refusal(current, reason))
        skipped[current.name] = reason
        records.append(PassRecord(current.name, current.phase.name, SKIPPED, current.config(), order,
                                  reason=reason))
    return records


def _differentiate(backward, context, rewrites):
    """Run backward on the loss the forward passes left; name them if Paddle refuses it."""
    try:
        return backward(context.loss)
    except Exception as exc:
        if not rewrites:
            raise
        raise CompileError(f"backward of the forward as {', '.join(rewrites)} rewrote it failed: "
                           f"{type(exc).__name__}: {exc}") from exc


def gradients_in_ready_order(program, params_grads):
    """GradientSync per trainable (param, grad), ordered by when backward produces the grad."""
    position = {op.id(): i for i, op in enumerate(program.global_block().ops)}
    pairs = [(p, g) for p, g in params_grads if g is not None]
    pairs.sort(key=lambda pg: (position[pg[1].get_defining_op().id()], pg[1].index()))
    return [GradientSync(p.name, p, g, g) for p, g in pairs]


def check_knobs(strategy, registry=None):
    """What compile rejects knowing only the strategy, before any program exists: a pass whose
    requirement is off, two enabled passes that conflict, and (under strict) a knob no pass reads.

    Returns (passes, enabled passes, [(knob, reason)] for the knobs compile will skip).
    """
    passes = [cls(strategy) for cls in (pass_registry.passes() if registry is None else registry)]
    enabled = [p for p in passes if p.enabled()]
    check_combination(enabled)
    unclaimed = unclaimed_under_strict(strategy, {field for p in passes for field in p.reads})
    return passes, enabled, unclaimed


def order_passes(passes):
    """Stable topological order: phase, then declared edges, then registry position."""
    index = {p.name: i for i, p in enumerate(passes)}
    by_name = {p.name: p for p in passes}
    edges = {p.name: set() for p in passes}
    for p in passes:
        for earlier in (*p.after, *p.requires):
            if earlier in by_name:
                edges[earlier].add(p.name)
        for later in p.before:
            if later in by_name:
                edges[p.name].add(later)
    for first, seconds in edges.items():
        for second in seconds:
            if by_name[first].phase > by_name[second].phase:
                raise CompileError(f"pass '{first}' ({by_name[first].phase.name}) is declared to run before "
                                   f"'{second}' ({by_name[second].phase.name}), against the phase order")
    waiting = {name: 0 for name in by_name}
    for seconds in edges.values():
        for second in seconds:
            waiting[second] += 1
    ready = [(by_name[n].phase, index[n], n) for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, _, name = heapq.heappop(ready)
        ordered.append(by_name[name])
        for second in edges[name]:
            waiting[second] -= 1
            if waiting[second] == 0:
                heapq.heappush(ready, (by_name[second].phase, index[second], second))
    if len(ordered) < len(passes):
        raise CompileError("passes declare a cycle: " + " -> ".join(_cycle(edges, set(by_name) - {p.name for p in ordered})))
    return ordered


def _cycle(edges, stuck):
    """One cycle among the `stuck` passes (each has a stuck predecessor), as a closed list."""
    path, current = [], min(stuck)
    while current not in path:
        path.append(current)
        current = min(n for n in stuck if current in edges[n])
    cycle = path[path.index(current):] + [current]
    return cycle[::-1]


def _skip_reason(current, skipped, context):
    required = required_skipped(current, skipped)
    if required:
        return required
    if current.phase == Phase.FORWARD_REWRITE and context.loss is None:
        return BACKWARD_EXISTS
    return current.applicable(context.topology, context.program)


def _run(current, context, order, done):
    block = context.block
    before = {op.id(): op.name() for op in program_edit.walk(block)}
    context.current_pass = current.name
    where = f"in pass {current.name}" + (f" (after {', '.join(done)})" if done else "")
    try:
        result = current.apply(context)
        after = list(program_edit.walk(block))
        added = [op for op in after if op.id() not in before]
        untagged = [op.name() for op in added if program_edit.provenance(op) != current.name]
        if untagged:
            raise CompileError(f"created ops without its provenance tag: {', '.join(untagged)}")
        invariants.check_all(context, current.phase)
    except FleetliteError as exc:
        raise CompileError(f"{where}: {exc}") from exc
    except Exception as exc:
        raise CompileError(f"{where}: {type(exc).__name__}: {exc}") from exc
    finally:
        context.current_pass = None
    remaining = {op.id() for op in after}
    removed = [name for op_id, name in before.items() if op_id not in remaining]
    return PassRecord(current.name, current.phase.name, APPLIED, current.config(), order,
                      summary=result.summary, ops_added=[op.name() for op in added],
                      ops_removed=removed, details=result.details)
