"""Names Paddle 3 removed, for which fleetlite has the replacement: the worker's bootstrap adds the
fix to the traceback of the AttributeError a script gets (and so to fleetrun's failure report)."""
from fleetlite.paddle_compat.version_gate import needed

REMOVED_IN_PADDLE3 = {
    "module 'paddle.static' has no attribute 'ExecutionStrategy'":
        "fleetlite: Paddle 3 removed paddle.static.ExecutionStrategy; build it with "
        "fleetlite.ExecutionStrategy() (same fields; assign it to strategy.execution_strategy)",
}


def fix_for(exc):
    """The fix fleetlite knows for `exc`, or None."""
    if not isinstance(exc, AttributeError) or not needed("ExecutionStrategy removed"):
        return None
    return REMOVED_IN_PADDLE3.get(str(exc))
