"""CompileReport: what the compiler did to a program, pass by pass.

One record per registered pass (applied, skipped with the reason, or off) and one per
requested knob that no pass reads, so every knob the user set shows up with what became of
it. The same data prints as a table (rank 0 at `minimize`, `fleetlite explain`: a row per pass
applied or skipped, the knobs that are off named in one line) and dumps as JSON, every record
in full (`fleetlite explain --json`, tests).
"""
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

APPLIED, SKIPPED, OFF = "applied", "skipped", "off"


@dataclass
class PassRecord:
    name: str
    phase: str
    status: str
    config: Dict[str, Any] = field(default_factory=dict)
    order: Optional[int] = None     # position in the run order (None: did not run)
    reason: Optional[str] = None    # why it was skipped
    summary: str = ""
    ops_added: List[str] = field(default_factory=list)     # op names, in program order
    ops_removed: List[str] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)


@dataclass
class CompileReport:
    topology: str
    records: List[PassRecord] = field(default_factory=list)
    buckets: List[Dict[str, Any]] = field(default_factory=list)
    rings: List[Dict[str, Any]] = field(default_factory=list)
    runtime_flags: Dict[str, Any] = field(default_factory=dict)
    startup: Dict[str, Any] = field(default_factory=dict)
    step_events: Optional[List[Dict[str, Any]]] = None   # the timeline's compiled events (step_events), if asked

    def record(self, name):
        return next(r for r in self.records if r.name == name)

    @property
    def applied(self):
        """Names of the passes that changed the program, in the order they ran."""
        ran = sorted((r for r in self.records if r.status == APPLIED), key=lambda r: r.order)
        return [r.name for r in ran]

    def to_dict(self):
        return asdict(self)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def table(self):
        lines = [f"fleetlite compile report: {self.topology}"]
        rows = [("#", "pass", "phase", "status", "ops", "what happened")]
        for r in self.records:
            if r.status == OFF:
                continue
            ops = f"+{len(r.ops_added)} -{len(r.ops_removed)}" if r.status == APPLIED else ""
            what = r.summary if r.status == APPLIED else (r.reason or "")
            rows.append((str(r.order or "-"), r.name, r.phase, r.status, ops, what))
        lines += _columns(rows)
        off = [r.name for r in self.records if r.status == OFF]
        if off:
            lines.append("off: " + ", ".join(off))
        configs = [f"  {r.name}: " + ", ".join(f"{k}={v!r}" for k, v in r.config.items())
                   for r in self.records if r.config and r.status != OFF]
        if configs:
            lines += ["config used:"] + configs
        if self.buckets:
            lines.append("buckets (issue order):")
            rows = [("#", "dtype", "size", "ring", "path", "gradients")]
            rows += [(str(b["bucket"]), b["dtype"], human_bytes(b["bytes"]), str(b["ring"]), b["path"],
                      _names(b["gradients"])) for b in self.buckets]
            lines += ["  " + line for line in _columns(rows)]
        if self.rings:
            lines.append("rings (this rank's members):")
            rows = [("ring", "kind", "size", "members")]
            rows += [(str(r["ring"]), r["kind"], str(r["size"]), _names(r["members"])) for r in self.rings]
            lines += ["  " + line for line in _columns(rows)]
        if self.runtime_flags:
            lines.append("runtime flags: " + ", ".join(f"{k}={v}" for k, v in self.runtime_flags.items()))
        if self.startup:
            lines.append("startup program: " + ", ".join(f"{k}={v}" for k, v in self.startup.items()))
        return "\n".join(lines)


def human_bytes(nbytes):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def _names(items, limit=4):
    items = [str(i) for i in items]
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def _columns(rows):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]
