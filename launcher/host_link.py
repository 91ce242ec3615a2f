"""The ssh link between an --ssh job's first host and another host's fleetrun, with heartbeats.

A host that goes down, or a link that is cut, is silent: no connection is reset, ssh notices only
through its keepalives (off by default) or TCP's timeout (minutes), and the ranks only when
gloo's fixed 30 s collective timeout ends. So each side beats every second on the ssh channel
itself: the first host writes a byte to the remote fleetrun's stdin, the remote fleetrun writes
a line to its stdout. A side that hears nothing for SILENCE_S seconds takes the other as lost
and stops (the first host: the job, naming the host; the other host: its own workers). Nothing
of ssh is needed beyond the channel, so any --ssh_command works.

The first host also keeps what it needs to say how a host ended: whether its fleetrun ever
spoke (else ssh never started it), and whether it printed its final line (else the connection
was lost before it could report).
"""
import collections
import os
import re
import select
import signal
import threading
import time

HEARTBEAT_S = 1.0
SILENCE_S = 10.0      # well below gloo's 30 s, well above a loaded machine's scheduling delays
FIRST_WORD_S = 30.0   # ssh's connection, authentication and the remote python's start
HEARTBEAT = b"\x06fleetrun heartbeat\n"
RELAY_JOIN_S = 1.0
# The last line a fleetrun prints: its verdict, or a refusal before anything started.
FINAL_LINE = re.compile(rb"^fleetrun: (job (succeeded|failed|stopped)|error: )")


def follow_first_host(stop, read_fd=0, write_fd=1, silence=SILENCE_S, interval=HEARTBEAT_S):
    """On a host started over --ssh: beat on stdout, and stop the job when stdin closes (the
    first host stopped the job, or died) or stays silent for `silence` seconds (the link or
    the first host is gone). Runs in a daemon thread until stdout is closed."""
    def run():
        heard, listening = time.monotonic(), True
        while True:
            try:
                os.write(write_fd, HEARTBEAT)
            except OSError:   # the ssh channel is gone; stdin's end says so too
                return
            readable = select.select([read_fd] if listening else [], [], [], interval)[0]
            if readable:
                if os.read(read_fd, 4096):
                    heard = time.monotonic()
                else:
                    listening = False
                    stop.request(signal.SIGTERM, "the first host (its connection closed)")
            elif listening and time.monotonic() - heard > silence:
                listening = False
                stop.request(signal.SIGTERM, f"the first host (no word from it for {silence:g} s: "
                                             f"the connection to it is lost)")
    thread = threading.Thread(target=run, name="follow the first host", daemon=True)
    thread.start()
    return thread


class RemoteLink:
    """The first host's end of the link to one remote fleetrun: relays its output (stdout and
    stderr on one pipe) to this console without the heartbeats, beats on its stdin, and keeps
    what it heard."""

    def __init__(self, stdin, output, console, silence=SILENCE_S, first_word=FIRST_WORD_S,
                 interval=HEARTBEAT_S, clock=time.monotonic):
        self._stdin, self._console, self._clock = stdin, console, clock
        self._silence, self._first_word, self._interval = silence, first_word, interval
        os.set_blocking(stdin.fileno(), False)   # a beat must never block the supervisor
        self._started = self._last_beat = clock()
        self._heard = None            # when the remote fleetrun last beat; None: never
        self.reported = False         # its final line came through
        self.said = collections.deque(maxlen=3)   # the last lines it (or ssh) printed
        self._relay = threading.Thread(target=self._relay_lines, args=(output,), daemon=True,
                                       name="relay a remote fleetrun")
        self._relay.start()

    def _relay_lines(self, output):
        for line in iter(output.readline, b""):
            if line == HEARTBEAT:
                self._heard = self._clock()
                continue
            self.said.append(line.decode(errors="replace").rstrip())
            self.reported = self.reported or bool(FINAL_LINE.match(line))
            try:
                self._console.write(line)
                self._console.flush()
            except (OSError, ValueError):   # our console is gone; keep draining the pipe
                continue

    def beat(self):
        """Send a heartbeat if one is due (called from the supervisor's poll loop)."""
        now = self._clock()
        if self._stdin.closed or now - self._last_beat < self._interval:
            return
        self._last_beat = now
        try:
            os.write(self._stdin.fileno(), b"\n")
        except (BlockingIOError, BrokenPipeError):  # a full pipe is a stalled link: silence will say
            pass

    def close_input(self):
        """End the remote fleetrun's stdin: it stops its workers, reports, and exits."""
        if not self._stdin.closed:
            self._stdin.close()

    @property
    def ever_heard(self):
        return self._heard is not None

    def silence(self):
        """Why the remote counts as lost while ssh still runs, or None."""
        now = self._clock()
        if self._heard is None and now - self._started > self._first_word:
            return f"no word from its fleetrun within {self._first_word:g} s of starting ssh"
        if self._heard is not None and now - self._heard > self._silence:
            return f"no word from its fleetrun for {self._silence:g} s"
        return None

    def finish(self):
        """After ssh exited: let the relay pass on the last lines (bounded)."""
        self._relay.join(RELAY_JOIN_S)
