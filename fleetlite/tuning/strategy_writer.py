"""Write the tuner's winner into a strategy file, keeping what the user wrote.

YAML goes through ruamel.yaml's round-trip mode, so comments, key order and the other fields stay
as they were and only the tuned keys change. Prototxt is rewritten from the message (its other
fields kept; prototxt has no comments worth keeping beyond the header). Either way the measured
table is appended as comment lines starting with `#| `, replacing the previous run's, and the
file is validated before it replaces the original.
"""
import io
import os
from pathlib import Path

from fleetlite import schema, strategy_files
from fleetlite.errors import LaunchError
from fleetlite.strategy import DistributedStrategy
from fleetlite.tuning.space import nested_fields

TABLE_PREFIX = "#| "


def _without_table(text):
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(TABLE_PREFIX.rstrip()))


def _set_yaml(text, config):
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    tree = yaml.load(text) or CommentedMap()
    tree.fa.set_block_style()      # an empty strategy file is written as `{}`
    for field, value in config:
        *sections, leaf = field.split(".")
        node = tree
        for section in sections:
            if section not in node:
                node[section] = CommentedMap()
            node = node[section]
        node[leaf] = value
    out = io.StringIO()
    yaml.dump(tree, out)
    return out.getvalue()


def _set_prototxt(text, config, path):
    message = strategy_files.parse_prototxt(text, path)
    schema.update(message, nested_fields(config), "")
    return strategy_files.to_prototxt(message)


def _staged(path):
    return path.with_name(f".{path.name}.tuned{path.suffix}")


def check_writable(path):
    """Refuse a strategy file the winner could not be written into, before the search spends
    its budget: the file must be writable and its folder must take the staged copy that
    replaces it (tried for real, then removed, as permissions alone do not bind root)."""
    path = Path(path)
    fix = "make it writable, or tune a writable copy"
    if os.path.isfile(path) and not os.access(path, os.W_OK):
        raise LaunchError(f"--strategy_file {path}: the file is read-only, so the tuner could not write "
                          f"the winner into it: {fix}")
    staged = _staged(path)
    try:
        staged.write_text("")
        staged.unlink()
    except OSError as exc:
        raise LaunchError(f"--strategy_file {path}: the tuner could not write the winner next to it "
                          f"({exc.strerror}: {exc.filename}): {fix}") from None


def write_winner(path, config, table_lines):
    """Set `config`'s (field, value) pairs in the strategy file at `path` and append the table."""
    path = Path(path)
    text = _without_table(path.read_text())
    if strategy_files.file_format(path) == "yaml":
        body = _set_yaml(text, config)
    else:
        body = _set_prototxt(text, config, str(path))
    body = body if body.endswith("\n") else body + "\n"
    body += "".join(f"{TABLE_PREFIX}{line}".rstrip() + "\n" for line in table_lines)
    staged = _staged(path)
    staged.write_text(body)
    try:
        DistributedStrategy.load(staged).validate()
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)
