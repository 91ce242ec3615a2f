"""The errors fleetlite raises on bad input: each names the cause and the fix.

Everything a user can get wrong (a strategy field, a file, a launch flag, a knob combination)
raises a subclass of FleetliteError, so CLIs can print one line and exit non-zero instead of a
traceback, and tests can assert on the field that was named.
"""
import difflib


class FleetliteError(Exception):
    """Base of every user-facing fleetlite error."""


class StrategyError(FleetliteError, ValueError):
    """A strategy field or value is wrong. Carries the dotted field path, the value and the fix."""

    def __init__(self, message, field=None, value=None, fix=None):
        self.field, self.value, self.fix = field, value, fix
        text = message if fix is None else f"{message}; {fix}"
        super().__init__(text)


class UnknownFieldError(StrategyError, AttributeError):
    """A field name that the schema does not have (a typo, or a Fleet field fleetlite dropped)."""

    def __init__(self, field, candidates, where="DistributedStrategy"):
        leaf = field.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, list(candidates), n=1, cutoff=0.6)
        fix = f"did you mean '{close[0]}'?" if close else f"valid fields of {where}: {', '.join(sorted(candidates))}"
        super().__init__(f"unknown strategy field '{field}'", field=field, fix=fix)


class FieldTypeError(StrategyError, TypeError):
    """A value of the wrong type for its field."""

    def __init__(self, field, value, expected):
        super().__init__(
            f"strategy field '{field}' expects {expected}, got {type(value).__name__} {value!r}",
            field=field, value=value, fix=f"set it to {expected}")


class FieldRangeError(StrategyError):
    """A value outside its field's allowed range or choices."""

    def __init__(self, field, value, allowed):
        super().__init__(f"strategy field '{field}' = {value!r} is out of range",
                         field=field, value=value, fix=f"allowed: {allowed}")


class StrategyConflictError(StrategyError):
    """Two knobs that cannot be used together, or a knob that cannot work on this topology."""


class StrategyFileError(FleetliteError):
    """A strategy file that cannot be read: missing, malformed, or with a bad field at a line."""

    def __init__(self, path, message, line=None):
        self.path, self.line = path, line
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


class TopologyError(FleetliteError):
    """The environment describes an impossible or contradictory set of workers."""


class CompileError(FleetliteError):
    """A pass cannot be ordered, applied, or left the program in an invalid state."""


class LaunchError(FleetliteError):
    """fleetrun cannot start the job as asked: a bad flag, a failed pre-flight check (missing
    script, this host not in --ips, a device that does not exist, a port in use)."""


class DataError(FleetliteError, ValueError):
    """A dataset, sampler or record file that cannot give every rank its batches as asked."""
