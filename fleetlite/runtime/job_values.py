"""`fleet.util`: numpy values across the job's ranks, between executor runs.

Metrics and early stopping need a job-wide sum, max or min of host values (a loss, a sample
count, a "stop now" flag) outside the training program. These calls run on the job's eager
process group (see process_group: eager collectives are fine between executor runs, never
inside one) and switch to Paddle's dynamic mode for the call. Every rank must make the same
calls in the same order, as with any collective (under fleetrun, ranks waiting in different
ones are stopped after its stall deadline, see collective_waits). In a job of one process
they return at once.
"""
import numpy as np
import paddle
import paddle.distributed as dist

from fleetlite.runtime import plain_values, process_group
from fleetlite.runtime.collective_waits import waiting_in
from fleetlite.errors import FleetliteError

MODES = ("sum", "max", "min")
COMM_WORLDS = ("worker", "all")   # a collective job has no servers: both mean every rank


def _check_comm_world(comm_world):
    if comm_world not in COMM_WORLDS:
        raise FleetliteError(f"comm_world={comm_world!r}: a collective job has workers only; "
                             f"use comm_world='worker' (the default)")


def _collective_dtype(array):
    """The dtype the reduction runs in: gloo reduces float32/float64/int32/int64, so other
    floats widen to float64 and booleans and other integers to int64."""
    if array.dtype in (np.float32, np.float64, np.int32, np.int64):
        return array.dtype
    if array.dtype.kind == "f":
        return np.dtype(np.float64)
    if array.dtype.kind in "biu":
        return np.dtype(np.int64)
    raise FleetliteError(f"fleet.util.all_reduce reduces numbers, got dtype {array.dtype}: pass an int, "
                         f"a float, or a numpy array of them")


def _all_gather_bytes(data):
    """Every rank's `data` (bytes of any length), in rank order: lengths first, then the bytes
    padded to the longest (what Paddle's all_gather_object does, minus the pickle)."""
    lengths = []
    dist.all_gather(lengths, paddle.to_tensor(np.array([len(data)], np.int64)))
    lengths = [int(length.item()) for length in lengths]
    padded = np.zeros(max(lengths), np.uint8)
    padded[:len(data)] = np.frombuffer(data, np.uint8)
    parts = []
    dist.all_gather(parts, paddle.to_tensor(padded))
    return [part.numpy()[:length].tobytes() for part, length in zip(parts, lengths)]


class JobValues:
    """Fleet's `UtilBase` for collective jobs; `topology` returns this process's Topology."""

    def __init__(self, topology):
        self._topology = topology

    def all_reduce(self, input, mode="sum", comm_world="worker"):
        """`input` (a number, list or array) reduced over every rank by `mode` (sum, max or
        min): a numpy array of its shape, in its dtype (int64 for booleans and small integers,
        float64 for small floats)."""
        _check_comm_world(comm_world)
        if mode not in MODES:
            raise FleetliteError(f"fleet.util.all_reduce mode={mode!r}: use one of {', '.join(MODES)}")
        array = np.asarray(input)
        array = array.astype(_collective_dtype(array), copy=False)
        if self._topology().world_size == 1:
            return array.copy()
        process_group.connect("fleet.util.all_reduce")
        op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[mode]
        with waiting_in("fleet.util.all_reduce"), process_group.dynamic_mode():
            tensor = paddle.to_tensor(array)
            dist.all_reduce(tensor, op=op)
            return tensor.numpy().reshape(array.shape)

    def all_gather(self, input, comm_world="worker"):
        """Every rank's `input` as a list in rank order. `input` is plain data (numbers,
        strings, bytes, lists, tuples, dicts, numpy arrays; see plain_values): it crosses the
        network encoded, never pickled, so no peer can make this rank run code."""
        _check_comm_world(comm_world)
        data = plain_values.encode(input)
        if self._topology().world_size == 1:
            return [plain_values.decode(data)]
        process_group.connect("fleet.util.all_gather")
        with waiting_in("fleet.util.all_gather"), process_group.dynamic_mode():
            parts = _all_gather_bytes(data)
        return [plain_values.decode(part) for part in parts]

    def barrier(self, comm_world="worker"):
        """Block until every rank gets here."""
        _check_comm_world(comm_world)
        with waiting_in("fleet.util.barrier"):
            process_group.barrier("fleet.util.barrier")

    def print_on_rank(self, message, rank_id):
        """Print `message` on rank `rank_id` only."""
        if self._topology().rank == rank_id:
            print(message, flush=True)

    def get_file_shard(self, files):
        """This rank's contiguous share of `files`; the first len(files) % world ranks get one more."""
        if not isinstance(files, list):
            raise FleetliteError(f"fleet.util.get_file_shard takes a list of files, got {type(files).__name__}")
        topology = self._topology()
        share, extra = divmod(len(files), topology.world_size)
        start = topology.rank * share + min(topology.rank, extra)
        return files[start:start + share + (topology.rank < extra)]
