"""sync_nccl_allreduce: wait for each gradient all-reduce before going on (GPU).

NCCL collectives run asynchronously on their own stream; this knob makes Paddle synchronise
that stream after each all-reduce (`FLAGS_sync_nccl_allreduce`, which Paddle defines with the
same default as the strategy field). The pass passes the strategy's value on either way, so
`false` is honoured too. gloo collectives return only when the sum is done, so on CPU there
is nothing to wait for and the knob is reported as skipped.
"""
from fleetlite.strategies.base import Pass, PassResult, Phase

FLAG = "FLAGS_sync_nccl_allreduce"


class SyncNcclAllReduce(Pass):
    name = "sync_nccl_allreduce"
    decides_without_program = True
    phase = Phase.EXECUTION
    requires = ("data_parallel",)
    reads = ("sync_nccl_allreduce",)

    def enabled(self):
        return True

    def applicable(self, topology, program):
        if topology.device != "gpu":
            return "gloo collectives are synchronous: there is no stream to wait for"
        return None

    def apply(self, context):
        value = bool(self.strategy.sync_nccl_allreduce)
        context.runtime_flags[FLAG] = value
        return PassResult(f"{FLAG} = {value}", {"flags": {FLAG: value}})
