"""Under srun or mpirun the survivors name a rank that died, from rank 0's store: a watch that
closes without saying it finished is a rank gone; rank 0 finishing ends every watch quietly; rank 0
dying (the store with it) is named too. In one process: the store and real sockets, no Paddle."""
import threading

import pytest

from fleetlite.runtime.rank_watch import RankWatch, wanted
from fleetlite.runtime.rendezvous_store import RendezvousStore

WAIT_S = 5


class Exits:
    """Stands in for os._exit: records each watch's exit status."""

    def __init__(self):
        self.statuses, self.event = [], threading.Event()

    def __call__(self, status):
        self.statuses.append(status)
        self.event.set()


@pytest.fixture
def store():
    server = RendezvousStore("127.0.0.1", 0, world_size=3)
    yield server
    server.close()


def watches(store, hosts=("node0", "node1", "node1")):
    return [RankWatch("127.0.0.1", store.port, rank, host, "node0") for rank, host in enumerate(hosts)]


def test_a_rank_whose_watch_closes_unannounced_is_named_to_the_others(store, capfd):
    rank0, rank1, rank2 = watches(store)
    exits = {rank: Exits() for rank in (0, 2)}
    rank0.start(exits[0])
    rank2.start(exits[2])
    rank1._store.close()   # what the kernel does for a killed process
    assert exits[0].event.wait(WAIT_S) and exits[2].event.wait(WAIT_S)
    said = capfd.readouterr().err
    assert "fleetlite: rank 1 on node1 is gone: stopping rank 0 too" in said
    assert "fleetlite: rank 1 on node1 is gone: stopping rank 2 too" in said
    assert exits[0].statuses == exits[2].statuses == [1]


def test_ranks_that_finish_are_not_reported_and_rank_0_finishing_ends_every_watch(store, capfd):
    rank0, rank1, rank2 = watches(store)
    exits = Exits()
    for watch in (rank0, rank1, rank2):
        watch.start(exits)
    rank2.finish()
    rank0.finish()
    rank1._thread.join(WAIT_S)
    assert not rank1._thread.is_alive() and exits.statuses == []
    assert "gone" not in capfd.readouterr().err


def test_rank_0_dying_with_its_store_is_named(store, capfd):
    rank0, rank1, rank2 = watches(store)   # all kept: a closed watch would name its own rank
    exits = Exits()
    rank1.start(exits)
    store.close()
    assert exits.event.wait(WAIT_S)
    assert "fleetlite: rank 0 on node0, which served the job's store, is gone: stopping rank 1 too" in capfd.readouterr().err


def test_only_jobs_no_fleetrun_supervises_are_watched():
    assert wanted({"SLURM_PROCID": "0"}) and wanted({"OMPI_COMM_WORLD_RANK": "0"})
    assert not wanted({"PADDLE_TRAINER_ID": "0", "SLURM_PROCID": "0"}) and not wanted({})
