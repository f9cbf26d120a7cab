"""A failing background job starves no other: the session heartbeat goes on.

A real scheduler runs a real janitor whose metadata store is closed (as when
meta is unreachable: every run raises ``MetaUnavailable``) before a real
session heartbeat on a real SQLite metadata store. The heartbeat must keep
advancing in meta (else the session expires after ``session_timeout`` and
its open files and slices in progress lose their protection); the failing
job must wait before its next try (no spin) and be logged once per distinct
error.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.polling import wait_until

from shinglefs.client.background import BackgroundScheduler, ClientSession, Janitor
from shinglefs.meta import open_meta
from shinglefs.meta.api import MetaStore, SessionInfo
from shinglefs.meta.errors import MetaUnavailable

SCHEDULER_LOG = "shinglefs.client.background.scheduler"


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetaStore]:
    store = open_meta(f"sqlite3://{tmp_path / 'meta.db'}")
    store.format("test", str(uuid.uuid4()), secret="s3cret")
    yield store
    store.close()


def unreachable_janitor(meta: MetaStore, url: str) -> Janitor:
    """A janitor on a metadata store that is closed: each run raises MetaUnavailable."""
    closed = open_meta(url)
    closed.close()
    return Janitor(closed, abandoned_age=1.0, writers=list, wake=lambda: None)


def heartbeat_of(meta: MetaStore, session: ClientSession) -> int:
    (s,) = [s for s in meta.list_sessions() if s.id == session.id]
    return s.heartbeat_ns


def test_a_job_failing_every_time_does_not_stop_the_session_heartbeat(
    meta: MetaStore, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    session = ClientSession(meta, SessionInfo(host="test"), timeout=120.0, held=list,
                            in_progress=set)
    janitor = unreachable_janitor(meta, f"sqlite3://{tmp_path / 'meta.db'}")
    with pytest.raises(MetaUnavailable):
        janitor.run()
    tries: list[int] = []

    def janitor_job() -> int:
        tries.append(1)
        return janitor.run()

    # The janitor runs on every pass, before the session; after a failure it
    # waits an hour (a job failing on every try must not spin).
    bg = BackgroundScheduler(period=0.01, retry_first=3600.0)
    bg.add("janitor", janitor_job)
    bg.add("session", session.run)
    caplog.set_level(logging.DEBUG, logger=SCHEDULER_LOG)
    bg.start()
    try:
        seen = heartbeat_of(meta, session)
        for i in range(3):  # three heartbeats in a row, every one after a janitor failure
            before = seen
            wait_until(lambda before=before: heartbeat_of(meta, session) > before,
                       f"heartbeat {i + 1} after the failing janitor")
            seen = heartbeat_of(meta, session)
    finally:
        bg.stop()
    assert tries == [1]  # failed once, then waits for its retry
    failures = [r for r in caplog.records
                if r.name == SCHEDULER_LOG and r.levelno >= logging.ERROR]
    assert len(failures) == 1 and "'janitor'" in failures[0].getMessage()
    assert failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], MetaUnavailable)
    # The session is alive in meta: nothing expires it.
    assert session.id in {s.id for s in meta.list_sessions()}


def test_a_failure_is_logged_once_per_distinct_error_and_a_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes: list[Exception | None] = [
        OSError("disk gone"), OSError("disk gone"), OSError("disk gone"),
        ValueError("bad record"), ValueError("bad record"),
        OSError("disk gone"), None,
    ]
    ran: list[object] = []
    after: list[int] = []

    def flaky() -> None:
        outcome = outcomes[len(ran)] if len(ran) < len(outcomes) else None
        ran.append(outcome)
        if outcome is not None:
            raise outcome

    bg = BackgroundScheduler(period=0.001, retry_first=0.0)  # retried on every pass
    bg.add("flaky", flaky)
    bg.add("after", lambda: after.append(1))
    caplog.set_level(logging.DEBUG, logger=SCHEDULER_LOG)
    bg.start()
    try:
        wait_until(lambda: len(ran) > len(outcomes), "every outcome, then one more success")
    finally:
        bg.stop()
    assert len(after) >= len(outcomes)  # the job after it ran on every pass
    records = [r for r in caplog.records if r.name == SCHEDULER_LOG]
    logged = [r.exc_info[1] for r in records if r.levelno >= logging.ERROR and r.exc_info]
    assert [str(e) for e in logged] == ["disk gone", "bad record", "disk gone"]
    assert sum(1 for r in records if r.levelno == logging.DEBUG) == 3  # the repeats
    recovered = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert recovered == ["maintenance job 'flaky' runs again after 6 failures"]


def test_a_failing_job_with_an_interval_waits_no_longer_than_its_interval() -> None:
    tries: list[int] = []
    passes: list[int] = []

    def fails() -> None:
        tries.append(1)
        raise RuntimeError("always")

    # The retry wait is an hour, but the job's own interval is shorter: it wins.
    bg = BackgroundScheduler(period=0.001, retry_first=3600.0)
    bg.add("fails", fails, every=0.0)
    bg.add("count", lambda: passes.append(1))
    bg.start()
    try:
        wait_until(lambda: len(tries) >= 3, "three tries of the failing job")
    finally:
        bg.stop()
    assert len(passes) >= 2
