"""The registered passes, handed down to this room and the compiler by fleetlite's face.

The passes live in `strategies/`, above the compiler, and the rooms below them still need them:
validate() asks the passes what they require of a strategy, compile() instantiates them. So
neither imports `strategies/`: `fleetlite/__init__` hands the registry in once, as a function,
so Paddle (which the passes import) loads only when a pass is first needed.
"""
_load = None


def hand_in(load):
    """`load()` returns the registry: `REGISTRY` (the pass classes in order) and
    `check_strategy(strategy, topology)` (what the passes require of a strategy)."""
    global _load
    _load = load


def passes():
    """The registered pass classes (none until the registry is handed in)."""
    return tuple(_load().REGISTRY) if _load is not None else ()


def check_strategy(strategy, topology):
    """Raise StrategyConflictError for what the registered passes cannot run (nothing is checked
    until the registry is handed in)."""
    if _load is not None:
        _load().check_strategy(strategy, topology)
