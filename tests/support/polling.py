"""Waiting in tests for a state change another thread makes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], what: str, limit: float = 30.0) -> None:
    """Poll ``condition`` until it is true (a bound, not a timing assertion);
    fails naming ``what`` after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)
