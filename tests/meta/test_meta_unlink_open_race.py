"""unlink racing open(O_CREAT) of the same existing name, through the Python API.

One client unlinks ``/d/f`` while another opens it with ``O_CREAT`` (no
``O_EXCL``), over and over, on SQLite and on PostgreSQL metadata, from two
threads of one client (one session) and from two clients (two sessions: the
second reaches the drives through the first's share). POSIX allows one of two
outcomes per round, and nothing else:

- the open found the old inode before the unlink: the opener holds it
  (unlinked-but-open): it reads the old bytes, its writes read back, and the
  name is gone afterwards; the inode is freed at its last close;
- the unlink came first: the open created a fresh, empty file, which the
  name then names, holding what the opener wrote.

Neither call may fail (the name exists before the round, nothing else
removes it, and the directory stays). Afterwards no session still holds an
open record once every handle is closed, ``check_consistency`` finds nothing
(no dangling entry, no inode without links left behind) and fsck is clean.

Also here: open(O_CREAT) of another user's existing file racing a change of
its ctime is still access-checked (the client once told "made by this call"
from the ctime alone).
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.support.polling import wait_until

from shinglefs.client.api import ShingleFS, connect
from shinglefs.client.filesystem import format_filesystem, open_filesystem
from shinglefs.client.recovery import fsck
from shinglefs.meta import open_meta
from shinglefs.meta.api import MetaStore
from shinglefs.meta.check import check_consistency
from shinglefs.meta.errors import FsError
from shinglefs.meta.records import Ctx

GiB = 1024**3
ROUNDS = int(os.environ.get("SHINGLEFS_RACE_ROUNDS", "60"))  # more: a longer hunt
ACCESS_ROUNDS = 400
STEP_S = 0.0001
"""How far the head start moves after each round (see ``_round``)."""
OLD = b"old:" + bytes(range(256)) * 12  # 3 KiB: an inline file (no drive flush)
BIG_OLD = OLD * 2  # 6 KiB: a slice on the drive (every fourth round)
NEW = b"new:" + bytes(range(255, -1, -1)) * 8


@dataclass
class Outcomes:
    """What the rounds saw: outcome counts, and every broken promise."""

    seen: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    lead: float = 0.0
    """Seconds the opener starts after the unlinker in the next round."""


@dataclass
class Pair:
    """The two sides of the race: ``opener`` and ``unlinker`` (perhaps one client)."""

    opener: ShingleFS
    unlinker: ShingleFS
    clients: list[ShingleFS]
    meta: MetaStore
    """The metadata, opened apart from the clients, to look at."""

    def held(self) -> dict[int, tuple[int, ...]]:
        """Per session, the inodes meta says it holds open."""
        return {s.id: s.open_inodes for s in self.meta.list_sessions() if s.open_inodes}

    def settle(self) -> None:
        """With every handle closed: wait until every deferred close reached meta
        (``CloseQueue.drain``, and a batch the maintenance thread may be closing
        meanwhile), so no session holds an open record any more."""
        for fs in self.clients:
            fs.vfs.jobs.closes.drain()
        wait_until(lambda: not self.held(), "every open record closed")


@pytest.fixture
def fs_url(meta_url: str, tmp_path: Path) -> str:
    data = tmp_path / "data"
    data.mkdir()
    format_filesystem(meta_url, [f"emulated:{data / 'smr0.img'}:{4 * GiB}"], name="race")
    return meta_url


@pytest.fixture(params=["threads", "clients"])
def pair(request: pytest.FixtureRequest, fs_url: str) -> Iterator[Pair]:
    meta = open_meta(fs_url)
    first = connect(fs_url)
    clients = [first]
    try:
        if request.param == "threads":
            yield Pair(first, first, clients, meta)
            return
        # A second session in this process: connect() would share the first's
        # file system, so the second client joins through the drives' share.
        second = ShingleFS(open_filesystem(fs_url, join=True))
        clients.append(second)
        assert second.vfs.session != first.vfs.session
        yield Pair(second, first, clients, meta)
    finally:
        for fs in reversed(clients):
            fs.close()
        meta.close()


def _open_side(fs: ShingleFS, flags: int, old_ino: int, old_data: bytes,
               barrier: threading.Barrier, delay: float, out: Outcomes,
               result: dict[str, int]) -> None:
    barrier.wait()
    time.sleep(delay)  # not a spin: that would hold the GIL from the other side
    try:
        raw = fs.open_raw("/d/f", flags)
    except OSError as exc:
        out.problems.append(f"open(O_CREAT) failed: {exc!r}")
        return
    try:
        result["ino"] = raw.ino
        old = raw.ino == old_ino
        first = raw.read(len(old_data) + 10)
        want = old_data if old and not flags & os.O_TRUNC else b""
        if first != want:
            out.problems.append(f"{'old' if old else 'fresh'} inode {raw.ino} read "
                                f"{len(first)} bytes, expected {len(want)}")
        raw.seek(0)
        raw.write(NEW)
        raw.seek(0)
        again = raw.read(len(NEW) + len(old_data))
        want = NEW + (old_data[len(NEW):] if old and not flags & os.O_TRUNC else b"")
        if again != want:
            out.problems.append(f"inode {raw.ino}: its own writes read back wrong "
                                f"({len(again)} bytes)")
    except OSError as exc:
        out.problems.append(f"I/O on the opened inode {raw.ino} failed: {exc!r}")
    finally:
        try:
            raw.close()
        except OSError as exc:
            out.problems.append(f"close of inode {raw.ino} failed: {exc!r}")


def _unlink_side(fs: ShingleFS, barrier: threading.Barrier, delay: float,
                 out: Outcomes) -> None:
    barrier.wait()
    time.sleep(delay)  # not a spin: that would hold the GIL from the other side
    try:
        fs.unlink("/d/f")
    except OSError as exc:
        out.problems.append(f"unlink of an existing name failed: {exc!r}")


def _round(pair: Pair, i: int, rng: random.Random, out: Outcomes) -> None:
    old_data = BIG_OLD if i % 4 == 3 else OLD
    with pair.unlinker.open("/d/f", "wb") as f:  # the existing name, closed
        f.write(old_data)
    old_ino = int(pair.unlinker.stat("/d/f").st_ino)
    # Open nowhere, as a file closed long ago: else the writer's deferred close
    # keeps it alive through the unlink and the race never frees it.
    pair.settle()
    flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if i % 3 == 2 else 0)
    barrier = threading.Barrier(2)
    result: dict[str, int] = {}
    # The opener starts ``out.lead`` seconds after the unlinker (before it when
    # negative), give or take a little. The lead walks towards the instant
    # where either may win (one STEP_S against the side that won): most
    # rounds land where the two transactions overlap.
    delay = out.lead + rng.gauss(0.0, STEP_S)
    sides: list[Callable[[], None]] = [
        lambda: _open_side(pair.opener, flags, old_ino, old_data, barrier, max(delay, 0.0),
                           out, result),
        lambda: _unlink_side(pair.unlinker, barrier, max(-delay, 0.0), out),
    ]
    threads = [threading.Thread(target=side) for side in sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if "ino" not in result:
        return
    try:
        now = pair.unlinker.stat("/d/f")
    except FileNotFoundError:
        now = None
    if result["ino"] == old_ino:
        out.seen["old inode"] += 1
        out.lead += STEP_S
        if now is not None:
            out.problems.append(f"round {i}: the old inode was opened and unlinked, "
                                f"yet the name names inode {now.st_ino}")
        return
    out.seen["fresh file"] += 1
    out.lead -= STEP_S
    if now is None or now.st_ino != result["ino"]:
        out.problems.append(f"round {i}: a fresh inode {result['ino']} was created after "
                            f"the unlink, but the name names "
                            f"{'nothing' if now is None else now.st_ino}")
    elif pair.unlinker.read_bytes("/d/f") != NEW:
        out.problems.append(f"round {i}: the fresh file does not hold what was written")
    pair.unlinker.unlink("/d/f")  # the next round begins from a new file


def test_unlink_racing_open_creat_of_the_same_name(pair: Pair, fs_url: str) -> None:
    pair.unlinker.makedirs("/d", exist_ok=True)
    rng = random.Random(7)
    out = Outcomes()
    for i in range(ROUNDS):
        _round(pair, i, rng, out)
    assert out.problems == [], "\n".join(out.problems[:20])
    assert sum(out.seen.values()) == ROUNDS
    # Both orders happened (else the test raced nothing).
    assert out.seen["old inode"] > 0 and out.seen["fresh file"] > 0, out.seen

    # Every handle is closed: once the deferred closes reach meta no session
    # holds any inode open, and no inode without a link is left.
    pair.settle()
    problems = check_consistency(pair.meta)
    assert problems == [], "\n".join(f"{p.check}: {p.detail}" for p in problems)
    for fs in reversed(pair.clients):
        fs.close()
    report = fsck(fs_url)
    assert report.clean, {k: [f.detail for f in v] for k, v in report.found.items() if v}


def test_open_creat_of_an_existing_file_is_access_checked_while_its_ctime_moves(
        fs_url: str) -> None:
    """open(O_CREAT) without O_EXCL of another user's read-only file must fail
    with EACCES, also when the file's ctime moves during the open (its owner
    chmods it over and over): the client once took "ctime at or after the
    call began" for "created by this call" and skipped the access check."""
    root = connect(fs_url)
    user = ShingleFS(root.vfs, Ctx(uid=1000, gid=1000), release=lambda: None)
    try:
        root.makedirs("/d", exist_ok=True)
        root.chmod("/d", 0o777)
        root.write_bytes("/d/mine", b"root's")
        root.chmod("/d/mine", 0o444)
        stop = threading.Event()

        def chmod_loop() -> None:
            while not stop.is_set():
                root.chmod("/d/mine", 0o444)  # the same mode: only the ctime moves

        bumper = threading.Thread(target=chmod_loop)
        bumper.start()
        opened = 0
        try:
            for _ in range(ACCESS_ROUNDS):
                try:
                    raw = user.open_raw("/d/mine", os.O_WRONLY | os.O_CREAT)
                except PermissionError:
                    continue
                opened += 1
                raw.close()
        finally:
            stop.set()
            bumper.join(60)
        assert opened == 0, f"{opened} of {ACCESS_ROUNDS} opens for writing were let through"
        assert root.read_bytes("/d/mine") == b"root's"
    finally:
        user.close()
        root.close()


def test_an_open_of_an_inode_another_client_freed_is_stale_not_absent(fs_url: str) -> None:
    """A mount opens by inode number, from an entry the kernel cached: if
    another client unlinked that name (or renamed another file over it) and
    the inode is freed, the open must fail with ESTALE, on which the kernel
    looks the name up again and retries (opening or creating what is there
    now). ENOENT reached the application for open(O_CREAT) of a name, and for
    a plain open of a name that exists (checkpoint ``latest`` replaced on
    another host), for up to the entry timeout."""
    first = connect(fs_url)
    second = ShingleFS(open_filesystem(fs_url, join=True))
    try:
        first.makedirs("/d", exist_ok=True)
        for victim in ("unlinked", "renamed over"):
            first.write_bytes("/d/latest", b"v1")
            cached = first.stat("/d/latest").st_ino  # the entry a kernel would keep
            if victim == "unlinked":
                second.unlink("/d/latest")
            else:
                second.write_bytes("/d/tmp", b"v2")
                second.replace("/d/tmp", "/d/latest")
            second.vfs.jobs.closes.drain()
            first.vfs.jobs.closes.drain()
            wait_until(lambda: all(not s.open_inodes for s in first.vfs.meta.list_sessions()),
                       "every open record closed")
            for flags in (os.O_RDONLY, os.O_RDWR | os.O_CREAT):
                with pytest.raises(FsError) as failed:
                    first.vfs.open(int(cached), flags)
                assert failed.value.errno == errno.ESTALE, (victim, flags, failed.value)
    finally:
        second.close()
        first.close()


def test_api_open_of_a_name_replaced_meanwhile_opens_what_is_there(fs_url: str) -> None:
    """``open`` resolves the path, then opens the inode: a rename over the
    name in between (a checkpoint's ``latest`` replaced) frees that inode.
    The API resolves again and opens once more, as the kernel does on ESTALE:
    the reader always gets one whole version, never an error.

    The reader goes on until the writer has replaced the name 20 times (a
    loaded machine can run 400 reads before the writer's first replace); a
    writer that cannot replace it in a minute beside a reader fails the test."""
    fs = connect(fs_url)
    stop = threading.Event()
    versions = {b"v%d" % i * 512 for i in range(8)}
    try:
        fs.makedirs("/d", exist_ok=True)
        fs.write_bytes("/d/latest", b"v0" * 512)

        def replace_forever() -> None:
            i = 0
            while not stop.is_set():
                i = (i + 1) % 8
                fs.write_bytes("/d/tmp", b"v%d" % i * 512)
                fs.replace("/d/tmp", "/d/latest")
                replaced.append(i)

        replaced: list[int] = []
        writer = threading.Thread(target=replace_forever, daemon=True)
        writer.start()
        seen = set()
        reads = 0
        deadline = time.monotonic() + 60
        while reads < 400 or len(replaced) < 20:
            assert time.monotonic() < deadline, f"{len(replaced)} replaces beside {reads} reads in 60 s"
            with fs.open("/d/latest", "rb") as f:
                seen.add(f.read())
            reads += 1
        stop.set()
        writer.join(timeout=30)
        assert seen <= versions and len(seen) > 1, sorted(v[:2] for v in seen)
    finally:
        stop.set()
        fs.close()
