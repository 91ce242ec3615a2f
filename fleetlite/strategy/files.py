"""Reading and writing strategy messages as prototxt or YAML.

Both formats hold the same schema and the same set of fields: the ones the user set (defaults
are implied by the schema version written in the header). Loading always builds a fresh message,
so a load replaces and never merges or appends; every error names the file and, where the parser
knows it, the line.
"""
import codecs
import os
import re
import stat
from pathlib import Path

import yaml
from google.protobuf import descriptor_pool, text_format

from fleetlite.strategy import schema, yaml_loader as strategy_yaml
from fleetlite.errors import StrategyError, StrategyFileError, UnknownFieldError
from fleetlite.proto import strategy_pb2
from fleetlite.version import __version__

HEADER = f"# fleetlite {__version__} DistributedStrategy\n"
YAML_SUFFIXES = (".yaml", ".yml")
PROTOTXT_SUFFIXES = (".prototxt", ".pbtxt", ".txt")
MAX_FILE_BYTES = 2**20   # the largest real strategy is a few KiB
# Bytes that never occur in a text file: C0 controls but tab, newline and carriage return, and DEL.
_CONTROL_BYTE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


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
    """The text of a regular file of at most MAX_FILE_BYTES, UTF-8 (a leading BOM is dropped)."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise StrategyFileError(path, "is a directory, not a strategy file; name a .yaml or .prototxt file")
        if not stat.S_ISREG(info.st_mode):
            raise StrategyFileError(path, "is not a regular file (a pipe, socket or device); save the strategy "
                                          "to a .yaml or .prototxt file")
        with open(path, "rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise StrategyFileError(path, "no such strategy file") from None
    except PermissionError:
        raise StrategyFileError(path, "cannot read: permission denied; make it readable (chmod u+r)") from None
    except OSError as exc:
        raise StrategyFileError(path, f"cannot read: {exc.strerror}") from None
    except ValueError as exc:   # a NUL character in the path itself
        raise StrategyFileError(path, f"is not a valid path: {exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise StrategyFileError(path, f"is larger than {MAX_FILE_BYTES // 2**20} MiB ({MAX_FILE_BYTES} bytes), "
                                      f"the most a strategy file may hold; is this the right file?")
    return _decode(raw, path)


def _decode(raw, path):
    """UTF-8 text from `raw`, or an error that says where it is not text."""
    if raw.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise StrategyFileError(path, "is UTF-16 or UTF-32 text; save it as UTF-8", 1)
    control = _CONTROL_BYTE.search(raw)
    if control:
        byte = raw[control.start()]
        what = "a NUL byte" if byte == 0 else f"the control byte 0x{byte:02x}"
        raise StrategyFileError(path, f"holds binary data ({what}), not text; is this the right file?",
                                raw.count(b"\n", 0, control.start()) + 1)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise StrategyFileError(path, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} cannot start or continue "
                                      f"a UTF-8 character); save it as UTF-8",
                                raw.count(b"\n", 0, exc.start) + 1) from None


def load(path, kind=None, allow_empty=True):
    """A new DistributedStrategy message from a prototxt or YAML file, fully validated.

    `kind` ('yaml' or 'prototxt') overrides the guess from the file name. With
    `allow_empty=False`, a file with nothing but comments is an error (YAML's explicit `{}` is
    not: it says "all defaults" on purpose).
    """
    text = _read_text(path)
    kind = kind or file_format(path)
    parse = parse_yaml if kind == "yaml" else parse_prototxt
    return parse(text, path, allow_empty)


def _no_fields(path):
    return StrategyFileError(path, "no strategy fields: the file is empty, holds only comments or is null; write "
                                   "the fields you meant ({} in YAML for all defaults), or pass --allow-empty")


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
_REPEATED = re.compile(r'should not have multiple "(\w+)" fields')
_BAD_VALUE = re.compile(r"(?:Couldn't parse \w+|Value out of range): (.*)$")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def parse_prototxt(text, path="<prototxt>", allow_empty=True):
    message = strategy_pb2.DistributedStrategy()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise StrategyFileError(path, _prototxt_problem(exc, text), exc.GetLine()) from None
    if not allow_empty and not message.ListFields():
        raise _no_fields(path)
    try:
        schema.check_present_fields(message)
    except StrategyError as exc:
        raise StrategyFileError(path, str(exc), _prototxt_line(text, exc.field)) from None
    return message


def _prototxt_line(text, field):
    return next((line for line, _, name in _field_positions(text) if name == field), None)


def in_file(path, error):
    """`error`, found in the strategy loaded from `path` (a rule across fields), as a
    StrategyFileError at the line of the field it names."""
    field = getattr(error, "field", None)
    line = None
    if field:
        text = _read_text(path)
        if file_format(path) == "yaml":
            line = strategy_yaml.parse(text)[1].get(field)
        else:
            line = _prototxt_line(text, field)
    return StrategyFileError(path, str(error), line)


def _prototxt_problem(exc, text):
    """protobuf's complaint, rephrased as the schema's own message where it names a field or value."""
    detail = re.sub(r"^\d+:\d+ : ", "", str(exc))
    detail = re.sub(r"^'.*?': ", "", detail)          # protobuf quotes the whole line first
    positions = _field_positions(text)
    before = [(line, field) for line, column, field in positions
              if (line, column) <= (exc.GetLine() or 0, exc.GetColumn() or 0)]
    field = before[-1][1] if before else None
    unknown = _NO_FIELD.search(detail)
    if unknown:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(unknown.group(1))
        name = field if field and field.rsplit(".", 1)[-1] == unknown.group(2) else unknown.group(2)
        return str(UnknownFieldError(name, descriptor.fields_by_name.keys(), descriptor.name))
    repeated = _REPEATED.search(detail)
    if repeated and field:
        first = next(line for line, _, other in positions if other == field)
        return (f"strategy field '{field}' is set twice ({strategy_yaml.both_lines(first, before[-1][0])}): a field "
                f"that is not a list takes one value; delete one")
    if "does not have extensions" in detail:
        return "bracketed [extension] names are not strategy fields; remove them"
    value = _BAD_VALUE.search(detail)
    number = _number(value.group(1)) if value else None
    if number is not None and field:
        try:
            schema.check_value(strategy_pb2.DistributedStrategy.DESCRIPTOR, field, number)
        except StrategyError as error:
            return str(error)
    return f"malformed prototxt{f' at strategy field {field!r}' if field else ''}: {detail}"


def _number(text):
    """The int or float a prototxt value spells, or None."""
    for convert in (lambda t: int(t, 0), float):
        try:
            return convert(text)
        except ValueError:
            continue
    return None


def _field_positions(text):
    """[(line, column, dotted field)] for every field name in prototxt text, in order (1-based).

    Uses protobuf's own tokenizer, so strings and comments never look like fields (its position is
    only exposed as `_line`/`_column`); stops quietly where the text stops being prototxt (the
    parser reports that).
    """
    tokenizer = text_format.Tokenizer(text.split("\n"))
    positions, sections, last = [], [], None
    try:
        while not tokenizer.AtEnd():
            token, line, column = tokenizer.token, tokenizer._line + 1, tokenizer._column + 1
            tokenizer.NextToken()
            if token in ("{", "<"):
                sections.append(last)
            elif token in ("}", ">") and sections:
                sections.pop()
            elif _IDENTIFIER.fullmatch(token) and tokenizer.token in (":", "{", "<"):
                last = schema.join((sections[-1] or "") if sections else "", token)
                positions.append((line, column, last))
    except text_format.ParseError:
        pass
    return positions


def parse_yaml(text, path="<yaml>", allow_empty=True):
    try:
        tree, lines = strategy_yaml.parse(text)
    except yaml.YAMLError as exc:
        raise StrategyFileError(path, *_yaml_problem(exc, text)) from None
    if tree is None and not allow_empty:
        raise _no_fields(path)
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise StrategyFileError(path, f"a strategy file must be a mapping of field: value, not a "
                                      f"{type(tree).__name__}; write one 'field: value' per line", 1)
    message = strategy_pb2.DistributedStrategy()
    try:
        schema.update(message, tree, "")
    except StrategyError as exc:
        raise StrategyFileError(path, str(exc), lines.get(exc.field)) from None
    return message


_YAML_HINTS = (
    ("'\\t'", "replace the tab with spaces (YAML indents with spaces only)"),
    ("single document", "a strategy file is one document: remove the second '---'"),
    ("constructor for the tag", "tags that build objects are refused: write plain values"),
)


def _yaml_problem(exc, text):
    """(message, line) for a YAML error, one line, with the fix where the cause is common."""
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        return f"malformed YAML: the character #x{exc.character:04x} is not allowed in YAML text", line
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else None
    if isinstance(exc, strategy_yaml.StrategyYamlError):
        return exc.problem, line
    words = ", ".join(part for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
    hints = [fix for needle, fix in _YAML_HINTS if needle in words]
    return f"malformed YAML: {words or exc}" + "".join(f"; {fix}" for fix in hints), line
