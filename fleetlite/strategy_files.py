"""Reading and writing strategy messages as prototxt or YAML.

Both formats hold the same schema and the same set of fields: the ones the user set (defaults
are implied by the schema version written in the header). Loading always builds a fresh message,
so a load replaces and never merges or appends; every error names the file and, where the parser
knows it, the line.
"""
import re
from pathlib import Path

import yaml
from google.protobuf import descriptor_pool, text_format

from fleetlite import schema
from fleetlite.errors import StrategyError, StrategyFileError, UnknownFieldError
from fleetlite.proto import strategy_pb2
from fleetlite.version import __version__

HEADER = f"# fleetlite {__version__} DistributedStrategy\n"
YAML_SUFFIXES = (".yaml", ".yml")
PROTOTXT_SUFFIXES = (".prototxt", ".pbtxt", ".txt")


def file_format(path):
    """'yaml' or 'prototxt' from the file name; anything else is an error that lists both."""
    suffix = Path(path).suffix.lower()
    if suffix in YAML_SUFFIXES:
        return "yaml"
    if suffix in PROTOTXT_SUFFIXES:
        return "prototxt"
    raise StrategyFileError(path, f"unknown strategy file type '{suffix}': use one of "
                            f"{', '.join(YAML_SUFFIXES + PROTOTXT_SUFFIXES)}")


def _read_text(path):
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise StrategyFileError(path, "no such strategy file") from None
    except OSError as exc:
        raise StrategyFileError(path, f"cannot read: {exc.strerror}") from None


def load(path, kind=None):
    """A new DistributedStrategy message from a prototxt or YAML file, fully validated.

    `kind` ('yaml' or 'prototxt') overrides the guess from the file name.
    """
    kind = kind or file_format(path)
    text = _read_text(path)
    return parse_yaml(text, path) if kind == "yaml" else parse_prototxt(text, path)


def save(message, path, kind=None):
    kind = kind or file_format(path)
    text = to_yaml(message) if kind == "yaml" else to_prototxt(message)
    Path(path).write_text(text)


def to_prototxt(message):
    return HEADER + text_format.MessageToString(message)


def to_yaml(message):
    body = schema.to_dict(message, present_only=True)
    return HEADER + (yaml.safe_dump(body, sort_keys=False, default_flow_style=False) if body else "{}\n")


_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')


def parse_prototxt(text, path="<prototxt>"):
    message = strategy_pb2.DistributedStrategy()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        line = exc.GetLine() if hasattr(exc, "GetLine") else None
        unknown = _NO_FIELD.search(str(exc))
        if unknown:
            descriptor = descriptor_pool.Default().FindMessageTypeByName(unknown.group(1))
            hint = UnknownFieldError(unknown.group(2), descriptor.fields_by_name.keys(), descriptor.name)
            raise StrategyFileError(path, str(hint), line) from None
        detail = re.sub(r"^\d+:\d+ : ", "", str(exc))
        raise StrategyFileError(path, f"malformed prototxt: {detail}", line) from None
    try:
        schema.check_present_fields(message)
    except StrategyError as exc:
        raise StrategyFileError(path, str(exc), _prototxt_line(text, exc.field)) from None
    return message


def _prototxt_line(text, field_path):
    leaf = field_path.rsplit(".", 1)[-1] if field_path else None
    for number, line in enumerate(text.splitlines(), 1):
        if leaf and re.match(rf"\s*{re.escape(leaf)}\s*[:{{]", line):
            return number
    return None


def parse_yaml(text, path="<yaml>"):
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise StrategyFileError(path, f"malformed YAML: {problem}", line) from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise StrategyFileError(path, "a strategy file must be a mapping of field: value", 1)
    message = strategy_pb2.DistributedStrategy()
    try:
        schema.update(message, tree, "")
    except StrategyError as exc:
        raise StrategyFileError(path, str(exc), _key_lines(node).get(exc.field)) from None
    return message


def _key_lines(node, path=""):
    """Dotted key path -> 1-based line, from a composed YAML node tree."""
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            key_path = schema.join(path, str(key.value))
            lines[key_path] = key.start_mark.line + 1
            lines.update(_key_lines(value, key_path))
    return lines
