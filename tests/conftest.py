"""Shared test set-up: every test starts in Paddle's default (dynamic) mode, whatever mode the
test before it left behind (many build static programs and leave static mode on)."""
import sys

import pytest


@pytest.fixture(autouse=True)
def paddle_starts_dynamic():
    paddle = sys.modules.get("paddle")
    if paddle is not None and not paddle.in_dynamic_mode():
        paddle.disable_static()
    yield
