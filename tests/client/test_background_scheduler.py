"""The scheduler of a client's background jobs: passes in a fixed order, intervals, failures."""

from __future__ import annotations

import threading

from tests.support.polling import wait_until

from shinglefs.client.background import BackgroundScheduler


def test_a_pass_runs_the_jobs_in_the_order_they_were_added() -> None:
    ran: list[str] = []
    bg = BackgroundScheduler(period=3600.0)
    bg.add("first", lambda: ran.append("first"))
    bg.add("second", lambda: ran.append("second"))
    bg.start()
    try:
        bg.wake()
        wait_until(lambda: len(ran) >= 2, "one pass")
        bg.wake()
        wait_until(lambda: len(ran) >= 4, "a second pass")
    finally:
        bg.stop()
    assert ran[:4] == ["first", "second", "first", "second"]


def test_a_job_with_an_interval_waits_for_it() -> None:
    every_pass: list[int] = []
    rare: list[int] = []
    bg = BackgroundScheduler(period=0.01)
    bg.add("every pass", lambda: every_pass.append(1))
    bg.add("rare", lambda: rare.append(1), every=3600.0)
    bg.start()
    try:
        wait_until(lambda: len(every_pass) >= 5, "five passes")
    finally:
        bg.stop()
    assert rare == []


def test_a_failing_job_does_not_end_its_pass_and_is_retried() -> None:
    calls: list[str] = []

    def fail() -> None:
        calls.append("fail")
        raise RuntimeError("boom")

    bg = BackgroundScheduler(period=0.01, retry_first=0.0)  # retried on every pass
    bg.add("fails", fail)
    bg.add("after", lambda: calls.append("after"))
    bg.start()
    try:
        wait_until(lambda: calls.count("fail") >= 3, "three passes")
    finally:
        bg.stop()
    assert calls[:4] == ["fail", "after", "fail", "after"]


def test_stop_ends_the_thread_and_pause_reports_it() -> None:
    started, paused = threading.Event(), []
    bg = BackgroundScheduler(period=3600.0, name="test-scheduler")

    def long_job() -> None:
        started.set()
        paused.append(bg.pause(30.0))

    bg.add("long", long_job)
    bg.start()
    bg.wake()
    assert started.wait(30)
    bg.stop()
    assert paused == [True]
    assert not any(t.name == "test-scheduler" for t in threading.enumerate())
