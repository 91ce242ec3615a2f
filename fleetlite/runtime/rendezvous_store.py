"""Rank 0's rendezvous store: Paddle's TCPStore protocol, served on one address only.

Paddle's own store server (3.3.1, `TCPServer::create` in tcp_store.cc) binds 0.0.0.0 whatever
host it is given, listens for the whole job and accepts any number of connections from anyone:
a one-host job was reachable from the network, and 450 idle connections exhausted rank 0's file
descriptors. Its client is fine, so rank 0 serves the same wire protocol here and every rank,
rank 0 included, connects with Paddle's client (`core.TCPStore(..., is_master=False)`):
- the listener binds the master endpoint's address (loopback for a one-host job);
- it accepts only the job's hosts, and at most a few connections more than the ranks;
- it stops listening once every rank has connected: their connections stay, the port closes.
It also watches the ranks for jobs no fleetrun supervises (rank_watch): a connection that set
`WATCH_PREFIX<rank>` and closes before setting `DONE_PREFIX<rank>` is a rank gone, written under
`GONE_KEY` for the other ranks' watches; rank 0's `DONE_PREFIX0` ends the job, an empty `GONE_KEY`.
What remains is stated in docs/security.md: during start-up, a process on one of the job's
hosts can still connect, read and write keys, as with Paddle's and torch's stores.
"""
import collections
import contextlib
import selectors
import socket
import struct
import threading

# Paddle's `enum class Command` and `enum class ReplyType` (tcp_store.h), sent as native ints;
# strings and vectors go as a native size_t length and the bytes (tcp_utils.h).
ADD, GET, CHECK, SET, WAIT = range(5)
STOP_WAIT, READY, NOT_READY = 1, 2, 3
COMMAND = struct.Struct("=i")
LENGTH = struct.Struct("=Q")
INT64 = struct.Struct("=q")
INIT_KEY = b"/init/"          # every client adds 1 here when it connects (TCPStore::waitWorkers)
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 16 << 20
SPARE_CONNECTIONS = 8         # beyond two per rank (its client, its watch): a reachability probe, a late close
WATCH_PREFIX, DONE_PREFIX, GONE_KEY = "/fleetlite/watch/", "/fleetlite/done/", "/fleetlite/gone"
ANY_HOST = "any host"         # peers when the launcher names no hosts (Open MPI)
SEND_TIMEOUT_S = 10


class ProtocolError(Exception):
    """A peer sent something Paddle's client never sends: its connection is closed."""


def parse_command(buffer):
    """(command, key, argument, bytes used) for the first whole command in `buffer`, or None
    while it is incomplete; ProtocolError for an unknown command or an oversized field."""
    if len(buffer) < COMMAND.size:
        return None
    (command,) = COMMAND.unpack_from(buffer)
    if command not in (ADD, GET, CHECK, SET, WAIT):
        raise ProtocolError(f"unknown command {command}")
    key, used = _sized(buffer, COMMAND.size, MAX_KEY_BYTES)
    if key is None:
        return None
    argument = None
    if command == ADD:
        if len(buffer) < used + INT64.size:
            return None
        (argument,) = INT64.unpack_from(buffer, used)
        used += INT64.size
    elif command == SET:
        argument, used = _sized(buffer, used, MAX_VALUE_BYTES)
        if argument is None:
            return None
    return command, key, argument, used


def _sized(buffer, start, limit):
    if len(buffer) < start + LENGTH.size:
        return None, start
    (length,) = LENGTH.unpack_from(buffer, start)
    if length > limit:
        raise ProtocolError(f"a field of {length} bytes (at most {limit})")
    end = start + LENGTH.size + length
    if len(buffer) < end:
        return None, start
    return bytes(buffer[start + LENGTH.size:end]), end


class RendezvousStore:
    """Serves Paddle's store protocol on `address:port` (0: a free one, then `.port`) from a
    daemon thread until `close`.

    `peers` are the IPv4 addresses allowed to connect (None: loopback ones only; ANY_HOST: any,
    for a launcher that names no hosts until the ranks have met)."""

    def __init__(self, address, port, world_size, peers=None):
        self.world_size = world_size
        self._peers = peers
        self.refused = set()   # addresses turned away for not being a host of the job (a few)
        self._values = {}
        self._waiting = collections.defaultdict(list)
        self._buffers = {}
        self._watched = {}    # watch connection -> (rank, host)
        self._all_joined = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._listener = socket.create_server((address, port))   # SO_REUSEADDR, as Paddle's
        self.port = self._listener.getsockname()[1]
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._wake_read, self._wake_write = socket.socketpair()
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="fleetlite-rendezvous-store", daemon=True)
        self._thread.start()

    def wait_for_ranks(self, timeout):
        """True once every rank's client has connected, False after `timeout` seconds."""
        return self._all_joined.wait(timeout)

    def is_listening(self):
        return self._listener is not None

    def close(self):
        """Stop serving and close every connection (the job's store is gone after this)."""
        if not self._closed:
            self._closed = True
            self._wake_write.send(b"x")
            self._thread.join(timeout=SEND_TIMEOUT_S)

    def _serve(self):
        try:
            while not self._closed:
                for key, _ in self._selector.select():
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is not self._wake_read:
                        self._read(key.fileobj)
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()
            self._wake_write.close()
            self._selector.close()

    def _accept(self):
        try:
            connection, (peer, *_) = self._listener.accept()
        except OSError:       # the peer gave up between the poll and the accept
            return
        if not self._allowed(peer):
            if len(self.refused) < SPARE_CONNECTIONS:
                self.refused.add(peer)
            connection.close()
            return
        if len(self._buffers) >= 2 * self.world_size + SPARE_CONNECTIONS:
            connection.close()
            return
        connection.setblocking(True)
        connection.settimeout(SEND_TIMEOUT_S)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffers[connection] = bytearray()
        self._selector.register(connection, selectors.EVENT_READ)

    def _allowed(self, peer):
        if self._peers is None:
            return peer.startswith("127.")
        if self._peers == ANY_HOST:
            return True
        return peer in self._peers

    def _read(self, connection):
        try:
            data = connection.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the peer")
            buffer = self._buffers[connection]
            buffer += data
            while (parsed := parse_command(buffer)) is not None:
                command, key, argument, used = parsed
                del buffer[:used]
                self._handle(connection, command, key, argument)
        except (OSError, ProtocolError, ValueError, KeyError, struct.error):   # from what the peer sent
            self._drop(connection)

    def _handle(self, connection, command, key, argument):
        if command == ADD:
            total = int(self._values.get(key, b"0")) + argument
            self._values[key] = str(total).encode()
            connection.sendall(INT64.pack(total))
            self._notify(key)
            if key == INIT_KEY and total >= self.world_size:
                self._stop_listening()
        elif command == SET:
            self._values[key] = argument
            self._notify(key)
            self._follow_watch(connection, key.decode(errors="replace"), argument)
        elif command == GET:
            value = self._values[key]     # Paddle's client waits for the key first; else: dropped
            connection.sendall(LENGTH.pack(len(value)) + value)
        elif command == CHECK:
            connection.sendall(COMMAND.pack(READY if key in self._values else NOT_READY))
        elif key in self._values:         # WAIT
            connection.sendall(COMMAND.pack(STOP_WAIT))
        else:
            self._waiting[key].append(connection)

    def _notify(self, key):
        for waiter in self._waiting.pop(key, []):
            try:
                waiter.sendall(COMMAND.pack(STOP_WAIT))
            except OSError:
                self._drop(waiter)

    def _follow_watch(self, connection, key, value):
        if key.startswith(WATCH_PREFIX):
            self._watched[connection] = (key[len(WATCH_PREFIX):], value.decode(errors="replace"))
        elif key.startswith(DONE_PREFIX):
            self._watched.pop(connection, None)
            if key == f"{DONE_PREFIX}0":
                self._announce_gone(b"")

    def _announce_gone(self, what):
        if GONE_KEY.encode() not in self._values:   # the first loss is the root cause
            self._values[GONE_KEY.encode()] = what
            self._notify(GONE_KEY.encode())

    def _stop_listening(self):
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            self._all_joined.set()

    def _drop(self, connection):
        if self._buffers.pop(connection, None) is None:
            return
        self._selector.unregister(connection)
        connection.close()
        if connection in self._watched:
            rank, host = self._watched.pop(connection)
            self._announce_gone(f"rank {rank} on {host} is gone".encode())
        for waiters in self._waiting.values():
            if connection in waiters:
                waiters.remove(connection)


class StoreClient:
    """Paddle's store protocol from Python, for what fleetlite itself asks of a store (the rank
    watch, fleetrun's pod meeting); the training job's own client is Paddle's."""

    def __init__(self, address, port, timeout):
        self._connection = socket.create_connection((address, port), timeout=timeout)

    def _send(self, command, key, tail=b""):
        key = key.encode()
        self._connection.sendall(COMMAND.pack(command) + LENGTH.pack(len(key)) + key + tail)

    def _receive(self, size):
        data = b""
        while len(data) < size:
            chunk = self._connection.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            data += chunk
        return data

    def block(self, timeout):
        """Wait at most `timeout` seconds for each reply from now on (None: without a deadline)."""
        self._connection.settimeout(timeout)

    def set(self, key, value):
        self._send(SET, key, LENGTH.pack(len(value)) + value)

    def add(self, key, amount):
        self._send(ADD, key, INT64.pack(amount))
        return INT64.unpack(self._receive(INT64.size))[0]

    def wait(self, key):
        """Return once `key` is set; False if the store answered anything else."""
        self._send(WAIT, key)
        return COMMAND.unpack(self._receive(COMMAND.size))[0] == STOP_WAIT

    def get(self, key):
        self._send(GET, key)
        return self._receive(LENGTH.unpack(self._receive(LENGTH.size))[0])

    def close(self):
        with contextlib.suppress(OSError):
            self._connection.shutdown(socket.SHUT_RDWR)
        self._connection.close()
