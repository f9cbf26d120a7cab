"""A full file system on storage servers: ENOSPC, never EIO or EINVAL, nothing lost.

The embedded file system says ENOSPC from ``write(2)`` when its drives are
full (tests/fuse/test_full_filesystem.py); a client of storage servers does
the same from its reservation (tests/server/test_honest_space.py). Here the
case the reservation cannot see: another client filled the servers since
this client last read their figures, so a server refuses a piece this
client's reservation admitted. The user must then see ENOSPC (from a later
``write`` or, at the latest, from ``close``), never EIO, EINVAL or an
assertion; every file closed before reads back bit-exact, also through a
client that connects afresh; and once files are deleted (the servers'
deletion pass frees their copies) writing works again.

Real ``shinglefs server`` processes on loopback with small emulated drives,
metadata in SQLite; two independent clients in this process
(``open_filesystem``: each its own ``ClusterNode``, its own reservations).
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.server.test_server_process import TIMEOUT_S, Server, free_port
from tests.support.polling import wait_until

import shinglefs
from shinglefs.client.api import ShingleFS
from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import open_filesystem
from shinglefs.errors import ShingleError
from shinglefs.fuse.harness import MountedFileSystem
from shinglefs.meta.api import MetaStore

MiB = 1024 * 1024


def start(meta_url: str, tmp_path: Path, servers: list[Server], sizes_mib: list[int],
          meta: MetaStore) -> None:
    """One server per size, each with one emulated drive of that many MiB; their
    deletion pass runs often (the refill waits for it)."""
    for i, size in enumerate(sizes_mib):
        server = Server(meta_url, [f"emulated:{tmp_path}/d{i}.img:{size * MiB}"], free_port(),
                        "--deletion-interval", "0.3")
        server.ready()
        servers.append(server)
    wait_until(lambda: sum(s.live for s in meta.list_servers(TIMEOUT_S)) == len(sizes_mib),
               f"{len(sizes_mib)} servers live")


@pytest.fixture
def clients(meta_url: str) -> Iterator[list[ShingleFS]]:
    """Independent clients of ``meta_url`` (``client()``), closed at the end."""
    made: list[ShingleFS] = []
    yield made
    for fs in made:
        fs.close()


def client(meta_url: str, made: list[ShingleFS]) -> ShingleFS:
    """A client of its own (not shared with ``connect``): its own cluster node,
    membership figures and reservations."""
    fs = ShingleFS(open_filesystem(meta_url))
    made.append(fs)
    return fs


class ApiFiles:
    """Files through the Python API of ``fs`` (``Filler``'s way to write)."""

    def __init__(self, fs: ShingleFS) -> None:
        self.fs = fs

    def open(self, path: str) -> Any:
        return self.fs.open(path, "wb", buffering=0)

    def write(self, f: Any, data: bytes) -> None:
        assert f.write(data) == len(data)

    def close(self, f: Any) -> None:
        f.close()


class MountFiles:
    """Files through a mount at ``mnt``: ``write(2)``, ``close(2)``."""

    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt

    def open(self, path: str) -> int:
        return os.open(self.mnt / path.lstrip("/"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a write(2) the kernel splits may return a short count
            view = view[os.write(fd, view):]

    def close(self, fd: int) -> None:
        os.close(fd)


class Filler:
    """One client writing files of random bytes until the space runs out.

    ``step`` writes one block; a file ends after ``file_bytes`` (then closed) or
    at the first error (then closed too: the error of ``close`` is recorded
    as well). ``closed``: the content of every file whose ``close`` returned
    before any error; ``created``: every file's path.
    """

    def __init__(self, files: ApiFiles | MountFiles, prefix: str, file_bytes: int, block: int,
                 rng: random.Random) -> None:
        self.files = files
        self.prefix = prefix
        self.file_bytes = file_bytes
        self.block = block
        self.rng = rng
        self.closed: dict[str, bytes] = {}
        self.created: list[str] = []
        self.errors: list[OSError] = []
        self.full = False
        self._file: Any = None
        self._content = bytearray()

    def step(self) -> None:
        if self.full:
            return
        if self._file is None:
            path = f"/{self.prefix}{len(self.created)}"
            try:
                self._file = self.files.open(path)
            except OSError as exc:
                self._failed(exc)
                return
            self.created.append(path)
            self._content = bytearray()
        data = self.rng.randbytes(min(self.block, self.file_bytes - len(self._content)))
        try:
            self.files.write(self._file, data)
        except OSError as exc:
            self._failed(exc)
            self._close()
            return
        self._content += data
        if len(self._content) >= self.file_bytes:
            self._close()

    def _close(self) -> None:
        f, self._file = self._file, None
        try:
            self.files.close(f)
        except OSError as exc:
            self._failed(exc)
            return
        if not self.full:
            self.closed[self.created[-1]] = bytes(self._content)

    def _failed(self, exc: OSError) -> None:
        self.errors.append(exc)
        self.full = True


def fill_together(fillers: list[Filler]) -> None:
    """Step every filler in turn until each ran out of space."""
    for _ in range(100_000):
        if all(f.full for f in fillers):
            return
        for f in fillers:
            f.step()
    raise AssertionError("the space never ran out")


def check_all_enospc(fillers: list[Filler]) -> None:
    for f in fillers:
        assert f.errors, f.prefix
        assert [e.errno for e in f.errors] == [errno.ENOSPC] * len(f.errors), [
            (type(e).__name__, e.errno, str(e)) for e in f.errors]


def check_read_back(fs: ShingleFS, files: dict[str, bytes]) -> None:
    for path, content in files.items():
        with fs.open(path, "rb") as f:
            assert f.read() == content, path


def check_reconnected(meta_url: str, files: dict[str, bytes]) -> None:
    """``files`` read back bit-exact through a client that connects afresh."""
    again = shinglefs.connect(meta_url)
    try:
        check_read_back(again, files)
    finally:
        again.close()


def delete_and_write_again(fs: ShingleFS, paths: list[str], rng: random.Random) -> None:
    """Delete ``paths``; once the servers' deletion pass freed their copies (df
    shows room again), a new file of 16 MiB is written, closed and read back."""
    for path in paths:
        fs.unlink(path)
    wait_until(lambda: fs.statvfs().free_bytes >= 32 * MiB, "the deleted files' room is back")
    content = rng.randbytes(16 * MiB)
    with fs.open("/after.bin", "wb") as f:
        f.write(content)
    check_read_back(fs, {"/after.bin": content})


@pytest.mark.parametrize(("sizes_mib", "file_mib"), [([128], 256), ([128, 128], 3)],
                         ids=["1-server-big-files", "2-servers-small-files"])
def test_two_clients_fill_the_servers_and_see_only_enospc(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        clients: list[ShingleFS], sizes_mib: list[int], file_mib: int) -> None:
    """Each client's reservation counts on room the other one takes: servers
    refuse pieces that were admitted (before: EINVAL at close, from the
    refused slice's later pieces meeting an order error)."""
    start(meta_url, tmp_path, servers, sizes_mib, meta)
    a, b = client(meta_url, clients), client(meta_url, clients)
    assert a.statvfs().free_bytes == b.statvfs().free_bytes > 32 * MiB
    rng = random.Random(file_mib)
    fillers = [Filler(ApiFiles(a), "a", file_mib * MiB, MiB, rng),
               Filler(ApiFiles(b), "b", file_mib * MiB, MiB, rng)]
    fill_together(fillers)
    check_all_enospc(fillers)
    closed = {**fillers[0].closed, **fillers[1].closed}
    check_read_back(a, closed)
    check_reconnected(meta_url, closed)
    delete_and_write_again(b, [p for f in fillers for p in f.created], rng)


@pytest.mark.parametrize(("file_bytes", "block"), [(1 << 30, 4 * MiB), (3 * MiB // 2, MiB // 2)],
                         ids=["one-big-file", "many-small-files"])
def test_one_client_fills_the_server_then_writes_again_after_deleting(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        file_bytes: int, block: int) -> None:
    start(meta_url, tmp_path, servers, [128], meta)
    fs = shinglefs.connect(meta_url)
    try:
        filler = Filler(ApiFiles(fs), "f", file_bytes, block, random.Random(block))
        fill_together([filler])
        check_all_enospc([filler])
        check_read_back(fs, filler.closed)
        check_reconnected(meta_url, filler.closed)
        delete_and_write_again(fs, ["/" + name for name in fs.listdir("/")],
                               random.Random(1))
    finally:
        fs.close()


def test_a_slice_whose_first_piece_cannot_be_sent_fails_its_write_not_an_assertion(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """The first piece of a file's second slice finds no server to go to:
    ``submit`` itself raises (``NoServers``, EIO), nothing sent. Here the
    only server died during the first slice (a refused connection leaves it
    out of placement) and a small write budget makes the write wait for the
    first slice's failed pieces before it fills the second slice's first.
    Before, that slice stayed open with its bytes gone and no drive, and
    ``close`` met ``assert s.drive_id is not None`` (EIO from an AssertionError)."""
    start(meta_url, tmp_path, servers, [128], meta)
    config = ClientConfig(total_buffer_bytes=8 * MiB)
    fs = ShingleFS(open_filesystem(meta_url, config=config))
    try:
        assert fs.statvfs().free_bytes > 32 * MiB  # membership read: the server is live
        servers[0].kill()  # still live in meta (and to this client) for a while
        f = fs.open("/x", "wb", buffering=0)
        problems = []
        try:
            f.write(random.Random(1).randbytes(20 * MiB))  # past the 16 MiB chunk
        except OSError as exc:
            problems.append(exc)
        try:
            f.close()
        except OSError as exc:
            problems.append(exc)
        assert problems
        for problem in problems:
            assert isinstance(problem.__cause__, ShingleError), repr(problem.__cause__)
    finally:
        fs.close()


@pytest.mark.fuse
def test_a_mount_and_another_client_fill_the_server_and_see_only_enospc(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        clients: list[ShingleFS]) -> None:
    """The same through ``write(2)`` and ``close(2)`` on a mount (its FUSE fast
    paths included): ENOSPC only, files closed before read back, room again
    after deleting through the mount."""
    start(meta_url, tmp_path, servers, [128], meta)
    mnt, state = tmp_path / "mnt", tmp_path / "mount"
    mnt.mkdir()
    state.mkdir()
    mounted = MountedFileSystem(state, mnt, meta_url=meta_url)
    mounted.start()  # not `with`: that would format
    try:
        other = client(meta_url, clients)
        assert os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize > 32 * MiB
        rng = random.Random(5)
        fillers = [Filler(MountFiles(mnt), "m", 256 * MiB, MiB, rng),
                   Filler(ApiFiles(other), "c", 256 * MiB, MiB, rng)]
        fill_together(fillers)
        check_all_enospc(fillers)
        closed = {**fillers[0].closed, **fillers[1].closed}
        for path, content in closed.items():
            assert (mnt / path.lstrip("/")).read_bytes() == content, path
        check_reconnected(meta_url, closed)
        for path in fillers[0].created + fillers[1].created:
            os.unlink(mnt / path.lstrip("/"))

        def room() -> int:
            st = os.statvfs(mnt)
            return st.f_bavail * st.f_frsize

        wait_until(lambda: room() >= 32 * MiB, "the deleted files' room is back")
        content = rng.randbytes(16 * MiB)
        (mnt / "after.bin").write_bytes(content)
        check_reconnected(meta_url, {"/after.bin": content})
    finally:
        mounted.stop()
