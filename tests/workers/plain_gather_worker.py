"""fleet.util.all_gather between real ranks: every plain value arrives unchanged; then rank 1
plays a hostile peer and sends a pickle that would write MARKER when loaded, in place of its
value, and every rank refuses it without loading it.

Usage: plain_gather_worker.py MARKER
"""
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.runtime import plain_values  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support.plain_samples import Planted, differences, rank_values  # noqa: E402

fleet.init(is_collective=True)
rank = fleet.worker_index()
gathered = fleet.util.all_gather(rank_values(rank))
found = [d for sender, got in enumerate(gathered) for d in differences(got, rank_values(sender), f"rank {sender}")]
if rank == 1:
    plain_values.encode = lambda value: pickle.dumps(Planted(sys.argv[1]))
try:
    fleet.util.all_gather("a value")
    refused = None
except plain_values.MalformedValue as exc:
    refused = str(exc)
write_result({"differences": found, "refused": refused})
