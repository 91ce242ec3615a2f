"""Shared test set-up: every test starts in Paddle's default (dynamic) mode, whatever mode the
test before it left behind (many build static programs and leave static mode on); `no_group_ops`
compiles as where the gloo sub-group ops cannot be built."""
import sys

import pytest


@pytest.fixture(autouse=True)
def paddle_starts_dynamic():
    paddle = sys.modules.get("paddle")
    if paddle is not None and not paddle.in_dynamic_mode():
        paddle.disable_static()
    yield


@pytest.fixture
def no_group_ops(monkeypatch):
    """As where fleetlite's gloo sub-group ops cannot be built (no C++ compiler): the gloo
    lowering emulates every ring on ring 0."""
    from fleetlite.compile import group_collectives
    monkeypatch.setattr(group_collectives, "load_error", lambda: "no C++ compiler (the test says so)")
