"""Which TCP ports this machine uses, read from the kernel's tables (/proc/net/tcp and tcp6).

Ports are never probed with connect(): a connect() to a port in the ephemeral range can connect
to itself and then hold the very port it tested (seen once in ~150 launches as a libuv abort in
rank 0's store). A port counts as used when any socket on any local address has it, except in
TIME_WAIT: rank 0's store binds with SO_REUSEADDR, which those do not block (a job
reuses its port back to back). fleetrun reserves ports with these; the worker's process group
waits with them for rank 0's store.
"""
import time

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TIME_WAIT, LISTEN = "06", "0A"


def parse_tcp_table(text):
    """[(local port, state hex)] for the rows of a /proc/net/tcp-format table."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3:
            rows.append((int(fields[1].rpartition(":")[2], 16), fields[3]))
    return rows


def _rows(tables):
    rows = []
    for path in tables:
        try:
            with open(path) as table:
                rows += parse_tcp_table(table.read())
        except FileNotFoundError:  # no IPv6 on this machine
            continue
    return rows


def ports_in_use(tables=TCP_TABLES):
    return {port for port, state in _rows(tables) if state != TIME_WAIT}


def is_listening(port, tables=TCP_TABLES):
    return any(p == port and state == LISTEN for p, state in _rows(tables))


def wait_until_listening(port, timeout, poll_interval=0.02, tables=TCP_TABLES):
    """True once something listens on `port`, False when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not is_listening(port, tables):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_interval)
    return True
