"""tests/support/isolated.py: a native crash, a failed assertion or a hang in an isolated body fails that
test with the child's signal or status and its stack; the calling process lives on."""
import ctypes
import re
import time

import pytest

from support.isolated import ChildFailed, isolated


@isolated(timeout=60)
def dereference_null():
    ctypes.string_at(0)


@isolated(timeout=60)
def fail_an_assertion(expected):
    assert expected == 41, f"got {expected}"


@isolated(timeout=2)
def hang():
    time.sleep(60)


@isolated(timeout=60)
def pass_quietly(values):
    assert sum(values) == 6


def test_a_segfault_fails_the_test_with_the_signal_and_both_stacks():
    with pytest.raises(ChildFailed) as failure:
        dereference_null()
    message = str(failure.value)
    assert "dereference_null died of SIGSEGV in its child process" in message
    assert re.search(r"test_isolated.py\", line \d+ in dereference_null", message)   # faulthandler's Python stack
    assert "FatalError: `Segmentation fault` is detected" in message                 # Paddle's C++ report


def test_a_failed_assertion_shows_its_message():
    with pytest.raises(ChildFailed, match=r"(?s)exited with 1 .*AssertionError: got 42"):
        fail_an_assertion(42)


def test_a_hang_is_killed_at_its_deadline():
    started = time.monotonic()
    with pytest.raises(ChildFailed, match="hang still running after 2 s"):
        hang()
    assert time.monotonic() - started < 30


def test_a_passing_body_returns():
    pass_quietly([1, 2, 3])
