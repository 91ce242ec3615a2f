"""`fleetlite.DistributedStrategy`: Fleet's strategy object over fleetlite's validated schema.

Scripts written for `paddle.distributed.fleet.DistributedStrategy` work unchanged: attribute
get/set, `*_configs` set from dicts, `build_strategy` / `execution_strategy`, prototxt save/load.
What differs is on purpose: every write is checked (unknown names get a did-you-mean, wrong types
and ranges name the allowed values), sections are live views, and loads replace instead of merge.
"""
import functools

from fleetlite.strategy import files as strategy_files, hybrid_degrees, pass_registry, schema
from fleetlite.data import settings as data_settings
from fleetlite.errors import StrategyConflictError
from fleetlite.proto import strategy_pb2

# Fleet knobs outside data parallelism. Setting one is an error, never a silent no-op.
UNSUPPORTED = {
    "pipeline": "pipeline parallelism is not data parallel",
    "tensor_parallel": "tensor parallelism is not data parallel",
    "asp": "automatic sparsity is not implemented",
    "qat": "quantisation-aware training is not implemented",
    "semi_auto": "semi-automatic parallelism is not implemented",
    "auto": "Fleet's auto mode is not implemented: turn on the knobs you want explicitly",
    "auto_search": "auto search is not implemented",
    "heter_ccl_mode": "heterogeneous collectives are not implemented",
    "elastic": "Fleet's etcd elastic mode is not implemented: use fleetrun --max_restarts",
    "is_fl_ps_mode": "parameter-server modes are not supported (fleetlite is collective only)",
    "with_coordinator": "parameter-server modes are not supported (fleetlite is collective only)",
    "adam_d2sum": "parameter-server modes are not supported (fleetlite is collective only)",
}
# Paddle's own attribute spellings of a schema field (its DistributedStrategy has both names).
ALIASES = {"_fuse_grad_size_in_TFLOPS": "fuse_grad_size_in_TFLOPS"}


class DistributedStrategy:
    """How to train: every knob of the strategy schema, validated on each write."""

    def __init__(self, message=None):
        object.__setattr__(self, "_proto", message if message is not None
                           else strategy_pb2.DistributedStrategy())

    # --- Fleet-compatible attribute access ---------------------------------------------
    def __getattr__(self, name):
        if name.startswith("_") and name not in ALIASES:
            raise AttributeError(name)
        return schema.read(self._proto, ALIASES.get(name, name))

    def __setattr__(self, name, value):
        schema.assign(self._proto, ALIASES.get(name, name), value)

    def __eq__(self, other):
        return isinstance(other, DistributedStrategy) and self.to_dict(False) == other.to_dict(False)

    # --- files ----------------------------------------------------------------------------
    def save_to_prototxt(self, path):
        strategy_files.save(self._proto, path, "prototxt")

    def load_from_prototxt(self, path):
        """Replace this strategy by the file's (Fleet merged into the current one)."""
        self._proto.CopyFrom(strategy_files.load(path, "prototxt"))

    def save_to_yaml(self, path):
        strategy_files.save(self._proto, path, "yaml")

    def load_from_yaml(self, path):
        self._proto.CopyFrom(strategy_files.load(path, "yaml"))

    def save(self, path):
        """Save in the format the file name says (.yaml/.yml or .prototxt)."""
        strategy_files.save(self._proto, path)

    @classmethod
    def load(cls, path, allow_empty=True):
        """A strategy from a .yaml/.yml or .prototxt file (allow_empty=False: one setting no field is an error)."""
        return cls(strategy_files.load(path, allow_empty=allow_empty))

    # --- inspection -----------------------------------------------------------------------
    def to_dict(self, present_only=True):
        return schema.to_dict(self._proto, present_only)

    def non_default(self):
        """{dotted field: value} for every field whose value differs from the schema default.
        Compiling asks this dozens of times of an unchanged strategy, so the answer is kept until
        the message's bytes change (any write, through any path, changes them)."""
        key = self._proto.SerializeToString(deterministic=True)
        cached = self.__dict__.get("_non_default")
        if cached is None or cached[0] != key:
            defaults = _schema_defaults()
            current = schema.flatten(self.to_dict(False))
            cached = (key, {k: v for k, v in current.items() if defaults.get(k) != v})
            object.__setattr__(self, "_non_default", cached)
        return dict(cached[1])

    def diff(self, other):
        """[(dotted field, self's value, other's value)] for every field that differs."""
        mine, theirs = schema.flatten(self.to_dict(False)), schema.flatten(other.to_dict(False))
        return [(k, mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]]

    def __repr__(self):
        changed = self.non_default()
        body = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"DistributedStrategy({body})"

    def __str__(self):
        changed = self.non_default()
        if not changed:
            return "DistributedStrategy: all fields at their defaults"
        width = max(len(k) for k in changed)
        rows = "\n".join(f"  {k.ljust(width)}  {v!r}" for k, v in changed.items())
        return f"DistributedStrategy (fields that differ from the defaults):\n{rows}"

    # --- validation -----------------------------------------------------------------------
    def validate(self, topology=None):
        """Check every field and every cross-field rule; raise on the first problem.

        Without a topology only the rules that need none run; the compiler calls this again
        with the job's topology, where rules such as "inter_nranks divides the world" apply.
        """
        schema.check_present_fields(self._proto)
        if self._proto.mode != strategy_pb2.COLLECTIVE:
            raise StrategyConflictError(
                f"mode = {strategy_pb2.Mode.Name(self._proto.mode)} is not supported",
                field="mode", value=self._proto.mode, fix="fleetlite trains data parallel: use mode COLLECTIVE")
        for field, reason in UNSUPPORTED.items():
            if getattr(self._proto, field):
                raise StrategyConflictError(f"'{field}' is set but {reason}", field=field,
                                            value=True, fix=f"set {field}: false")
        hybrid_degrees.check(self._proto.hybrid_configs, topology)
        data_settings.check(self._proto.data_configs, topology)
        pass_registry.check_strategy(self, topology)
        return self


@functools.lru_cache(maxsize=None)
def _schema_defaults():
    """{dotted field: default} of the schema (fixed for the process; compile asks often)."""
    return schema.flatten(schema.to_dict(strategy_pb2.DistributedStrategy(), False))


def BuildStrategy():
    """A standalone build_strategy section, for `strategy.build_strategy = fleet.BuildStrategy()`."""
    return schema.DetachedSection(strategy_pb2.BuildStrategy, "build_strategy")


def ExecutionStrategy():
    """A standalone execution_strategy section (Paddle 3 removed paddle.static.ExecutionStrategy)."""
    return schema.DetachedSection(strategy_pb2.ExecutionStrategy, "execution_strategy")
