"""Rank 0's rendezvous store speaks Paddle's TCPStore protocol on one address, turns away
hosts outside the job and connections beyond the ranks' own, drops malformed peers, and stops
listening once every rank has connected. Paddle's own client is used against it by every job
(tests/launcher/test_network_listeners.py); here a small client speaks the wire format."""
import ipaddress
import os
import socket
import struct

import pytest

from fleetlite.runtime.rendezvous_store import (
    ADD, CHECK, GET, INIT_KEY, NOT_READY, READY, SET, SPARE_CONNECTIONS, STOP_WAIT, WAIT, RendezvousStore,
    parse_command)
from support.isolated import isolated
from support.job_sockets import tcp_sockets
from support.multiprocess import free_port


def _field(data):
    return struct.pack("=Q", len(data)) + data


class Client:
    """What Paddle's TCPClient sends (tcp_store.cc), on a socket with a deadline."""

    def __init__(self, port, host="127.0.0.1"):
        self.socket = socket.create_connection((host, port), timeout=5)

    def send(self, command, key, tail=b""):
        self.socket.sendall(struct.pack("=i", command) + _field(key) + tail)

    def receive(self, size):
        data = b""
        while len(data) < size:
            chunk = self.socket.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed by the store")
            data += chunk
        return data

    def add(self, key, value):
        self.send(ADD, key, struct.pack("=q", value))
        return struct.unpack("=q", self.receive(8))[0]

    def reply(self):
        return struct.unpack("=i", self.receive(4))[0]

    def get(self, key):
        self.send(GET, key)
        return self.receive(struct.unpack("=Q", self.receive(8))[0])

    def is_closed_by_store(self):
        """True when the store closes this connection (after any replies still on their way)."""
        self.socket.settimeout(5)
        try:
            while self.socket.recv(64):
                pass
        except ConnectionResetError:
            pass
        except socket.timeout:
            return False
        return True


@pytest.fixture
def store():
    server = RendezvousStore("127.0.0.1", 0, world_size=2)
    yield server
    server.close()


def test_set_get_add_check_and_a_wait_answered_when_the_key_is_set(store):
    port = store.port
    writer, waiter = Client(port), Client(port)
    waiter.send(WAIT, b"/gloo/rank1")
    waiter.socket.settimeout(0.3)
    with pytest.raises(socket.timeout):           # no answer while the key is missing
        waiter.socket.recv(4)
    waiter.socket.settimeout(5)
    writer.send(CHECK, b"/gloo/rank1")
    assert writer.reply() == NOT_READY
    writer.send(SET, b"/gloo/rank1", _field(b"\x01address"))
    assert waiter.reply() == STOP_WAIT
    waiter.send(CHECK, b"/gloo/rank1")
    assert waiter.reply() == READY
    assert waiter.get(b"/gloo/rank1") == b"\x01address"
    assert writer.add(b"/counter", 5) == 5 and waiter.add(b"/counter", -2) == 3
    assert writer.get(b"/counter") == b"3"        # Paddle keeps counters as decimal text


def test_it_stops_listening_once_every_rank_has_connected_and_keeps_serving_them(store):
    port = store.port
    ranks = [Client(port), Client(port)]
    assert ranks[0].add(INIT_KEY, 1) == 1 and store.is_listening()
    assert ranks[1].add(INIT_KEY, 1) == 2
    assert store.wait_for_ranks(5) and not store.is_listening()
    with pytest.raises(ConnectionRefusedError):
        Client(port)
    ranks[0].send(SET, b"/key", _field(b"value"))
    ranks[1].send(WAIT, b"/key")                  # as Paddle's client: wait for the key, then get it
    assert ranks[1].reply() == STOP_WAIT
    assert ranks[1].get(b"/key") == b"value"


def test_connections_beyond_the_ranks_own_are_closed_at_once(store):
    port = store.port
    clients = [Client(port) for _ in range(2 * store.world_size + SPARE_CONNECTIONS + 20)]
    kept = clients[:2 * store.world_size + SPARE_CONNECTIONS]   # each rank: its client and its watch
    assert all(c.is_closed_by_store() for c in clients[len(kept):])
    assert kept[-1].add(b"/still", 1) == 1


def test_peers_outside_the_job_are_turned_away_and_named():
    server = RendezvousStore("127.0.0.1", 0, world_size=2, peers={"10.213.0.1", "10.213.0.2"})
    try:
        assert Client(server.port).is_closed_by_store()
        assert server.refused == {"127.0.0.1"}
    finally:
        server.close()


@pytest.mark.parametrize("payload", [
    struct.pack("=i", 9) + _field(b"key"),                       # no such command
    struct.pack("=i", SET) + struct.pack("=Q", 1 << 40),         # a key of 1 TiB
    struct.pack("=i", SET) + _field(b"k") + struct.pack("=Q", 1 << 40),
    struct.pack("=i", GET) + _field(b"/never-set"),              # Paddle's server drops it too
    struct.pack("=i", ADD) + _field(b"/text") + struct.pack("=q", 1),
    struct.pack("=i", ADD) + _field(b"/n") + struct.pack("=q", 2**63 - 1) + struct.pack("=i", ADD) + _field(b"/n")
    + struct.pack("=q", 1),                                      # past int64
])
def test_a_malformed_peer_is_dropped_and_the_others_are_served(store, payload):
    port = store.port
    good, bad = Client(port), Client(port)
    good.send(SET, b"/text", _field(b"not a number"))
    good.send(CHECK, b"/text")                    # the store has the text before the bad peer speaks
    assert good.reply() == READY
    bad.socket.sendall(payload)
    assert bad.is_closed_by_store()
    assert good.get(b"/text") == b"not a number"


def test_a_command_is_parsed_only_when_whole():
    whole = struct.pack("=i", ADD) + _field(b"/k") + struct.pack("=q", 7)
    assert [parse_command(whole[:n]) for n in range(len(whole))] == [None] * len(whole)
    assert parse_command(whole + b"more") == (ADD, b"/k", 7, len(whole))


@isolated(timeout=60)
def test_paddles_own_store_listens_on_every_address_whatever_host_it_is_given():
    """Why rank 0 serves the store itself: Paddle 3.3.1's TCPStore master binds 0.0.0.0
    (`tcp_listen("", port)` in tcp_store.cc). Once it binds the host given, the listener
    reasons in rendezvous_store.py shrink to the peer filter and the closed port."""
    from paddle.base import core
    port = free_port()
    store = core.TCPStore("127.0.0.1", port, True, 1, 10)
    assert ("listen", ipaddress.ip_address("0.0.0.0"), port) in tcp_sockets([os.getpid()])
    del store
