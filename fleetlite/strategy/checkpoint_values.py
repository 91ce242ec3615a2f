"""A recompute checkpoint given as a PIR value, stored in the strategy as a string.

Paddle 3.3.1 cannot name an intermediate PIR value, so `recompute_configs.checkpoints` takes the
value itself (`strategy.recompute_configs = {"checkpoints": [h1, h3]}`, set after building the
forward). The schema holds strings, so the value is stored as a token naming its producing op
and result: "value:<op name>#<op id>:<result index>". Op ids are unique in a process, so the
recompute pass finds the value again in the program it compiles (fleetlite.compile.checkpoint_names).
A token means nothing in another process: files carry layer names instead.
"""
import re

PREFIX = "value:"
_TOKEN = re.compile(r"value:(?P<op>[\w.]+)#(?P<id>\d+):(?P<index>\d+)$")


def stored(item):
    """What the strategy stores for one checkpoint: a PIR value becomes its token; anything else
    is left for the schema to check (a string is a layer name)."""
    producer = getattr(item, "get_defining_op", None)
    if producer is None or isinstance(item, str):
        return item
    op = producer()
    if op is None:
        return item
    return f"{PREFIX}{op.name()}#{op.id()}:{item.index()}"


def parsed(token):
    """(op name, op id, result index) of a value token, or None for a layer name."""
    match = _TOKEN.match(token)
    return (match["op"], int(match["id"]), int(match["index"])) if match else None
