"""The gloo communicators of a compiled CPU program's sub-groups (intra-node, inter-node, the
extra world rings of nccl_comm_num): one per group, each under its own key.

The gloo lowering (strategies/gloo_lowering.py) runs each collective on a ring other than ring 0
as a compiled op that looks its communicator up by key (fleetlite.compile.group_collectives),
and lists in the compile report the (key, members) of this rank's groups, in ring order.
minimize `expect`s them; they are created as soon as the job is up: at once if the process group
exists, else right after the deferred rendezvous (process_group.connect), so before the first
program with collectives runs. Every rank walks the list in the same order and joins its own
group of each ring, so every group's handshake (the key is its store prefix) finds all its
members and none waits on another.

`bind_world_ring` closes a trap of Paddle's CPU kernels (paddle_compat.ring_aware_collectives):
an eager `paddle._C_ops` collective on a ring other than 0 leaves that ring attached to the
process's CPU device context, and every static ring-0 collective run afterwards would sum over
it. fleetlite's Executor.run hook binds ring 0 back before each run (a local pointer write).

Paddle has no call that removes a communicator: like ring 0 they live as long as the process
and close with it. A key is created once per process, whichever programs use it.
"""
import paddle
from paddle.base import core

from fleetlite.compile import group_collectives
from fleetlite.errors import TopologyError

_pending = []       # [(key, members, rank)] not created yet
_created = {}       # key -> members


def expect(communicators, rank):
    """Note the communicators [(key, members)] this `rank` joins (created by `create_pending`)."""
    for key, members in communicators:
        if key not in _created and all(key != noted for noted, _, _ in _pending):
            _pending.append((key, tuple(members), rank))


def create_pending(store):
    """Create every noted communicator on `store` (the job's rendezvous store), in the order noted."""
    while _pending:
        key, members, rank = _pending[0]
        try:
            core.CommContextManager.create_gloo_comm_context(store, key, members.index(rank), len(members))
        except Exception as exc:    # Paddle raises its own error types, with gloo's text
            raise TopologyError(f"rank {rank} could not join the gloo group of ranks {list(members)} ({key}): "
                                f"{exc}; every rank of the group must run the same compiled program") from exc
        _pending.pop(0)
        _created[key] = members


def created():
    """{key: members} of the sub-group communicators this process holds."""
    return dict(_created)


def bind_world_ring():
    """Attach ring 0 to the CPU device context again (CPU processes only; where the sub-group
    library cannot be loaded, say so once and leave the context as it is)."""
    if paddle.device.get_device() == "cpu":
        group_collectives.bind_world_ring()
