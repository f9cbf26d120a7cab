"""Fixtures of the storage-server tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.server.test_server_process import Server


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Servers a test starts (``Server`` subprocesses), killed at its end if still running."""
    started: list[Server] = []
    yield started
    for server in started:
        server.kill()
