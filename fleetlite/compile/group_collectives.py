"""Collectives on gloo sub-group communicators in static CPU programs (group_collectives.cc).

Paddle 3.3.1's CPU collective kernels ignore `ring_id`: every static collective of a process
runs on the one communicator attached to its CPU device context (shared/notes/gloo_subgroups.md).
A process can still hold many gloo communicators, one per key in Paddle's CommContextManager;
these compiled operators look theirs up by key, so an intra-node or inter-node group really is
that group on the wire (fleetlite.paddle_compat.ring_aware_collectives says for which Paddle).
The communicators are created by fleetlite.runtime.subgroups under the key `comm_key(...)`
names. Built once, cached and loaded by fleetlite.compile.kernel_library; where they cannot be
built, `load_error()` says why and the gloo lowering emulates every ring on ring 0 instead.
"""
import ctypes
import functools
import os

from fleetlite.paddle_compat import quiet_warnings as paddle_noise, ring_aware_collectives
from fleetlite.compile.kernel_library import KernelLibrary

with paddle_noise.importing_paddle():       # a plain import of this module may be Paddle's first
    import paddle

HERE = os.path.dirname(os.path.abspath(__file__))
# The wheel ships gloo_comm_context.h but not the gloo headers it includes; it only names these classes.
GLOO_STUBS = {
    "gloo/rendezvous/context.h": "#pragma once\nnamespace gloo { namespace rendezvous { class Context; } }\n",
    "gloo/rendezvous/store.h": "#pragma once\nnamespace gloo { namespace rendezvous { class Store; } }\n",
    "gloo/transport/tcp/device.h": "#pragma once\nnamespace gloo { namespace transport { class Device; } }\n",
}
LIBRARY = KernelLibrary("fleetlite_group_collectives", os.path.join(HERE, "group_collectives.cc"),
                        "the gloo sub-group collectives", "sub-group collectives run emulated on ring 0",
                        headers=GLOO_STUBS)


def load_error():
    """None once the ops are registered in this process; otherwise why they are not."""
    return ring_aware_collectives.refusal() or LIBRARY.load_error()


ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE_SCATTER = (
    f"fleetlite_group_{name}" for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter"))
OP_NAMES = tuple(f"custom_op.{name}" for name in (ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE_SCATTER))  # in a program


def comm_key(channel, members):
    """The communicator key of the group `members` (global ranks, in group order); `channel`
    tells apart communicators over the same ranks (nccl_comm_num's world copies). Never an
    integer, so no native op's ring_id resolves to it."""
    return f"fleetlite/{channel}/{'.'.join(str(rank) for rank in members)}"


def all_reduce(x, key, nranks):
    return paddle._C_ops._run_custom_op(ALL_REDUCE, x, key, nranks, 0)[0]


def all_gather(x, key, nranks):
    return paddle._C_ops._run_custom_op(ALL_GATHER, x, key, nranks, 0)[0]


def broadcast(x, key, nranks, root):
    return paddle._C_ops._run_custom_op(BROADCAST, x, key, nranks, root, 0)[0]


def reduce_scatter(x, key, nranks):
    return paddle._C_ops._run_custom_op(REDUCE_SCATTER, x, key, nranks, 0)[0]


def bind_world_ring():
    """Attach ring 0 to the CPU device context again (what an eager collective on another ring
    leaves there is what every later static ring-0 collective would use). False where the
    library is not loaded or ring 0 does not exist."""
    if load_error() is not None:
        return False
    return bool(_bind_function()())


@functools.cache
def _bind_function():
    return ctypes.CDLL(LIBRARY.library_path()).fleetlite_bind_world_ring
