"""Copy what a worker appends to its log file to the console, one prefixed line at a time.

The worker writes straight to its file; this thread follows the file. fleetrun is never in the
worker's output path, so a stopped or slow console cannot block a worker, and the log is
complete even when fleetrun dies. Lines are split on bytes (a newline never sits inside a
UTF-8 character), so no character is cut in two. `before_lines` is called before each batch of
lines is written (fleetrun's live progress line wipes itself from the terminal there).
"""
import threading

POLL_INTERVAL_S = 0.1


class LogTee:
    def __init__(self, path, offset, prefix, out, poll_interval=POLL_INTERVAL_S, before_lines=lambda: None):
        self._path, self._offset, self._prefix = path, offset, prefix.encode()
        self._out, self._poll_interval, self._before_lines = out, poll_interval, before_lines
        self._pending = b""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"tee {path}", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _emit(self, data):
        *lines, self._pending = (self._pending + data).split(b"\n")
        if lines:
            self._before_lines()
        for line in lines:
            self._out.write(self._prefix + line + b"\n")
        if lines:
            self._out.flush()

    def _follow(self):
        with open(self._path, "rb") as log:
            log.seek(self._offset)
            while not self._done.is_set():
                data = log.read()
                if data:
                    self._emit(data)
                else:
                    self._done.wait(self._poll_interval)
            rest = log.read()
            if (self._pending + rest)[-1:] not in (b"", b"\n"):
                rest += b"\n"  # the worker's last line had no newline
            self._emit(rest)

    def stop(self, timeout=2.0):
        """Copy what is left, then stop (waiting at most `timeout` seconds)."""
        self._done.set()
        self._thread.join(timeout)
