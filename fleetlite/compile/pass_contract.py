"""The pass contract: what a strategy pass declares, receives and returns.

A pass is one strategy knob turned into a program rewrite. It declares
- `name`: the strategy field that turns it on (a dotted one too), or its own name;
- `knobs`: the fields that turn it on when they are not just `name` (a companion pass runs with
  its main pass's knob; a pass with two Fleet spellings names both), or `always_on`;
- `phase`: where it runs (see `Phase`), plus optional `after` / `before` pass names;
- `requires`: passes that must be on for it to work (an error names both fields);
- `conflicts`: {other pass: reason} for combinations that cannot work (an error, never a
  silent switch-off);
- `reads`: the strategy fields it consumes, shown as its config in the report and counted as
  "claimed" so a requested knob that nothing reads is reported instead of dropped;
- `applicable(topology, program)`: None, or the reason the knob is a no-op here (the report
  says "skipped: reason"; `strict: true` makes that an error);
- `apply(context)`: edits `context.program` (only through `context.edit()`, which tags every
  created op with the pass's name) and returns a `PassResult`.

Later passes fit the same slots: AMP casts are a FORWARD_REWRITE (run before backward, see
compiler), gradient merge a BACKWARD_REWRITE, top-k a COMMUNICATION alternative to
data_parallel, AMP's unscale a REDUCED_REWRITE, thread counts EXECUTION.
"""
import abc
import enum
from dataclasses import dataclass, field
from typing import Any, Dict

from fleetlite.compile import program_edit
from fleetlite.errors import CompileError, StrategyConflictError
from fleetlite.compile.ring_table import RingTable


# The runtime flag that makes Paddle's executor run a program's ops in program order.
IN_ORDER = "FLAGS_new_executor_sequential_run"

class Phase(enum.IntEnum):
    FORWARD_REWRITE = 1    # rewrite the forward before backward exists (AMP casts, recompute)
    BACKWARD_REWRITE = 2   # rewrite the gradients before they leave the rank (gradient merge)
    COMMUNICATION = 3      # decide how gradients cross ranks (all-reduce; top-k later)
    COMM_LAYOUT = 4        # shape that communication: buckets, rings, hierarchical stages
    REDUCED_REWRITE = 5    # rewrite the reduced gradients before the update (AMP unscale, overflow)
    LOWERING = 6           # make the layout runnable on this backend (gloo: ring 0 only)
    UPDATE_REWRITE = 7     # after apply_gradients: rewrite the update (gradient merge's condition, merged_adam_)
    EXECUTION = 8          # runtime settings the program needs (flags, streams)


@dataclass
class PassResult:
    """What a pass did: one line for the report table, and details for the JSON report."""
    summary: str
    details: Dict[str, Any] = field(default_factory=dict)


@dataclass
class GradientSync:
    """One trainable parameter's gradient on its way from backward to the optimizer."""
    name: str        # the parameter's name
    param: Any       # pir.Value of the parameter
    grad: Any        # pir.Value backward produced
    synced: Any      # pir.Value the optimizer will read (the grad itself until reduced)

    @property
    def nbytes(self):
        return program_edit.nbytes(self.grad)

    @property
    def dtype(self):
        return program_edit.dtype_name(self.grad)


class CompileContext:
    """The program being compiled and what passes know about it, shared by all passes."""

    def __init__(self, program, strategy, topology, gradients):
        self.program = program
        self.strategy = strategy
        self.topology = topology
        self.gradients = gradients          # [GradientSync] in ready order (backward's)
        self.loss = None                    # what backward differentiates (FORWARD_REWRITE may replace it)
        self.user_loss = None               # the loss as the model computes it (AMP's scaled loss replaces `loss`)
        self.optimizer = None               # the inner optimizer, when compile builds its update (minimize)
        self.buckets = []                   # [gradient_buckets.Bucket] in issue order
        self.exchanged = set()              # indices of gradients a sparse exchange (topk) sends instead
        self.rings = RingTable(topology.world_size)
        self.gradient_scale = None          # factor applied after the sum (None: no scaling)
        self.loss_scaling = None            # AMP's loss-scale state (strategies/amp.LossScaling), if scaled
        self.found_inf = None               # AMP's overflow flag: the optimizer skips its update when set
        self.unscaled = {}                  # index -> this rank's overflow flag, of gradients a pass already unscaled
        self.after_overflow_agreed = []     # fn(found_inf) building what must wait for the agreed flag
        self.reduced = False                # True once a pass makes gradients cross ranks
        self.update_only = []               # ops that run only when the update runs (gradient merge moves them with it)
        self.runtime_flags = {}             # Paddle flags the program needs at run time
        self.current_pass = None

    @property
    def block(self):
        return self.program.global_block()

    def edit(self, before=None, after=None):
        """Insert ops tagged with the running pass's name (see program_edit.inserting)."""
        return program_edit.inserting(self.program, self.current_pass, before=before, after=after,
                                      role=program_edit.BACKWARD)


class Pass(abc.ABC):
    name = None
    phase = None
    after = ()
    before = ()
    requires = ()
    conflicts = {}
    reads = ()
    decides_without_program = False   # applicable() reads the topology only: validate() may ask it (program None)
    knobs = ()
    always_on = False

    def __init__(self, strategy):
        self.strategy = strategy

    def enabled(self):
        """Whether the user asked for this pass: any of its knobs (default: its name) is truthy."""
        return self.always_on or any(read_field(self.strategy, knob) for knob in self.knobs or (self.name,))

    def switched_on_by(self):
        """The field the user set to turn this pass on, which errors name (a Fleet alias such as
        `sharding` for pto, not the pass's own name)."""
        return next((knob for knob in self.knobs if read_field(self.strategy, knob)), self.name)

    @staticmethod
    def check_strategy(strategy, topology):
        """Raise StrategyConflictError for field values this pass can never work with (topology is
        None where validate() is called without one). Runs at every validate(), the pass on or off."""

    def config(self):
        """The strategy values this pass runs with, for the report."""
        return {name: read_field(self.strategy, name) for name in self.reads}

    def applicable(self, topology, program):
        """None if the pass has work here, else the reason it is a no-op."""
        return None

    @abc.abstractmethod
    def apply(self, context):
        """Rewrite `context.program`; return a PassResult."""

    def check_backward(self, context):
        """After backward, for an applied FORWARD_REWRITE pass: raise CompileError if the backward
        Paddle built from its rewrite cannot run."""


def check_combination(enabled):
    """Every `requires` of the enabled passes is on and no two of them conflict; errors name the
    fields the user set."""
    names = {p.name: p.switched_on_by() for p in enabled}
    for p in enabled:
        mine = names[p.name]
        for needed in p.requires:
            if needed not in names:
                raise StrategyConflictError(f"'{mine}' needs '{needed}', which is off",
                                            field=mine, fix=f"turn '{needed}' on, or '{mine}' off")
        for other, reason in p.conflicts.items():
            if other in names:
                theirs = names[other]
                raise StrategyConflictError(f"'{mine}' and '{theirs}' cannot be used together: {reason}",
                                            field=mine, value=True, fix=f"turn '{mine}' or '{theirs}' off")


def required_skipped(current, skipped):
    """The reason `current` is skipped because a pass it requires was ({name: reason}), or None."""
    for needed in current.requires:
        if needed in skipped:
            return f"needs {needed}, which was skipped ({skipped[needed]})"
    return None


def strict_refusal(current, reason):
    """What `strict: true` says of a pass the user asked for that does nothing here."""
    return (f"strict: {current.switched_on_by()} was requested but does nothing here: {reason}; "
            f"change the strategy or set strict: false")


def read_field(strategy, dotted):
    """The value of a (possibly dotted) strategy field, e.g. 'gradient_scale_configs.scale_strategy'."""
    value = strategy
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def inner_optimizer(optimizer, knob, optimizer_class, build, refused, other=""):
    """The optimizer whose update the pass `knob` rewrites, refused by name when it is missing (no
    optimizer at minimize), of another class, or built with a setting the pass does not build:
    `refused(optimizer)` is {what: present}. `build` is how to construct the right one; `other`
    names a sibling knob for the other optimizer. `optimizer_class` may be a tuple of the classes
    the pass accepts."""
    classes = optimizer_class if isinstance(optimizer_class, tuple) else (optimizer_class,)
    kind = " or ".join(c.__name__ for c in classes)
    if optimizer is None:
        raise CompileError(f"{knob} rewrites the optimizer's {kind} update, so it compiles with the optimizer: use "
                           f"fleet.distributed_optimizer(paddle.optimizer.{classes[0].__name__}(...), "
                           f"strategy).minimize(loss)")
    if not isinstance(optimizer, classes):
        raise StrategyConflictError(f"{knob} works with the {kind} optimizer only, and this one is "
                                    f"{type(optimizer).__name__}", field=knob, value=True,
                                    fix=f"train with {build}, or turn {knob} off{other}")
    for what, present in refused(optimizer).items():
        if present:
            raise StrategyConflictError(f"{knob} does not build {kind} with {what}", field=knob, value=True,
                                        fix=f"leave it out of paddle.optimizer.{kind}(...), or turn {knob} off")
    return optimizer
