"""``shinglefs scrub`` of a file system on storage servers (no drives of its own).

It used to stop at "the metadata names no drives". Each live server scrubs
its own drives when asked (SCRUB, server/scrubbing.py); the command maps the
damaged slices to files and tells a file whose damaged slice has no good
copy left (beyond repair) from one still readable from a verified copy on
another server (degraded). Real ``shinglefs server`` processes on loopback,
metadata in SQLite (the damage test on PostgreSQL too); damage is one byte
flipped in a server's drive image.
"""

from __future__ import annotations

import errno
import mmap
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.test_cluster_node import live_count, replica_servers
from tests.server.test_server_process import Server, cli, free_port
from tests.support.polling import wait_until

import shinglefs
from shinglefs.client.recovery import scrub
from shinglefs.meta import open_meta
from shinglefs.meta.api import DirPolicy, MetaStore
from shinglefs.server import scrubbing
from shinglefs.server.errors import RemoteNodeError, UnknownDrive
from shinglefs.server.node import StorageNode
from shinglefs.server.remote import RemoteNode
from shinglefs.server.service import SliceServer

MiB = 1024 * 1024
EXIT_DAMAGED = 41
EXIT_NOT_SCRUBBED = 42
NO_REPAIR = ("--repair-interval", "0")  # a damaged copy stays as the test left it


class Cluster:
    """Storage servers of one test, each with one emulated drive image."""

    def __init__(self, meta_url: str, meta: MetaStore, tmp_path: Path,
                 servers: list[Server]) -> None:
        self.meta_url, self.meta, self.tmp_path, self.servers = meta_url, meta, tmp_path, servers
        self.images: dict[int, Path] = {}  # server id -> its drive image
        self.procs: dict[int, Server] = {}

    def start(self, count: int) -> None:
        ports = {}
        for i in range(count):
            image = self.tmp_path / f"s{i}.img"
            port = free_port()
            server = Server(self.meta_url, [f"emulated:{image}:{256 * MiB}"], port, *NO_REPAIR)
            server.ready()
            self.servers.append(server)
            ports[f"127.0.0.1:{port}"] = (image, server)
        wait_until(lambda: live_count(self.meta) == count, f"{count} servers live")
        for record in self.meta.list_servers():
            self.images[record.id], self.procs[record.id] = ports[record.address]

    def write(self, path: str, data: bytes, goal: int | None = None) -> list[set[int]]:
        """Write ``path`` (its directory's goal set first); the servers of each slice."""
        fs = shinglefs.connect(self.meta_url)
        try:
            parent = os.path.dirname(path)
            fs.makedirs(parent, exist_ok=True)
            if goal is not None:
                self.meta.set_policy(fs.stat(parent).st_ino, DirPolicy(replicas=goal))
            fs.write_bytes(path, data)
            return replica_servers(self.meta, fs, path)
        finally:
            fs.close()

    def corrupt(self, server_id: int, data: bytes) -> None:
        """Flip one byte of the copy of ``data`` on the server's drive image."""
        needle = data[MiB:MiB + 64]
        with open(self.images[server_id], "r+b") as f, mmap.mmap(f.fileno(), 0) as image:
            at = image.find(needle)
            assert at >= 0 and image.find(needle, at + 1) < 0, "one copy on this drive"
            image[at + 17] ^= 0xFF
            image.flush()


@pytest.fixture
def cluster(meta_url: str, meta: MetaStore, tmp_path: Path,
            servers: list[Server]) -> Cluster:
    return Cluster(meta_url, meta, tmp_path, servers)


@pytest.fixture
def any_cluster(any_meta_url: str, tmp_path: Path,
                servers: list[Server]) -> Iterator[Cluster]:
    """A ``Cluster`` whose metadata is on each backend."""
    meta = open_meta(any_meta_url)
    yield Cluster(any_meta_url, meta, tmp_path, servers)
    meta.close()


def test_a_clean_cluster_scrubs_every_server_s_drives_exit_0(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.start(2)
    data = os.urandom(6 * MiB + 5)
    assert {len(s) for s in cluster.write("/plain/f.bin", data)} == {2}
    result = scrub(cluster.meta_url)
    assert result.finished and not result.damaged_files and not result.unreferenced
    assert sorted(result.servers) == sorted(cluster.images)
    for server in result.servers.values():
        assert server.error is None and server.drives
        assert server.bytes_read >= len(data)  # every server holds a copy
    assert result.bytes_read >= 2 * len(data)
    assert not any(Path(f"{image}.scrub").exists() for image in cluster.images.values())
    assert cli("scrub", cluster.meta_url) == 0
    assert "on 2 drive(s) of 2 server(s)" in capsys.readouterr().err


def test_a_damaged_only_copy_is_beyond_repair_a_damaged_replica_is_degraded(
        any_cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = any_cluster
    cluster.start(2)
    only, twice = os.urandom(5 * MiB), os.urandom(5 * MiB)
    (holders,) = cluster.write("/one/only.bin", only, goal=1)
    (both,) = cluster.write("/two/twice.bin", twice)
    assert len(holders) == 1 and len(both) == 2
    (holder,) = holders
    cluster.corrupt(holder, only)
    cluster.corrupt(holder, twice)  # the other server's copy stays good
    assert cli("scrub", cluster.meta_url) == EXIT_DAMAGED
    out = capsys.readouterr().out
    assert "damaged: /one/only.bin  [beyond repair" in out
    assert "damaged: /two/twice.bin  [degraded: still readable" in out
    assert f"server {holder} drive 0: {cluster.images[holder].name}: checksum mismatch" in out
    result = scrub(cluster.meta_url)
    assert result.file_health == {"/one/only.bin": "lost", "/two/twice.bin": "degraded"}
    assert result.finished  # every server scrubbed: the damage is all there is
    fs = shinglefs.connect(cluster.meta_url)
    try:
        assert fs.read_bytes("/two/twice.bin") == twice  # degraded: still readable
    finally:
        fs.close()


def test_a_stopped_server_is_reported_not_scrubbed_exit_42(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.start(2)
    data = os.urandom(5 * MiB)
    (both,) = cluster.write("/d/f.bin", data)
    stopped, live = sorted(both)
    proc = cluster.procs[stopped].proc
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert cli("scrub", cluster.meta_url) == EXIT_NOT_SCRUBBED
    captured = capsys.readouterr()
    assert f"not scrubbed: server {stopped} (" in captured.out
    assert captured.out.rstrip().endswith("stopped")
    assert "1 server(s) not scrubbed" in captured.err
    result = scrub(cluster.meta_url)
    assert not result.finished and result.servers[stopped].error == "stopped"
    assert result.servers[live].bytes_read >= len(data)

    cluster.corrupt(live, data)  # its only other copy is on the stopped server
    assert cli("scrub", cluster.meta_url) == EXIT_DAMAGED
    out = capsys.readouterr().out
    assert "damaged: /d/f.bin  [at risk: a slice's other copies were not scrubbed]" in out
    assert f"server {stopped} drive 0 not scrubbed" in out


def test_a_killed_server_still_counted_live_is_reported_unreachable(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.start(2)
    (both,) = cluster.write("/d/f.bin", os.urandom(5 * MiB))
    killed = min(both)
    proc = cluster.procs[killed].proc
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    # its last heartbeat is fresh (15 s count): scrub finds it live and cannot reach it
    assert {s.id: s.live for s in cluster.meta.list_servers()}[killed]
    assert cli("scrub", cluster.meta_url) == EXIT_NOT_SCRUBBED
    assert f"not scrubbed: server {killed} (" in capsys.readouterr().out
    result = scrub(cluster.meta_url)
    assert (result.servers[killed].error or "").startswith("ServerUnreachable")
    assert result.servers[max(both)].finished


def test_the_rate_reaches_each_server(cluster: Cluster,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHINGLEFS_LOG", "INFO")  # the servers log each scrub step
    cluster.start(2)
    cluster.write("/d/f.bin", os.urandom(3 * MiB))
    assert cli("scrub", "--rate", "64", cluster.meta_url) == 0
    assert cli("scrub", "--rate", "0.5", cluster.meta_url) == 2  # below 1 MiB/s per drive
    result = scrub(cluster.meta_url, rate_bytes=24 * MiB)
    assert result.finished
    assert {step.rate_bytes for s in result.servers.values() for step in s.drives.values()} \
        == {24 * MiB}  # as each server applied it
    for proc in cluster.procs.values():
        proc.proc.send_signal(signal.SIGTERM)
        log = proc.stop_output()
        assert "at 64.0 MiB/s" in log and "at 24.0 MiB/s" in log, log


# ---- the SCRUB request itself, against a server in this process -------------------------

SECRET = b"cluster secret of the scrub tests"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[StorageNode, RemoteNode, Path]]:
    """One drive holding four slices, served; the drive's image path."""
    image = tmp_path / "d0.img"
    node = StorageNode.open([(0, f"emulated:{image}:{256 * MiB}")], create=True,
                            zone_size=16 * MiB)
    for sid in range(1, 5):
        node.write(sid, 0, os.urandom(MiB + sid), group=1, durable=True)
    with SliceServer(node, SECRET) as server, \
            RemoteNode(server.address, SECRET, connections=1, timeout=60) as remote:
        yield node, remote, image
    node.close()


def test_a_drive_is_scrubbed_in_steps_that_resume_where_the_last_stopped(
        served: tuple[StorageNode, RemoteNode, Path]) -> None:
    _, remote, image = served
    steps = []
    while not steps or not steps[-1].finished:
        # a 1 ms budget, and each next extent's turn at 1 MiB/s a second away: one a step
        steps.append(step := remote.scrub_step(0, rate_bytes=MiB, budget_s=0.001))
        assert step.finished or Path(f"{image}.scrub").exists()  # the position is kept
    assert len(steps) == 4 and all(s.read > 0 for s in steps)
    assert [s.bytes_read for s in steps] == [sum(x.read for x in steps[:i + 1])
                                             for i in range(4)]
    assert steps[-1].bytes_read == sum(MiB + sid for sid in range(1, 5))
    assert not steps[-1].damaged and not Path(f"{image}.scrub").exists()


def test_a_scrub_request_is_refused_when_malformed_or_the_drive_is_busy(
        served: tuple[StorageNode, RemoteNode, Path]) -> None:
    _, remote, image = served
    with pytest.raises(UnknownDrive):
        remote.scrub_step(7)
    with pytest.raises(RemoteNodeError, match="at least 1048576 bytes/s") as low:
        remote.scrub_step(0, rate_bytes=1000)
    assert low.value.errno == errno.EINVAL
    busy = scrubbing._drive_scrub(scrubbing.scrub_state_path(f"emulated:{image}"))
    # held as a scrub of the drive running meanwhile holds it
    with busy.lock, pytest.raises(RemoteNodeError, match="being scrubbed already") as refused:
        remote.scrub_step(0)
    assert refused.value.errno == errno.EBUSY
    assert remote.scrub_step(0).finished  # the connection was kept
