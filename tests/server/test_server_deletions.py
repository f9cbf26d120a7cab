"""Storage servers free their own drives (server/deletions.py), with no client mounted.

Real servers on loopback (``StorageServer`` in this process, one in a
subprocess killed mid-pass, and ``shinglefs server`` freeing by itself). A
file written by a client that then closes, and deleted in meta, is freed on
both servers' drives by their deletion passes: the copies leave each drive's
index, the live bytes come back, the slice records and queue entries are
gone, and the metadata check finds nothing. A server that is down while the
deletion is queued frees its copies when it returns; the other frees its
own at once. A server killed between its deletes and its acknowledgement
loses nothing: the records still name its (deleted) copies, and its next
pass completes. A copy the orphan sweep claimed leaves no record behind.
The meta side (``pop_deletions_on``, ``ack_replica_deletions``) is checked
on SQLite and PostgreSQL.
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
from shinglefs.meta.api import ROOT_INO, MetaStore, Replica, SliceInfo, SliceRef, SliceState
from shinglefs.meta.check import check_consistency
from shinglefs.meta.dump import backend_of
from shinglefs.meta.errors import SliceStateError
from shinglefs.server.deletions import ServerDeletions
from shinglefs.server.process import ServerConfig, StorageServer, cluster_key
from shinglefs.server.remote import RemoteNode
from shinglefs.server.sweep import Sweeper

MiB = 1024 * 1024

# A storage server that runs no pass of its own, takes its share of the deletion
# queue (leased for 1 s), deletes and flushes its copies, says how many slices,
# then waits to be killed before it acknowledges anything.
CRASHING = """
import sys
from shinglefs.meta import open_meta
from shinglefs.server.deletions import ServerDeletions
from shinglefs.server.process import ServerConfig, StorageServer, cluster_key
from shinglefs.server.remote import RemoteNode
from shinglefs.server.sweep import Sweeper
config = ServerConfig(sys.argv[1], (sys.argv[2],), ("127.0.0.1", 0), heartbeat_s=0.2,
                      zone_size=16 << 20, repair_interval_s=0, sweep_interval_s=0,
                      deletion_interval_s=0)
server = StorageServer(config).start()
meta = open_meta(sys.argv[1])
deletions = ServerDeletions(meta, server.node, server.server_id, lease_s=1.0)
print(len(deletions.free(deletions.take())), flush=True)
sys.stdin.read()
"""


def drive_of(tmp_path: Path, name: str) -> str:
    return f"emulated:{tmp_path / name}.img:{512 * MiB}"


def start(meta_url: str, tmp_path: Path, name: str, **intervals: float) -> StorageServer:
    """A storage server on one emulated drive; no repair or sweep pass, the
    deletion pass at its default interval unless ``intervals`` say otherwise."""
    config = ServerConfig(meta_url, (drive_of(tmp_path, name),), ("127.0.0.1", 0),
                          heartbeat_s=0.2, zone_size=16 * MiB, repair_interval_s=0,
                          sweep_interval_s=0, **intervals)
    return StorageServer(config).start()


def write_file(meta_url: str, meta: MetaStore, name: str, data: bytes) -> list[int]:
    """Write ``/name`` through a client that is closed again; its slices."""
    with shinglefs.connect(meta_url) as fs:
        fs.write_bytes(f"/{name}", data)
        ino = fs.stat(f"/{name}").st_ino
    return sorted({p.slice_id for p in meta.read_map(ino, 0, len(data))
                   if p.slice_id is not None})


def queued(meta: MetaStore) -> int:
    """Rows in meta's deletion queue (leased or not)."""
    return int(backend_of(meta).run(lambda tx: tx.one("SELECT count(*) FROM deletions")[0],
                                    "read"))


def held(server: StorageServer, slices: list[int]) -> list[int]:
    """Those of ``slices`` in the index of the server's drive 0."""
    return [s for s in slices if server.node.contains(s, 0)]


def test_with_no_client_mounted_a_deleted_file_is_freed_on_both_servers_drives(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    running = [start(meta_url, tmp_path, name) for name in ("s1", "s2")]
    try:
        wait_until(lambda: sum(s.live for s in meta.list_servers()) == 2, "two servers live")
        empty = [s.node.stats().live_bytes for s in running]
        kept_data = os.urandom(3 * MiB + 1)
        kept = write_file(meta_url, meta, "kept.bin", kept_data)
        with_kept = [s.node.stats().live_bytes for s in running]
        assert with_kept != empty
        data = os.urandom(40 * MiB + 3)  # three slices of a 16 MiB chunk, two copies each
        slices = write_file(meta_url, meta, "f.bin", data)
        assert len(slices) == 3
        for server, before in zip(running, with_kept, strict=True):
            assert held(server, slices) == slices
            assert server.node.stats().live_bytes > before
        meta.unlink(ROOT_INO, b"f.bin")  # no client runs: the queue is the servers'
        assert queued(meta) == 3

        def freed() -> bool:
            return not any(held(s, slices) for s in running) and not meta.slice_records(slices)

        wait_until(freed, "both servers freed their copies and the records went")
        assert queued(meta) == 0
        assert [s.node.stats().live_bytes for s in running] == with_kept
        for server in running:
            assert held(server, kept) == kept
        assert check_consistency(meta) == []
        with shinglefs.connect(meta_url) as fs:
            assert fs.read_bytes("/kept.bin") == kept_data
            assert not fs.exists("/f.bin")
    finally:
        for server in running:
            server.stop()


def test_a_server_down_while_the_deletion_is_queued_frees_its_copies_when_it_returns(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    up = start(meta_url, tmp_path, "s1", deletion_interval_s=0.2)
    down = start(meta_url, tmp_path, "s2", deletion_interval_s=0.2)
    back: StorageServer | None = None
    try:
        wait_until(lambda: sum(s.live for s in meta.list_servers()) == 2, "two servers live")
        slices = write_file(meta_url, meta, "f.bin", os.urandom(20 * MiB + 5))
        down_id = down.server_id
        down.stop()
        meta.unlink(ROOT_INO, b"f.bin")

        def up_freed() -> bool:
            records = meta.slice_records(slices)
            return not held(up, slices) and all(
                records[s].replicas == (Replica(str(down_id), "0"),) for s in slices)

        wait_until(up_freed, "the live server freed its own copies")
        assert queued(meta) == len(slices)  # the absent server's copies are still owed
        assert all(meta.get_slice(s).state == SliceState.TO_DELETE for s in slices)
        back = start(meta_url, tmp_path, "s2", deletion_interval_s=0.2)
        assert back.server_id == down_id
        returned = back
        wait_until(lambda: not held(returned, slices) and not meta.slice_records(slices),
                   "the returning server freed its copies and the records went")
        assert queued(meta) == 0
        assert check_consistency(meta) == []
    finally:
        for server in (up, back):
            if server is not None:
                server.stop()


def test_a_server_killed_between_its_deletes_and_the_ack_loses_nothing(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    """One server (one copy of each slice): killed after deleting and flushing
    its copies, before acknowledging them; its next pass after a restart
    deletes again (nothing left to delete) and acknowledges."""
    first = start(meta_url, tmp_path, "s1", deletion_interval_s=0)
    try:
        wait_until(lambda: any(s.live for s in meta.list_servers()), "the server live")
        kept_data = os.urandom(5 * MiB + 3)
        kept = write_file(meta_url, meta, "kept.bin", kept_data)
        slices = write_file(meta_url, meta, "f.bin", os.urandom(20 * MiB + 5))
        server_id = first.server_id
    finally:
        first.stop()
    meta.unlink(ROOT_INO, b"f.bin")
    crashing = subprocess.Popen([sys.executable, "-c", CRASHING, meta_url,
                                 drive_of(tmp_path, "s1")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert crashing.stdout is not None
        assert int(crashing.stdout.readline()) == len(slices)  # deleted and flushed
    finally:
        crashing.send_signal(signal.SIGKILL)
        crashing.communicate(timeout=60)
    records = meta.slice_records(slices)  # nothing acknowledged: the records name the copies
    assert all(records[s].replicas == (Replica(str(server_id), "0"),) for s in slices)
    assert queued(meta) == len(slices)
    restarted = start(meta_url, tmp_path, "s1", deletion_interval_s=0)
    try:
        assert restarted.server_id == server_id
        assert held(restarted, slices) == []  # the deletes were durable before the kill
        assert held(restarted, kept) == kept
        assert server_id is not None
        deletions = ServerDeletions(meta, restarted.node, server_id)
        wait_until(lambda: deletions.run_once().slices == len(slices),  # once the lease is over
                   "the next pass acknowledged every slice")
        assert deletions.totals.copies == len(slices)  # deleted again: gone already, no error
        assert not meta.slice_records(slices) and queued(meta) == 0
        assert check_consistency(meta) == []
        with shinglefs.connect(meta_url) as fs:
            assert fs.read_bytes("/kept.bin") == kept_data
    finally:
        restarted.stop()


def test_the_record_of_a_copy_the_orphan_sweep_claimed_goes_at_the_next_pass(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    server = start(meta_url, tmp_path, "s1", deletion_interval_s=0)
    try:
        assert server.server_id is not None
        orphan = meta.next_slice_id()  # a client killed before its commit left this copy
        with RemoteNode(server.address, cluster_key(meta)) as remote:
            remote.write(orphan, 0, os.urandom(MiB), 7, drive_id=0)
            remote.flush([0])
        assert Sweeper(meta, server.node, server.server_id, grace_s=0).run_once().swept == 1
        claim = meta.get_slice(orphan)  # deleted, and claimed: a TO_DELETE record, queued
        assert (claim.state, claim.replicas) == (SliceState.TO_DELETE, (Replica(
            str(server.server_id), "0"),))
        assert queued(meta) == 1
        deletions = ServerDeletions(meta, server.node, server.server_id)
        assert deletions.run_once().slices == 1  # the claim's hold (the grace, 0) is over
        assert not meta.slice_records([orphan]) and queued(meta) == 0
    finally:
        server.stop()


def test_a_copy_on_a_drive_the_server_does_not_have_open_keeps_the_slice_queued(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    server = start(meta_url, tmp_path, "s1", deletion_interval_s=0)
    try:
        assert server.server_id is not None
        sid = meta.next_slice_id()
        with RemoteNode(server.address, cluster_key(meta)) as remote:
            remote.write(sid, 0, os.urandom(4096), 7, drive_id=0)
            remote.flush([0])
        here, absent = Replica(str(server.server_id), "0"), Replica(str(server.server_id), "5")
        ino = meta.mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644).ino
        meta.commit_slice(ino, 0, SliceRef(sid, 0, 4096, 0), 4096, slice_length=4096,
                          replicas=[here, absent])  # drive 5: left out of its --drive list
        meta.unlink(ROOT_INO, b"f")
        counts = ServerDeletions(meta, server.node, server.server_id).run_once()
        assert (counts.slices, counts.copies, counts.left) == (0, 1, 1)
        assert held(server, [sid]) == []  # the copy it has is gone...
        assert meta.get_slice(sid).replicas == (here, absent)  # ...but nothing acknowledged
        assert queued(meta) == 1
    finally:
        server.stop()


def test_a_server_pops_its_own_share_and_the_record_goes_with_the_last_copy(
        any_meta_url: str) -> None:
    meta = open_meta(any_meta_url)
    try:
        ino = meta.mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644).ino
        live, two, other, bare = (meta.next_slice_id() for _ in range(4))
        for index, (sid, replicas) in enumerate([
                (live, [Replica("1", "0")]),
                (two, [Replica("1", "0"), Replica("1", "1"), Replica("2", "0")]),
                (other, [Replica("2", "3")]),
                (bare, [])]):
            meta.commit_slice(ino, index, SliceRef(sid, 0, 10, 0), 16 * MiB * index + 10,
                              slice_length=10, replicas=replicas)
        meta.truncate(ino, 16 * MiB)  # frees every slice but ``live``
        assert queued(meta) == 3

        assert meta.pop_deletions_on(1) == [SliceInfo(
            two, 10, 0, SliceState.TO_DELETE, 0, (Replica("1", "0"), Replica("1", "1")))]
        assert meta.pop_deletions_on(1) == []  # leased
        assert [i.id for i in meta.pop_deletions_on(2)] == [other]  # ``two``: leased to 1
        meta.ack_replica_deletions(1, [two])
        assert meta.get_slice(two).replicas == (Replica("2", "0"),)
        assert meta.pop_deletions_on(1) == []  # nothing of server 1's left
        again = meta.pop_deletions_on(2)  # at once: server 1 ended the lease
        assert again == [SliceInfo(two, 10, 0, SliceState.TO_DELETE, 0, (Replica("2", "0"),))]
        meta.ack_replica_deletions(2, [two, other])
        assert sorted(meta.slice_records([two, other, bare, live])) == [live, bare]
        assert queued(meta) == 1  # ``bare``: no server's to take; a client's consumer frees it
        meta.ack_replica_deletions(2, [two, other])  # idempotent
        with pytest.raises(SliceStateError):
            meta.ack_replica_deletions(1, [live])  # still referenced: never acknowledged
        assert meta.get_slice(live).replicas == (Replica("1", "0"),)
        # A copy the orphan sweep claims is its server's once the claim's hold is over.
        held_claim = meta.next_slice_id()
        assert meta.claim_orphans(3, 0, {held_claim: 7}, 3600.0) == [held_claim]
        assert meta.pop_deletions_on(3) == []
        due_claim = meta.next_slice_id()
        assert meta.claim_orphans(3, 0, {due_claim: 7}, 0.0) == [due_claim]
        assert [i.id for i in meta.pop_deletions_on(3)] == [due_claim]
        meta.ack_replica_deletions(3, [due_claim])
        assert list(meta.slice_records([held_claim, due_claim])) == [held_claim]
    finally:
        meta.close()


def test_shinglefs_server_frees_by_itself_and_logs_what_it_freed(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHINGLEFS_LOG", "INFO")
    server = Server(meta_url, [drive_of(tmp_path, "s1")], free_port(), "--repair-interval",
                    "0", "--sweep-interval", "0", "--deletion-interval", "0.2")
    servers.append(server)
    server.ready()
    data = os.urandom(MiB + 1)
    (slice_id,) = write_file(meta_url, meta, "f.bin", data)
    meta.unlink(ROOT_INO, b"f.bin")
    wait_until(lambda: not meta.slice_records([slice_id]), "the server freed the slice")
    assert queued(meta) == 0
    server.proc.send_signal(signal.SIGTERM)
    assert f"1 slice(s) freed here (1 copies, {MiB + 1} bytes), 0 left queued" \
        in server.stop_output()


def test_a_negative_deletion_interval_is_exit_2(tmp_path: Path, meta_url: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("server", meta_url, "--listen", "127.0.0.1:0", "--drive",
               drive_of(tmp_path, "s1"), "--deletion-interval", "-1") == 2
    assert "must not be negative" in capsys.readouterr().err
    assert not (tmp_path / "s1.img").exists()
