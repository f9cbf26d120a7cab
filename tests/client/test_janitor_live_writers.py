"""The janitor across clients: a live writer's slice is never discarded, a dead one's is.

Two real processes on one embedded file system: this one holds the drives
(``connect``: it serves them on loopback) and runs the janitor with a small
``abandoned_slice_age``; a child ``connect()`` joins through the share and
writes a file slowly, keeping its slice WRITING for longer than that age.
The child's own background heartbeat is what vouches for the slice
(``ClientConfig.heartbeat_interval``: a quarter of the age here).
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fsfixtures import FsFactory, MiB, pattern

from shinglefs.client.api import ShingleFS, connect
from shinglefs.client.config import ClientConfig
from shinglefs.meta.api import SliceState
from shinglefs.meta.errors import FsError

AGE = 6.0
"""The abandoned age of both processes (their heartbeat: AGE / 4)."""
SEED, FIRST, REST = 81, 5 * MiB, 3 * MiB + 17

WRITER = """
    import random, sys
    import shinglefs
    from shinglefs.client.config import ClientConfig
    fs = shinglefs.connect({url!r}, config=ClientConfig(abandoned_slice_age={age!r}))
    data = random.Random({seed}).randbytes({first} + {rest})
    with fs.open("/slow.log", "wb") as f:
        f.write(data[:{first}])  # the first piece is stored and its slice registered
        f.flush()
        print("written", flush=True)
        sys.stdin.readline()  # the test's go-ahead: the slice is older than the age
        f.write(data[{first}:])
    print("closed", flush=True)
    fs.close()
"""


@contextmanager
def slow_writer(url: str) -> Iterator[subprocess.Popen[str]]:
    """The child process, started and waited for until its first bytes are written."""
    code = WRITER.format(url=url, age=AGE, seed=SEED, first=FIRST, rest=REST)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "written\n", child.communicate(timeout=60)[1]
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(60)


def writing_slice(fs: ShingleFS) -> int:
    """The one WRITING slice in meta (the child's)."""
    (info,) = fs.vfs.meta.abandoned_slices(0.0)
    assert info.state == SliceState.WRITING
    return info.id


def test_a_live_writer_of_another_process_keeps_its_slice_past_the_abandoned_age(
    fs_factory: FsFactory,
) -> None:
    fs_factory.format()
    config = ClientConfig(abandoned_slice_age=AGE, janitor_interval=AGE / 6)
    with connect(fs_factory.meta_url, config=config) as fs:
        with slow_writer(fs_factory.meta_url) as child:
            sid = writing_slice(fs)
            time.sleep(AGE + 2)  # past the age; this client's janitor runs about 8 times meanwhile
            assert fs.vfs.jobs.janitor.run() == 0
            assert fs.vfs.meta.get_slice(sid).state == SliceState.WRITING
            assert fs.vfs.node.contains(sid)
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            assert out == "closed\n"
        data = random.Random(SEED).randbytes(FIRST + REST)
        assert fs.read_bytes("/slow.log") == data


def test_the_slice_of_a_killed_writer_is_discarded_after_the_abandoned_age(
    fs_factory: FsFactory,
) -> None:
    fs_factory.format()
    config = ClientConfig(abandoned_slice_age=AGE, janitor_interval=0)  # run by hand below
    with connect(fs_factory.meta_url, config=config) as fs:
        with slow_writer(fs_factory.meta_url) as child:
            sid = writing_slice(fs)
            assert fs.vfs.jobs.janitor.run() == 0  # young: vouched for, or not yet old
            child.kill()
            child.wait(60)
        time.sleep(AGE + 1.0)  # past the age since its last heartbeat
        assert fs.vfs.jobs.janitor.run() == 1
        fs.vfs.run_deletions()
        with pytest.raises(FsError):
            fs.vfs.meta.get_slice(sid)
        assert not fs.vfs.node.contains(sid)
        assert fs.read_bytes("/slow.log") == b""  # nothing of it was ever committed
        fs.write_bytes("/after", pattern(82, MiB))  # the file system goes on
        assert fs.read_bytes("/after") == pattern(82, MiB)


def test_the_heartbeat_fits_in_the_abandoned_age_and_the_age_must_be_positive() -> None:
    from shinglefs.client.config import SESSION_HEARTBEAT_S
    from shinglefs.errors import UsageError

    assert ClientConfig().heartbeat_interval == SESSION_HEARTBEAT_S  # 10 s against 6 h
    assert ClientConfig(abandoned_slice_age=AGE).heartbeat_interval == AGE / 4
    for age in (0.0, -1.0, float("nan")):
        with pytest.raises(UsageError, match="abandoned_slice_age"):
            ClientConfig(abandoned_slice_age=age)
