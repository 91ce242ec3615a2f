"""Strategy YAML: PyYAML's safe loader, made strict enough for any file a user (or an attacker)
hands to fleetlite.

- Scalars follow the YAML 1.2 core schema: only true/false are booleans (`yes`, `on`, `no` stay
  strings, so a bool field given one is a type error and an op named `on` keeps its name), `1e-4`
  is a number, and `010` is ten (not PyYAML's octal 8).
- Bounded: nesting deeper than MAX_DEPTH, an alias inside the node it names (a cycle), and more
  than MAX_VALUES values once aliases are expanded (a flood, or the "billion laughs") are errors
  raised as soon as they are seen, never a RecursionError, exhausted memory or minutes of parsing. Tags outside the safe schema (`!!python/object`) are
  refused by the safe constructor.
- Lossless: a key given twice in one mapping is an error; PyYAML would keep the last value and
  drop the user's first without a word.
"""
import re

import yaml

from fleetlite.strategy import schema
from fleetlite.errors import shown

MAX_DEPTH = 16        # a strategy nests 4 levels (field, section, list, item); 16 is generous
MAX_VALUES = 10_000   # values after expanding aliases; a real strategy has a few hundred

_MERGE_TAG = "tag:yaml.org,2002:merge"
_NULL_TAG = "tag:yaml.org,2002:null"


class StrategyYamlError(yaml.MarkedYAMLError):
    """A YAML document that parses but cannot be a strategy file; `problem` is the whole message."""

    def __init__(self, problem, mark):
        super().__init__(problem=problem, problem_mark=mark)


class StrategyLoader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core scalars and the depth, cycle and expansion limits."""

    yaml_implicit_resolvers = {}

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._height = {}   # id(node) -> levels below it, counting through aliases
        self._values = {}   # id(node) -> values in it once every alias is expanded
        self._total = 0     # the document's values so far, so a flood stops as it starts

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None and target.end_mark is None:
                raise StrategyYamlError(f"alias *{event.anchor} is inside the value it names, a cycle "
                                        f"that never ends; copy the values instead", event.start_mark)
            node = super().compose_node(parent, index)
            self._count(self._values[id(node)], event.start_mark)
            return node
        if self._depth > MAX_DEPTH:
            raise _too_deep(self.peek_event().start_mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        children = _children(node)
        self._height[id(node)] = 1 + max((self._height[id(c)] for c in children), default=-1)
        self._values[id(node)] = 1 + sum(self._values[id(c)] for c in children)
        if self._height[id(node)] > MAX_DEPTH:
            raise _too_deep(node.start_mark)
        self._count(1, node.start_mark)
        return node

    def _count(self, values, mark):
        """Add the values one node of the text stands for (an alias: all it names)."""
        self._total += values
        if self._total > MAX_VALUES:
            raise StrategyYamlError(f"holds more than {MAX_VALUES} values, counting each alias expansion; a "
                                    f"strategy needs a few hundred: write them out", mark)

    def construct_object(self, node, deep=False):
        """Build one value; a scalar its tag cannot read (`!!int abc`) is a YAML error at its line."""
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.tag.rsplit(':', 1)[-1]} {shown(node.value)} cannot be read: {exc}",
                node.start_mark) from None

    def construct_yaml_int(self, node):
        """YAML 1.2: `010` is ten (PyYAML's 1.1 reading is eight); 0x and 0o prefixes as written."""
        digits = self.construct_scalar(node).replace("_", "")
        return int(digits, 0 if digits.lstrip("+-")[:2] in ("0x", "0o") else 10)


StrategyLoader.add_constructor("tag:yaml.org,2002:int", StrategyLoader.construct_yaml_int)

# The YAML 1.2 core schema, plus the `<<` merge key that the safe constructor understands.
for _tag, _pattern, _first in (
        (_MERGE_TAG, r"<<", "<"),
        (_NULL_TAG, r"~|null|Null|NULL|", ["~", "n", "N", ""]),
        ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
        ("tag:yaml.org,2002:int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
        ("tag:yaml.org,2002:float", r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", "-+0123456789.")):
    StrategyLoader.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list(_first))


def both_lines(first, second):
    """'lines 3 and 7', or 'both on line 3' (for errors about a field given twice)."""
    return f"lines {first} and {second}" if first != second else f"both on line {first}"


def _too_deep(mark):
    return StrategyYamlError(f"values nested more than {MAX_DEPTH} levels deep; a strategy nests at most 4 "
                             f"(field, section, list, item)", mark)


def _children(node):
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    if isinstance(node, yaml.SequenceNode):
        return node.value
    return []


def parse(text):
    """(the document as Python values or None, {dotted field: line}) from YAML text.

    Raises yaml.YAMLError (StrategyYamlError for the limits and duplicated keys).
    """
    loader = StrategyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None or node.tag == _NULL_TAG:
            return None, {}
        lines = field_lines(node)
        return loader.construct_document(node), lines
    finally:
        loader.dispose()


def field_lines(node, path=""):
    """{dotted field path: 1-based line of its key}; a key given twice in one mapping is an error.

    Keys brought in by a `<<` merge may be overridden (that is what a merge is for); list items
    share their list's path, as the schema's error paths do.
    """
    lines = {}
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            for key_path, line in field_lines(item, path).items():
                lines.setdefault(key_path, line)
    if not isinstance(node, yaml.MappingNode):
        return lines
    merged, seen = [], {}
    for key, value in node.value:
        if key.tag == _MERGE_TAG:
            merged.append(value)
            continue
        key_path = schema.join(path, str(key.value))
        line = key.start_mark.line + 1
        identity = (key.tag, key.value) if isinstance(key, yaml.ScalarNode) else id(key)
        if identity in seen:
            raise StrategyYamlError(f"strategy field '{key_path}' is set twice ({both_lines(seen[identity], line)}): "
                                    f"YAML would silently keep only the last value; delete one", key.start_mark)
        seen[identity] = line
        lines[key_path] = line
        lines.update(field_lines(value, key_path))
    for source in merged:
        for key_path, line in field_lines(source, path).items():
            lines.setdefault(key_path, line)
    return lines
