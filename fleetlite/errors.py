"""The errors fleetlite raises on bad input: each names the cause and the fix.

Everything a user can get wrong (a strategy field, a file, a launch flag, a knob combination)
raises a subclass of FleetliteError, so CLIs can print one line and exit non-zero instead of a
traceback, and tests can assert on the field that was named.
"""
import difflib
import re
import reprlib

# Values quoted in messages are shortened, so a 1 MiB list or string stays a one-line error.
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 60, 60, 8, 4, 3


def shown(value):
    """repr() of a user value, shortened for an error message."""
    return _SHORT.repr(value)


def closest_name(name, candidates):
    """The candidate `name` most likely meant: same spelling in another case first, then difflib's
    closest (compared case-insensitively, so 'fuse_grad_size_in_mb' finds 'fuse_grad_size_in_MB')."""
    by_lower = {}
    for candidate in candidates:
        by_lower.setdefault(candidate.lower(), candidate)
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


class FleetliteError(Exception):
    """Base of every user-facing fleetlite error."""


class StrategyError(FleetliteError, ValueError):
    """A strategy field or value is wrong. Carries the dotted field path, the value and the fix."""

    def __init__(self, message, field=None, value=None, fix=None):
        self.field, self.value, self.fix = field, value, fix
        text = message if fix is None else f"{message}; {fix}"
        super().__init__(text)


class UnknownFieldError(StrategyError, AttributeError, TypeError):
    """A field name that the schema does not have (a typo, or a Fleet field fleetlite dropped).
    A TypeError as well because Paddle's strategy raises one, so `except TypeError` still works."""

    def __init__(self, field, candidates, where="DistributedStrategy"):
        close = closest_name(field.rsplit(".", 1)[-1], candidates)
        fix = f"did you mean '{close}'?" if close else f"valid fields of {where}: {', '.join(sorted(candidates))}"
        super().__init__(f"unknown strategy field '{field}'", field=field, fix=fix)


class FieldTypeError(StrategyError, TypeError):
    """A value of the wrong type for its field."""

    def __init__(self, field, value, expected):
        super().__init__(
            f"strategy field '{field}' expects {expected}, got "
            + ("nothing (null)" if value is None else f"{type(value).__name__} {shown(value)}"),
            field=field, value=value, fix=f"set it to {expected}")


class FieldRangeError(StrategyError):
    """A value outside its field's allowed range or choices."""

    def __init__(self, field, value, allowed):
        super().__init__(f"strategy field '{field}' = {shown(value)} is out of range",
                         field=field, value=value, fix=f"allowed: {allowed}")


class StrategyConflictError(StrategyError):
    """Two knobs that cannot be used together, or a knob that cannot work on this topology."""


class StrategyFileError(FleetliteError):
    """A strategy file that cannot be read: missing, malformed, or with a bad field at a line.

    Always one line: `path:line: cause; fix` (a path with control characters is quoted).
    """

    def __init__(self, path, message, line=None):
        self.path, self.line = path, line
        name = str(path) if str(path).isprintable() else ascii(str(path))
        where = f"{name}:{line}" if line is not None else name
        super().__init__(f"{where}: " + re.sub(r"\s*[\r\n]\s*", " ", str(message)))


class TopologyError(FleetliteError):
    """The environment describes an impossible or contradictory set of workers."""


class CompileError(FleetliteError):
    """A pass cannot be ordered, applied, or left the program in an invalid state."""


class LaunchError(FleetliteError):
    """fleetrun cannot start the job as asked: a bad flag, a failed pre-flight check (missing
    script, this host not in --ips, a device that does not exist, a port in use)."""


class DataError(FleetliteError, ValueError):
    """A dataset, sampler or record file that cannot give every rank its batches as asked."""


class DataSettingsError(StrategyConflictError, DataError):
    """A `data_configs` setting no loader can honour: raised alike by `validate` (a strategy
    error, at the field's line) and by the loaders (a data error)."""


class ForeignLauncherError(LaunchError):
    """fleet.init in a worker that PaddlePaddle's own launcher started: the message names the
    `fleetlite run` command that starts the same job."""


class ScriptDone(BaseException):
    """fleetlite has what it ran the user's script for (the compile report under `fleetrun
    --explain`, a tuning trial's timed steps): the worker's entry point ends the script there,
    with exit status 0. A BaseException, as SystemExit is, so a script's `except Exception`
    does not swallow it."""


class DygraphError(FleetliteError):
    """A dygraph script asked for something fleet.train_step or fleet's eager loop cannot do."""
