"""Write the tuner's winner into a strategy file, keeping what the user wrote.

YAML goes through ruamel.yaml's round-trip mode, so comments, key order and the other fields stay
as they were and only the tuned keys change. Prototxt is rewritten from the message (its other
fields kept; prototxt has no comments worth keeping beyond the header). Either way the measured
table is appended as comment lines starting with `#| `, replacing the previous run's, and the
file is validated before it replaces the original.
"""
import io
import os
import stat
from pathlib import Path

from fleetlite.strategy import schema, files as strategy_files
from fleetlite.errors import LaunchError
from fleetlite.strategy.distributed_strategy import DistributedStrategy
from fleetlite.tuning.space import nested_fields

TABLE_PREFIX = "#| "
_FIX = "make it writable, or tune a writable copy"


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


def _writable_by_its_mode(path):
    """Whether the file's mode bits let this user write it: os.access says yes to root for a 0444
    file, and a file its owner made read-only is not the tuner's to rewrite."""
    st = os.stat(path)
    if st.st_uid == os.geteuid():
        bit = stat.S_IWUSR
    elif st.st_gid in (os.getegid(), *os.getgroups()):
        bit = stat.S_IWGRP
    else:
        bit = stat.S_IWOTH
    return bool(st.st_mode & bit) and os.access(path, os.W_OK)


def _refuse_read_only(path):
    if os.path.isfile(path) and not _writable_by_its_mode(path):
        raise LaunchError(f"--strategy_file {path}: the file is read-only (mode {stat.S_IMODE(os.stat(path).st_mode):04o}), "
                          f"so the tuner could not write the winner into it: {_FIX}")


def check_writable(path):
    """Refuse a strategy file the winner could not be written into, before the search spends
    its budget: the file must be writable by its mode bits (root included) and its folder must
    take the staged copy that replaces it (tried for real, then removed, as permissions alone do
    not bind root)."""
    path = Path(path)
    _refuse_read_only(path)
    staged = _staged(path)
    try:
        staged.write_text("")
        staged.unlink()
    except OSError as exc:
        raise LaunchError(f"--strategy_file {path}: the tuner could not write the winner next to it "
                          f"({exc.strerror}: {exc.filename}): {_FIX}") from None


def write_winner(path, config, table_lines):
    """Set `config`'s (field, value) pairs in the strategy file at `path` and append the table;
    the file keeps its mode (the staged copy that replaces it gets it)."""
    path = Path(path)
    _refuse_read_only(path)
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
        os.chmod(staged, stat.S_IMODE(os.stat(path).st_mode))
        DistributedStrategy.load(staged).validate()
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)
