"""Generate docs/strategy_reference.md from the proto's field comments and the range rules.

`python -m fleetlite.strategy.reference_doc > docs/strategy_reference.md` (or `make docs`); a test fails
when the committed page differs, so the reference cannot drift from the schema.
"""
import re
from pathlib import Path

from fleetlite.strategy.field_rules import RULES
from fleetlite.proto import strategy_pb2

PROTO = Path(__file__).parents[1] / "proto" / "strategy.proto"
_MESSAGE = re.compile(r"^message (\w+) \{")
_FIELD = re.compile(r"^\s*(optional|repeated) ([\w.]+) (\w+) = (\d+)(?: \[ default = (.+) \])?;")


def parse_proto(text):
    """{message: [(name, label, type, default, comment)]} and the top-of-message comments."""
    messages, current, comment = {}, None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("//"):
            comment.append(stripped[2:].strip())
            continue
        start = _MESSAGE.match(stripped)
        field = _FIELD.match(line)
        if start:
            current = start.group(1)
            messages[current] = []
        elif field and current:
            label, type_name, name, _, default = field.groups()
            messages[current].append((name, label, type_name, default, " ".join(comment)))
        comment = []
    return messages


def section_paths():
    """Message name -> dotted path of the field that holds it, e.g. AMPConfig -> amp_configs."""
    paths = {"DistributedStrategy": ""}
    pending = [(strategy_pb2.DistributedStrategy.DESCRIPTOR, "")]
    while pending:
        descriptor, prefix = pending.pop()
        for field in descriptor.fields:
            if field.message_type is not None and field.message_type.name not in paths:
                path = f"{prefix}.{field.name}" if prefix else field.name
                paths[field.message_type.name] = path
                pending.append((field.message_type, path))
    return paths


def _default(label, type_name, default):
    if label == "repeated":
        return "[]"
    if default is not None:
        return default.strip('"') if type_name == "string" else default
    return "{}" if type_name[0].isupper() and type_name != "Mode" else "(unset)"


def render():
    messages = parse_proto(PROTO.read_text())
    paths = section_paths()
    lines = ["# Strategy reference", "",
             "Generated from `fleetlite/proto/strategy.proto` and `fleetlite/strategy/field_rules.py` by "
             "`make docs`; do not edit by hand.", "",
             "Every field can be set as an attribute (`strategy.amp = True`), in a section "
             "(`strategy.amp_configs = {\"init_loss_scaling\": 1024}`), in YAML or in prototxt. "
             "Unknown names, wrong types and values outside *Allowed* are errors.", ""]
    for message, fields in messages.items():
        path = paths.get(message)
        if path is None:
            continue
        title = "DistributedStrategy (top level)" if not path else f"`{path}` ({message})"
        lines += [f"## {title}", "", "| field | type | default | allowed | meaning |",
                  "|---|---|---|---|---|"]
        for name, label, type_name, default, comment in fields:
            dotted = f"{path}.{name}" if path else name
            rule = RULES.get(dotted)
            shown_type = f"list of {type_name}" if label == "repeated" else type_name
            lines.append(f"| `{name}` | {shown_type} | {_default(label, type_name, default)} | "
                         f"{rule.describe() if rule else ''} | {comment.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
