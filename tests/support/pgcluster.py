"""A private PostgreSQL for the tests: ``shinglefs.testbed.pgcluster``, with
``private_cluster`` failing the test (never skipping) when it cannot start."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pytest

from shinglefs.testbed import pgcluster as _testbed
from shinglefs.testbed.pgcluster import PgCluster, PgClusterError, find_bindir, free_port

__all__ = ["PgCluster", "PgClusterError", "find_bindir", "free_port", "private_cluster"]


@contextlib.contextmanager
def private_cluster(prefix: str = "shinglefs-pgcluster-",
                    listen: Sequence[str] = ()) -> Iterator[PgCluster]:
    """``testbed.pgcluster.private_cluster``; a cluster that cannot start fails the test."""
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(_testbed.private_cluster(prefix, listen))
        except PgClusterError as exc:
            pytest.fail(f"the private PostgreSQL cluster could not start: {exc}", pytrace=False)
        yield cluster
