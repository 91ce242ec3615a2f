"""Typed, validated access to the strategy proto.

Every write into a strategy message (attribute, dict, YAML, prototxt) goes through `assign`,
which checks the field name, the Python type and the range rule, so no path into the schema
can store a value the compiler would misread. Reads go through `read`, which turns float32
noise into the number the user wrote and sub-messages into live `ConfigSection` views.
"""
import math
import struct
from collections.abc import Mapping, MutableMapping

from google.protobuf.descriptor import FieldDescriptor as FD

from fleetlite.errors import FieldRangeError, FieldTypeError, UnknownFieldError
from fleetlite.strategy import checkpoint_values
from fleetlite.strategy.field_rules import RULES, OneOf

_INT_TYPES = {FD.TYPE_INT32, FD.TYPE_INT64, FD.TYPE_UINT32, FD.TYPE_UINT64,
              FD.TYPE_SINT32, FD.TYPE_SINT64}
_FLOAT_TYPES = {FD.TYPE_FLOAT, FD.TYPE_DOUBLE}
# What the proto type can hold, checked before the rule so no value fails inside protobuf.
_INT_BOUNDS = {FD.TYPE_INT32: ("int32", -2**31, 2**31 - 1), FD.TYPE_SINT32: ("int32", -2**31, 2**31 - 1),
               FD.TYPE_INT64: ("int64", -2**63, 2**63 - 1), FD.TYPE_SINT64: ("int64", -2**63, 2**63 - 1),
               FD.TYPE_UINT32: ("uint32", 0, 2**32 - 1), FD.TYPE_UINT64: ("uint64", 0, 2**64 - 1)}
FLOAT32_MAX = 3.4028234663852886e38
# Fields that accept a Python object the schema stores as a string: {dotted field: converter}.
STORED_AS = {"recompute_configs.checkpoints": checkpoint_values.stored}


def _is_repeated(field):
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == FD.LABEL_REPEATED


def join(path, name):
    return f"{path}.{name}" if path else name


def lookup(descriptor, name, path):
    """The field `name` of `descriptor`, or UnknownFieldError naming the closest valid one."""
    field = descriptor.fields_by_name.get(name)
    if field is None:
        raise UnknownFieldError(join(path, name), descriptor.fields_by_name.keys(), descriptor.name)
    return field


def shortest_float32(value):
    """The shortest decimal that is the same float32, so 0.8 reads back as 0.8, not 0.800000011."""
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return value


def _expected(field, path):
    """What the field takes, for a type error; a field with a fixed set of choices lists them,
    so a wrong type says which values are right."""
    rule = RULES.get(path)
    choices = f", {rule.describe()}" if isinstance(rule, OneOf) else ""
    return _type_name(field) + choices


def _type_name(field):
    if field.type == FD.TYPE_BOOL:
        return "a bool (true/false)"
    if field.type in _INT_TYPES:
        return "an integer"
    if field.type in _FLOAT_TYPES:
        return "a number"
    if field.type == FD.TYPE_STRING:
        return "a string"
    if field.type == FD.TYPE_ENUM:
        return "one of " + ", ".join(v.name for v in field.enum_type.values)
    return f"a mapping of {field.message_type.name} fields"


def _scalar(field, value, path):
    """Check one scalar against the field's type and rule; return what to store."""
    value = STORED_AS.get(path, lambda item: item)(value)
    ok = {
        FD.TYPE_BOOL: isinstance(value, bool),
        FD.TYPE_STRING: isinstance(value, str),
    }.get(field.type)
    if field.type in _INT_TYPES:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif field.type in _FLOAT_TYPES:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        try:
            value = float(value) if ok else value
        except OverflowError:   # an integer with hundreds of digits
            raise FieldRangeError(path, value, _type_limits(field, RULES.get(path))) from None
    elif field.type == FD.TYPE_ENUM:
        names = field.enum_type.values_by_name
        ok = isinstance(value, str) and value in names
        value = names[value].number if ok else value
    if not ok:
        raise FieldTypeError(path, value, _expected(field, path))
    rule = RULES.get(path)
    if not _fits_type(field, value):
        raise FieldRangeError(path, value, _type_limits(field, rule))
    if rule is not None and not rule.allows(value):
        raise FieldRangeError(path, value, rule.describe())
    return value


def _fits_type(field, value):
    """Whether the proto type holds `value`: int32 range, a finite float32, ..."""
    if field.type in _INT_BOUNDS:
        _, low, high = _INT_BOUNDS[field.type]
        return low <= value <= high
    if field.type in _FLOAT_TYPES:
        return math.isfinite(value) and (field.type == FD.TYPE_DOUBLE or abs(value) <= FLOAT32_MAX)
    return True


def _type_limits(field, rule):
    """What the field's type holds (with its rule, if any), for a value outside the type."""
    if field.type in _INT_BOUNDS:
        name, low, high = _INT_BOUNDS[field.type]
        limits = f"an {name}, from {low} to {high}"
    else:
        magnitude = f", magnitude at most {FLOAT32_MAX:.4g}" if field.type == FD.TYPE_FLOAT else ""
        limits = f"a finite number (not inf or nan{magnitude})"
    return limits if rule is None else f"{rule.describe()}, and {limits}"


def check_value(descriptor, path, value):
    """Check `value` for the dotted field `path` under `descriptor` as an assignment would, so a
    parser's own complaint about a value reads like every other field error."""
    parts = path.split(".")
    for index, name in enumerate(parts):
        field = lookup(descriptor, name, ".".join(parts[:index]))
        descriptor = field.message_type
    return _scalar(field, value, path)


def assign(message, name, value, path=""):
    """Set `message.name` from a Python value, validating everything below it.

    Mappings set the keys they name (Fleet's `strategy.amp_configs = {...}` semantics); lists
    replace the whole repeated field (never append); objects such as Paddle's BuildStrategy
    replace the section with the values of the attributes they share with the schema.
    """
    field = lookup(message.DESCRIPTOR, name, path)
    path = join(path, name)
    if _is_repeated(field):
        if not isinstance(value, (list, tuple)):
            raise FieldTypeError(path, value, f"a list, each item {_expected(field, path)}")
        container = getattr(message, name)
        if field.type == FD.TYPE_MESSAGE:
            checked = []
            for item in value:
                sub = field.message_type._concrete_class()
                update(sub, item, path)
                checked.append(sub)
            del container[:]
            container.extend(checked)
        else:
            checked = [_scalar(field, item, path) for item in value]
            del container[:]
            container.extend(checked)
    elif field.type == FD.TYPE_MESSAGE:
        sub = getattr(message, name)
        if isinstance(value, Mapping):
            update(sub, value, path)
        elif isinstance(value, ConfigSection):
            sub.CopyFrom(value._message)
            sub.SetInParent()
        elif _looks_like_config_object(value, field):
            replacement = field.message_type._concrete_class()
            update(replacement, _attributes_of(value, replacement), path)
            sub.CopyFrom(replacement)
            sub.SetInParent()
        else:
            raise FieldTypeError(path, value, _expected(field, path))
    else:
        setattr(message, name, _scalar(field, value, path))


def update(message, mapping, path):
    """Assign every key of `mapping` into `message`."""
    if isinstance(mapping, ConfigSection):
        mapping = dict(mapping)
    if not isinstance(mapping, Mapping):
        raise FieldTypeError(path, mapping, f"a mapping of {message.DESCRIPTOR.name} fields")
    message.SetInParent()
    for key, item in mapping.items():
        if not isinstance(key, str):
            raise FieldTypeError(join(path, str(key)), key, "a field name (string)")
        assign(message, key, item, path)


def _looks_like_config_object(value, field):
    return any(hasattr(value, name) for name in field.message_type.fields_by_name)


def _attributes_of(obj, message):
    """The values of `obj`'s schema-named attributes that differ from the schema defaults."""
    values = {}
    for field in message.DESCRIPTOR.fields:
        if not hasattr(obj, field.name):
            continue
        raw = getattr(obj, field.name)
        if field.type in _INT_TYPES and not isinstance(raw, int):
            raw = int(raw)  # Paddle's pybind enums (ReduceStrategy) convert to their number
        default = read(message, field.name)
        if raw != default and raw is not None:
            values[field.name] = raw
    return values


def read(message, name, path=""):
    """The user-facing value of one field: plain scalars, lists, or a live ConfigSection."""
    field = lookup(message.DESCRIPTOR, name, path)
    value = getattr(message, name)
    if _is_repeated(field):
        if field.type == FD.TYPE_MESSAGE:
            return [to_dict(item, present_only=False) for item in value]
        return [_plain(field, item) for item in value]
    if field.type == FD.TYPE_MESSAGE:
        return ConfigSection(message, name, join(path, name))
    return _plain(field, value)


def _plain(field, value):
    if field.type == FD.TYPE_FLOAT:
        return shortest_float32(value)
    if field.type == FD.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    return value


def to_dict(message, present_only=True):
    """A nested dict of the message: only the fields that were set, or every field."""
    fields = ([f for f, _ in message.ListFields()] if present_only else message.DESCRIPTOR.fields)
    out = {}
    for field in sorted(fields, key=lambda f: f.number):
        value = getattr(message, field.name)
        if field.type == FD.TYPE_MESSAGE and not _is_repeated(field):
            out[field.name] = to_dict(value, present_only)
        elif field.type == FD.TYPE_MESSAGE:
            out[field.name] = [to_dict(item, present_only) for item in value]
        elif _is_repeated(field):
            out[field.name] = [_plain(field, item) for item in value]
        else:
            out[field.name] = _plain(field, value)
    return out


def check_present_fields(message, path=""):
    """Re-validate every set field (for messages filled by a parser rather than by `assign`)."""
    for field, value in message.ListFields():
        sub_path = join(path, field.name)
        if field.type == FD.TYPE_MESSAGE:
            for item in (value if _is_repeated(field) else [value]):
                check_present_fields(item, sub_path)
        else:
            for item in (value if _is_repeated(field) else [value]):
                _scalar(field, _plain(field, item), sub_path)


def flatten(tree, path=""):
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay leaves."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, join(path, key)))
        else:
            flat[join(path, key)] = value
    return flat


class ConfigSection(MutableMapping):
    """A live view of one sub-message (amp_configs, build_strategy, ...).

    Reads and writes go straight to the strategy, validated, with both `section["key"]` and
    `section.key`; so `strategy.build_strategy.fuse_bn_act_ops = True` really changes the
    strategy (in Fleet it silently changed a copy).
    """

    def __init__(self, parent, name, path):
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_path", path)

    @property
    def _message(self):
        return getattr(self._parent, self._name)

    def __getitem__(self, key):
        return read(self._message, key, self._path)

    def __setitem__(self, key, value):
        assign(self._message, key, value, self._path)

    def __delitem__(self, key):
        lookup(self._message.DESCRIPTOR, key, self._path)
        self._message.ClearField(key)

    def __iter__(self):
        return iter(self._message.DESCRIPTOR.fields_by_name)

    def __len__(self):
        return len(self._message.DESCRIPTOR.fields)

    def __getattr__(self, key):
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]

    def __setattr__(self, key, value):
        self[key] = value

    def __eq__(self, other):
        if isinstance(other, Mapping):
            return to_dict(self._message, present_only=False) == {
                k: (dict(v) if isinstance(v, ConfigSection) else v) for k, v in other.items()}
        return NotImplemented

    def __repr__(self):
        return repr(to_dict(self._message, present_only=False))


class DetachedSection(ConfigSection):
    """A ConfigSection over a standalone message, for `fleetlite.BuildStrategy()` and friends."""

    def __init__(self, message_class, path):
        holder = type("_Holder", (), {})()
        holder.message = message_class()
        super().__init__(holder, "message", path)
