"""Metadata fixtures: ONE suite runs on every backend (the fsspec pattern).

- ``pg_cluster`` (session): a private PostgreSQL cluster started for this test
  session (tests/support/pgcluster.py). If PostgreSQL is missing or cannot
  start, every PostgreSQL test FAILS (never skips).
- ``meta_url``: a fresh, empty database URL, per backend (``sqlite`` on a tmp
  file, ``postgresql`` a new database in the private cluster).
- ``meta``: a formatted ``SqlMetaStore`` on that URL, closed after the test.
- ``check``: asserts the database is consistent (shinglefs.meta.check).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.pgcluster import PgCluster, private_cluster  # noqa: E402

from shinglefs.meta import open_meta  # noqa: E402
from shinglefs.meta.check import check_consistency  # noqa: E402
from shinglefs.meta.engine import SqlMetaStore  # noqa: E402

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    with private_cluster() as cluster:
        yield cluster


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def meta_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite3://{tmp_path / 'meta.db'}"
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    # Not dropped after the test (a drop costs ~0.4 s): the whole cluster is
    # thrown away at the end of the session.
    yield cluster.new_database()


@pytest.fixture
def meta(meta_url: str) -> Iterator[SqlMetaStore]:
    store = open_meta(meta_url)
    store.format("test", str(uuid.uuid4()), secret="s3cret")
    assert isinstance(store, SqlMetaStore)
    yield store
    store.close()


@pytest.fixture
def check(meta: SqlMetaStore) -> Callable[[], None]:
    def run() -> None:
        problems = check_consistency(meta)
        assert problems == [], "\n".join(f"{p.check}: {p.detail}" for p in problems)

    return run
