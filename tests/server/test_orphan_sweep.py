"""The orphan sweep of storage servers (server/sweep.py), against real servers.

Servers run in this process (``StorageServer``, loopback, no background
passes); each test drives a ``Sweeper`` with a clock of its own, so a grace
period is over exactly when the test says, never after a sleep. A client
killed after sending a slice leaves a copy that is deleted once its grace is
over (its space is back, and a late commit of it fails cleanly); committed
slices are never swept; a replica dropped from its record while its server
was down is deleted when the server returns; a commit that lands while a
copy waits keeps it; ``shinglefs server`` sweeps by itself (its flags) and
logs what it deleted. The meta side (``slice_records``, ``claim_orphans``) is
checked on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.server.test_server_process import Server, cli, free_port
from tests.support.polling import wait_until

import shinglefs
from shinglefs.meta import open_meta
from shinglefs.meta.api import (
    ROOT_INO,
    SLICE_RECORDS_BATCH,
    MetaStore,
    Replica,
    SliceInfo,
    SliceRef,
    SliceState,
)
from shinglefs.meta.errors import FsError, SliceStateError
from shinglefs.server.errors import SliceMissing
from shinglefs.server.process import ServerConfig, StorageServer, cluster_key
from shinglefs.server.remote import RemoteNode
from shinglefs.server.repair import Repairer
from shinglefs.server.sweep import Sweeper

MiB = 1024 * 1024
GRACE = 3600.0

# A client that sends one slice's bytes to a server, flushed, and never commits:
# it prints the slice id, then waits to be killed.
SENDER = """
import os, sys
from shinglefs.meta import open_meta
from shinglefs.server.process import cluster_key
from shinglefs.server.remote import RemoteNode
meta = open_meta(sys.argv[1])
slice_id = meta.next_slice_id()
remote = RemoteNode(sys.argv[2], cluster_key(meta))
remote.write(slice_id, 0, os.urandom(int(sys.argv[3])), 7, drive_id=0)
remote.flush([0])
print(slice_id, flush=True)
sys.stdin.read()
"""


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start(meta_url: str, tmp_path: Path, name: str) -> StorageServer:
    """A storage server on one emulated drive, with no background passes."""
    config = ServerConfig(meta_url, (f"emulated:{tmp_path / name}.img:{512 * MiB}",),
                          ("127.0.0.1", 0), heartbeat_s=0.2, zone_size=16 * MiB,
                          repair_interval_s=0, sweep_interval_s=0)
    return StorageServer(config).start()


def sweeper(meta: MetaStore, server: StorageServer, clock: Clock) -> Sweeper:
    assert server.server_id is not None
    return Sweeper(meta, server.node, server.server_id, grace_s=GRACE, clock=clock)


def send_unrecorded(meta: MetaStore, server: StorageServer, data: bytes) -> int:
    """Store ``data`` as a new slice on the server's drive 0, flushed, with no record."""
    slice_id = meta.next_slice_id()
    with RemoteNode(server.address, cluster_key(meta)) as remote:
        remote.write(slice_id, 0, data, 7, drive_id=0)
        remote.flush([0])
    return slice_id


def commit(meta: MetaStore, name: bytes, slice_id: int, length: int,
           replica: Replica) -> int:
    """A client's commit of a whole slice as the file ``/name``; its inode."""
    ino = meta.mknod(ROOT_INO, name, stat.S_IFREG | 0o644).ino
    meta.commit_slice(ino, 0, SliceRef(slice_id, 0, length, 0), length,
                      slice_length=length, replicas=[replica])
    return ino


def mine(server: StorageServer, drive: int = 0) -> Replica:
    return Replica(str(server.server_id), str(drive))


def test_the_copy_a_killed_client_sent_is_deleted_once_its_grace_is_over(
        tmp_path: Path, any_meta_url: str) -> None:
    meta = open_meta(any_meta_url)
    server = start(any_meta_url, tmp_path, "s1")
    try:
        empty = server.node.stats().live_bytes
        client = subprocess.Popen(
            [sys.executable, "-c", SENDER, any_meta_url, server.address, str(3 * MiB + 5)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdout is not None
            slice_id = int(client.stdout.readline())
        finally:
            client.send_signal(signal.SIGKILL)
            client.communicate(timeout=60)
        assert server.node.stats().live_bytes == empty + 3 * MiB + 5
        clock = Clock()
        sweep = sweeper(meta, server, clock)
        first = sweep.run_once()
        assert (first.checked, first.waiting, first.swept) == (1, 1, 0)
        clock.now = GRACE - 1
        assert sweep.run_once().swept == 0
        assert server.node.contains(slice_id, 0)
        clock.now = GRACE
        done = sweep.run_once()
        assert (done.swept, done.swept_bytes, done.waiting) == (1, 3 * MiB + 5, 0)
        assert not server.node.contains(slice_id, 0)
        assert server.node.stats().live_bytes == empty
        # Claimed in meta: deleted, named on this drive, queued but held for the grace.
        info = meta.get_slice(slice_id)
        assert (info.state, info.replicas) == (SliceState.TO_DELETE, (mine(server),))
        assert meta.pop_deletions() == []
        with pytest.raises(SliceStateError):  # the dead client's commit, had it come
            commit(meta, b"late", slice_id, 3 * MiB + 5, mine(server))
    finally:
        server.stop()
        meta.close()


def test_committed_slices_are_never_swept(tmp_path: Path, meta_url: str,
                                          meta: MetaStore) -> None:
    server = start(meta_url, tmp_path, "s1")
    try:
        wait_until(lambda: any(s.live for s in meta.list_servers()), "the server live")
        data = os.urandom(40 * MiB + 3)
        with shinglefs.connect(meta_url) as fs:
            fs.write_bytes("/kept.bin", data)
        held = server.node.stats().live_bytes
        clock = Clock()
        sweep = sweeper(meta, server, clock)
        for clock.now in (0.0, GRACE, 10 * GRACE):
            counts = sweep.run_once()
            assert (counts.swept, counts.waiting) == (0, 0)
            assert counts.checked >= 3  # 40 MiB in chunks of 16 MiB
        assert server.node.stats().live_bytes == held
        with shinglefs.connect(meta_url) as fs:
            assert fs.read_bytes("/kept.bin") == data
    finally:
        server.stop()


def test_a_replica_dropped_while_its_server_was_down_is_deleted_when_it_returns(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    names = ("s1", "s2", "s3")
    running = {name: start(meta_url, tmp_path, name) for name in names}
    try:
        wait_until(lambda: sum(s.live for s in meta.list_servers()) == 3, "three servers live")
        data = os.urandom(20 * MiB + 7)
        with shinglefs.connect(meta_url) as fs:
            fs.write_bytes("/f.bin", data)  # two replicas of each slice (three servers)
            ino = fs.stat("/f.bin").st_ino
        slices = [p.slice_id for p in meta.read_map(ino, 0, len(data))]
        down_name = next(n for n in names if any(
            mine(running[n]) in meta.get_slice(s).replicas for s in slices))
        down = running.pop(down_name)
        down_id = down.server_id
        dropped = [s for s in slices if mine(down) in meta.get_slice(s).replicas]
        down.stop()  # the server goes away; the others copy what it held
        key = cluster_key(meta)
        for server in running.values():
            assert server.server_id is not None
            Repairer(meta, server.node, server.server_id, key, repair_after_s=1.0).run_once()
        for s in slices:
            replicas = meta.get_slice(s).replicas
            assert len(replicas) == 2 and str(down_id) not in {r.server for r in replicas}
        back = running[down_name] = start(meta_url, tmp_path, down_name)
        assert back.server_id == down_id
        assert all(back.node.contains(s, 0) for s in dropped)  # its old copies, unnamed
        clock = Clock()
        sweep = sweeper(meta, back, clock)
        assert sweep.run_once().waiting == len(dropped)
        clock.now = GRACE
        counts = sweep.run_once()
        assert (counts.swept, counts.waiting) == (len(dropped), 0)
        assert not any(back.node.contains(s, 0) for s in dropped)
        assert all(meta.get_slice(s).state == SliceState.COMMITTED for s in dropped)
        with shinglefs.connect(meta_url) as fs:
            assert fs.read_bytes("/f.bin") == data
    finally:
        for server in running.values():
            server.stop()


def test_a_commit_that_lands_while_the_copy_waits_keeps_it(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    server = start(meta_url, tmp_path, "s1")
    try:
        data = os.urandom(2 * MiB + 1)
        slow = send_unrecorded(meta, server, data)  # a slow client, alive
        clock = Clock()
        sweep = sweeper(meta, server, clock)
        assert sweep.run_once().waiting == 1  # seen unrecorded: its wait starts
        clock.now = GRACE / 2
        commit(meta, b"slow.bin", slow, len(data), mine(server))  # the commit arrives
        clock.now = 2 * GRACE
        counts = sweep.run_once()
        assert (counts.checked, counts.swept, counts.waiting) == (1, 0, 0)
        with shinglefs.connect(meta_url) as fs:
            assert fs.read_bytes("/slow.bin") == data
        # A client stalled past the grace loses the race cleanly: its commit fails.
        stalled = send_unrecorded(meta, server, data)
        sweep.run_once()
        clock.now = 3 * GRACE
        assert sweep.run_once().swept == 1
        with pytest.raises(SliceStateError):
            commit(meta, b"stalled.bin", stalled, len(data), mine(server))
        with shinglefs.connect(meta_url) as fs:
            assert fs.read_bytes("/slow.bin") == data
            assert fs.stat("/stalled.bin").st_size == 0  # made, never given the bytes
    finally:
        server.stop()


def test_shinglefs_server_sweeps_by_itself_and_logs_what_it_deleted(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHINGLEFS_LOG", "INFO")
    port = free_port()
    server = Server(meta_url, [f"emulated:{tmp_path / 's1.img'}:{512 * MiB}"], port,
                    "--repair-interval", "0", "--orphan-grace", "0", "--sweep-interval", "0.2")
    servers.append(server)
    server.ready()
    slice_id = meta.next_slice_id()
    with RemoteNode(f"127.0.0.1:{port}", cluster_key(meta)) as remote:
        remote.write(slice_id, 0, os.urandom(MiB), 7, drive_id=0)
        remote.flush([0])

        def gone() -> bool:
            try:
                remote.length(slice_id, 0)
            except SliceMissing:
                return True
            return False

        wait_until(gone, "the server swept the unrecorded copy")
    assert meta.get_slice(slice_id).state == SliceState.TO_DELETE
    server.proc.send_signal(signal.SIGTERM)
    assert f"orphan copy of slice {slice_id:#x} ({MiB} bytes, unrecorded) deleted" \
        in server.stop_output()


def test_a_pass_checks_at_most_its_share_and_the_next_pass_goes_on(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    server = start(meta_url, tmp_path, "s1")
    try:
        orphans = [send_unrecorded(meta, server, os.urandom(4096)) for _ in range(5)]
        assert server.server_id is not None
        sweep = Sweeper(meta, server.node, server.server_id, grace_s=0, checks_per_pass=2)
        assert [(c.checked, c.swept) for c in (sweep.run_once() for _ in range(3))] == [
            (2, 2), (2, 2), (1, 1)]
        assert not any(server.node.contains(s, 0) for s in orphans)
        assert sweep.run_once().checked == 0
        assert (sweep.passes, sweep.totals.swept) == (4, 5)
    finally:
        server.stop()


@pytest.mark.parametrize("flag", ["--orphan-grace", "--sweep-interval"])
def test_a_negative_sweep_flag_is_exit_2(tmp_path: Path, meta_url: str, flag: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("server", meta_url, "--listen", "127.0.0.1:0", "--drive",
               f"emulated:{tmp_path / 's1.img'}:{512 * MiB}", flag, "-1") == 2
    assert "must not be negative" in capsys.readouterr().err
    assert not (tmp_path / "s1.img").exists()


def test_a_claim_and_a_commit_of_one_slice_exclude_each_other(any_meta_url: str) -> None:
    meta = open_meta(any_meta_url)
    try:
        committed, claimed, raced = (meta.next_slice_id() for _ in range(3))
        ino = commit(meta, b"f", committed, 100, Replica("1", "0"))
        records = meta.slice_records([committed, claimed, raced])
        assert list(records) == [committed]
        assert records[committed] == SliceInfo(committed, 100, 0, SliceState.COMMITTED, 1,
                                               (Replica("1", "0"),))
        # The sweep read no record for ``raced``; its commit lands before the claim.
        meta.commit_slice(ino, 1, SliceRef(raced, 0, 10, 0), 16 * MiB + 10,
                          slice_length=10, replicas=[Replica("1", "0")])
        never = claimed + 10_000  # beyond every id meta handed out
        assert meta.claim_orphans(2, 0, {committed: 100, claimed: 50, raced: 10, never: 5},
                                  GRACE) == [claimed]
        assert meta.get_slice(raced).state == SliceState.COMMITTED
        assert meta.get_slice(claimed) == SliceInfo(claimed, 50, 0, SliceState.TO_DELETE, 0,
                                                    (Replica("2", "0"),))
        with pytest.raises(FsError):  # nothing is known of it
            meta.get_slice(never)
        # The claim came first: a commit or a registration of the id fails.
        with pytest.raises(SliceStateError):
            meta.commit_slice(ino, 2, SliceRef(claimed, 0, 50, 0), 32 * MiB + 50,
                              slice_length=50)
        with pytest.raises(FsError):
            meta.add_slice(SliceInfo(claimed, 0, 0, SliceState.WRITING))
        assert meta.pop_deletions() == []  # held for the grace
        assert meta.claim_orphans(2, 0, {meta.next_slice_id(): 1}, 0.0)
        popped = meta.pop_deletions()
        assert len(popped) == 1 and popped[0].state == SliceState.TO_DELETE
        meta.ack_deletions([popped[0].id])
        with pytest.raises(FsError):
            meta.slice_records(list(range(1, SLICE_RECORDS_BATCH + 2)))
    finally:
        meta.close()
