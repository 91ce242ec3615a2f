"""Which strategy fields the user asked for: written explicitly (even with the default value) or
changed from the default.

Some knobs default to "on" in Fleet's schema (`build_strategy.fuse_bn_add_act_ops`) or have a
default that would change Paddle's behaviour if acted on (`execution_strategy.num_threads: 1`
means a serial executor); fleetlite acts on those only when the user wrote them.
"""
from fleetlite.strategy import schema


def requested(strategy, dotted):
    """True if `dotted` (e.g. 'execution_strategy.num_threads') was written or differs from its default."""
    return dotted in schema.flatten(strategy.to_dict()) or dotted in strategy.non_default()
