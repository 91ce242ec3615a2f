"""FlagKnob: a strategy field that becomes a Paddle flag, set for the whole process at `minimize`.

Paddle 3 dropped ExecutionStrategy and most of BuildStrategy; what survives of those knobs is
process-wide flags (`FLAGS_new_executor_*`, cuDNN flags). The pass only records the flag in the
report's runtime flags; `DistributedOptimizer.minimize` sets them, so they also apply to every
other program the process runs.
"""
from fleetlite.requested_fields import requested
from fleetlite.strategies.base import Pass, PassResult, Phase, read_field


class FlagKnob(Pass):
    phase = Phase.EXECUTION
    decides_without_program = True
    flag = None                   # the Paddle flag the field becomes
    devices = ("cpu", "gpu")      # where the flag exists and does something
    elsewhere = None              # why it is skipped on other devices

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.reads = (cls.name,)

    def enabled(self):
        return requested(self.strategy, self.name)

    def applicable(self, topology, program):
        return None if topology.device in self.devices else self.elsewhere

    def flag_value(self):
        return read_field(self.strategy, self.name)

    def explain(self, value):
        """One line for the report: what the flag value does."""
        return f"{self.flag} = {value}"

    def apply(self, context):
        value = self.flag_value()
        context.runtime_flags[self.flag] = value
        return PassResult(self.explain(value), {"flags": {self.flag: value}})
