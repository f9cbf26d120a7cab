"""Clients of a file system on storage servers (``format --servers``), on one host.

Real ``shinglefs server`` processes on loopback, metadata in SQLite: a
``connect()`` and a FUSE mount write and read through them (close-to-open
across processes), deletions reach the servers, a killed server's slices come
back after its restart, and with no live server a write fails with ENOSPC and
a reason, before anything is stored.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.server.test_server_process import CLI, TIMEOUT_S, Server, free_port
from tests.support.polling import wait_until

import shinglefs
from shinglefs.client.commit import drive_for, split_drive_id
from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import format_filesystem
from shinglefs.errors import UsageError
from shinglefs.fuse.harness import MountedFileSystem
from shinglefs.meta.api import ROOT_CTX, DirPolicy, MetaStore
from shinglefs.server.errors import SliceMissing
from shinglefs.server.process import cluster_key
from shinglefs.server.remote import RemoteNode
from shinglefs.server.repair import replication_health

MiB = 1024 * 1024


def start_server(meta_url: str, tmp_path: Path, name: str, servers: list[Server],
                 port: int | None = None, *extra: str) -> tuple[Server, int]:
    port = port or free_port()
    server = Server(meta_url, [f"emulated:{tmp_path / name}.img:{1024 * MiB}"], port, *extra)
    server.ready()
    servers.append(server)
    return server, port


def live_count(meta: MetaStore) -> int:
    return sum(s.live for s in meta.list_servers(TIMEOUT_S))


def slices_of(meta: MetaStore, fs: shinglefs.ShingleFS, path: str) -> list[tuple[int, int]]:
    """``(slice_id, drive_id)`` of every replica of every stored slice of ``path``."""
    ino = fs.stat(path).st_ino
    out = []
    for piece in meta.read_map(ino, 0, fs.stat(path).st_size):
        if piece.inline is None and piece.slice_id:
            for replica in meta.get_slice(piece.slice_id).replicas:
                drive = drive_for(replica)
                assert drive is not None
                out.append((piece.slice_id, drive))
    return out


def test_formatting_for_servers_takes_no_drives(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no drives of its own"):
        format_filesystem(f"sqlite3://{tmp_path / 'm.db'}", [f"emulated:{tmp_path}/d.img:1G"],
                          servers=True)
    assert not (tmp_path / "d.img").exists()
    code = subprocess.run([*CLI, "format", f"sqlite3://{tmp_path / 'n.db'}"],
                          capture_output=True, text=True)
    assert code.returncode == 2 and "--servers" in code.stderr


def test_a_client_writes_and_reads_through_two_servers(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    start_server(meta_url, tmp_path, "s1", servers)
    start_server(meta_url, tmp_path, "s2", servers)
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    big = os.urandom(40 * MiB + 123)
    small = [os.urandom(5000 + i) for i in range(8)]
    fs = shinglefs.connect(meta_url)
    try:
        fs.makedirs("/a/b")
        fs.write_bytes("/a/b/big.bin", big)
        for i, data in enumerate(small):
            fs.write_bytes(f"/a/s{i}", data)
        stored = slices_of(meta, fs, "/a/b/big.bin")
    finally:
        fs.close()
    # Every slice is on a server's drive, none "local"; 40 MiB over 16 MiB chunks.
    assert len(stored) >= 3 and all(split_drive_id(d)[0] >= 1 for _, d in stored)
    # Close-to-open across processes: another process reads it all back.
    check = ("import shinglefs, sys, hashlib; fs = shinglefs.connect(sys.argv[1]); "
             "print(hashlib.sha256(fs.read_bytes('/a/b/big.bin')).hexdigest()); "
             "print(','.join(hashlib.sha256(fs.read_bytes(f'/a/s{i}')).hexdigest() "
             "for i in range(8))); fs.close()")
    out = subprocess.run([sys.executable, "-c", check, meta_url], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import hashlib
    lines = out.stdout.split()
    assert lines[0] == hashlib.sha256(big).hexdigest()
    assert lines[1] == ",".join(hashlib.sha256(d).hexdigest() for d in small)


def test_deleting_a_file_frees_its_slices_on_the_servers(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "server live")
    fs = shinglefs.connect(meta_url)
    try:
        fs.write_bytes("/gone.bin", os.urandom(3 * MiB))
        stored = slices_of(meta, fs, "/gone.bin")
        fs.unlink("/gone.bin")
    finally:
        fs.close()
    (record,) = meta.list_servers(TIMEOUT_S)
    with RemoteNode(record.address, cluster_key(meta), timeout=30) as remote:
        def gone() -> bool:
            try:
                for sid, drive in stored:
                    remote.length(sid, split_drive_id(drive)[1])
            except SliceMissing:
                return True
            return False

        if not gone():  # the closing client ran its deletions; a new one finishes any left
            shinglefs.connect(meta_url).close()
        wait_until(gone, "slices deleted on the server", limit=30)


def test_a_killed_server_comes_back_with_its_slices(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    server, port = start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "server live")
    data = os.urandom(5 * MiB)
    fs = shinglefs.connect(meta_url)
    try:
        fs.write_bytes("/kept.bin", data)
    finally:
        fs.close()
    server.kill()  # SIGKILL: nothing unregistered, nothing flushed beyond the commit
    start_server(meta_url, tmp_path, "s1", servers, port=port)
    fs = shinglefs.connect(meta_url)
    try:
        assert fs.read_bytes("/kept.bin") == data
    finally:
        fs.close()


def test_with_no_live_server_a_write_is_eio_and_nothing_is_kept(
        meta_url: str) -> None:
    """No server live is a missing file system, not a full one: EIO saying so
    and how to start one (ENOSPC sent users looking for space to free)."""
    fs = shinglefs.connect(meta_url)
    try:
        with pytest.raises(OSError) as caught:
            fs.write_bytes("/nowhere.bin", os.urandom(2 * MiB))
        assert caught.value.errno == errno.EIO
        assert "no live storage server" in str(caught.value.__cause__)
        assert not fs.exists("/nowhere.bin") or fs.stat("/nowhere.bin").st_size == 0
    finally:
        fs.close()


def test_a_mount_and_a_connect_in_another_process_share_the_file_system(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "server live")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = MountedFileSystem(tmp_path / "client", mnt, meta_url=meta_url)
    (tmp_path / "client").mkdir()
    mounted.start()  # not `with`: that would format
    try:
        data = os.urandom(9 * MiB + 7)
        (mnt / "from_mount.bin").write_bytes(data)
        (mnt / "tiny").write_bytes(b"hello")
        fs = shinglefs.connect(meta_url)
        try:
            assert fs.read_bytes("/from_mount.bin") == data
            assert fs.read_bytes("/tiny") == b"hello"
            back = os.urandom(3 * MiB + 1)
            fs.write_bytes("/from_connect.bin", back)
        finally:
            fs.close()
        assert (mnt / "from_connect.bin").read_bytes() == back
        assert meta.lookup(1, b"from_mount.bin", ROOT_CTX).size == len(data)
    finally:
        mounted.stop()


def replica_servers(meta: MetaStore, fs: shinglefs.ShingleFS, path: str) -> list[set[int]]:
    """For each stored slice of ``path``, the servers meta records replicas on."""
    out = []
    ino = fs.stat(path).st_ino
    for piece in meta.read_map(ino, 0, fs.stat(path).st_size):
        if piece.inline is None:
            drives = [drive_for(r) for r in meta.get_slice(piece.slice_id).replicas]
            out.append({split_drive_id(d)[0] for d in drives if d is not None})
    return out


def write_placed(meta_url: str, meta: MetaStore, path: str, data: bytes) -> list[set[int]]:
    """Write ``path`` with a fresh client; the servers of each of its slices' replicas."""
    fs = shinglefs.connect(meta_url)
    try:
        fs.write_bytes(path, data)
        return replica_servers(meta, fs, path)
    finally:
        fs.close()


def test_a_client_of_servers_keeps_a_zone_run_per_file_in_flight(meta_url: str) -> None:
    """64 MiB per file unless configured (a server's zone run is 32 MiB); a
    client of its own drives keeps 16 MiB (client/config.py says why)."""
    from shinglefs.client.config import CLUSTER_FILE_BUFFER, LOCAL_FILE_BUFFER
    from shinglefs.client.filesystem import open_filesystem

    assert 32 * MiB <= CLUSTER_FILE_BUFFER and ClientConfig().file_buffer_bytes == LOCAL_FILE_BUFFER
    vfs = open_filesystem(meta_url)
    try:
        assert vfs.config.file_buffer_bytes == CLUSTER_FILE_BUFFER
    finally:
        vfs.shutdown()
    vfs = open_filesystem(meta_url, config=ClientConfig(file_buffer_bytes=8 * MiB))
    try:
        assert vfs.config.file_buffer_bytes == 8 * MiB
    finally:
        vfs.shutdown()


def test_two_servers_hold_two_replicas_and_reads_survive_either_dying(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    s1, _ = start_server(meta_url, tmp_path, "s1", servers)
    start_server(meta_url, tmp_path, "s2", servers)
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    data = os.urandom(20 * MiB + 11)
    placed = write_placed(meta_url, meta, "/two.bin", data)
    assert placed and all(len(servers_of) == 2 for servers_of in placed), placed
    s1.kill()
    fs = shinglefs.connect(meta_url)
    try:
        assert fs.read_bytes("/two.bin") == data  # every read fails over to s2
    finally:
        fs.close()


def test_a_read_passes_over_a_hung_server_in_bounded_time(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """A server alive to TCP but answering nothing (SIGSTOP: swapping, a stuck
    disk) costs a read ``FAILOVER_AFTER_S`` once, not the 60 s request timeout:
    the read goes to the other replica and the hung server is tried last after."""
    by_port = {}
    for name in ("s1", "s2"):
        server, port = start_server(meta_url, tmp_path, name, servers)
        by_port[port] = server
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    data = os.urandom(20 * MiB + 11)
    fs = shinglefs.connect(meta_url)
    try:
        fs.write_bytes("/hung.bin", data)
        first = slices_of(meta, fs, "/hung.bin")[0]
    finally:
        fs.close()
    # The server a reader tries first for the first slice: the one to hang.
    server_id = split_drive_id(first[1])[0]
    address = next(r.address for r in meta.list_servers(TIMEOUT_S) if r.id == server_id)
    hung = by_port[int(address.rsplit(":", 1)[1])]
    os.kill(hung.proc.pid, signal.SIGSTOP)
    try:
        fs = shinglefs.connect(meta_url)
        try:
            started = time.monotonic()
            assert fs.read_bytes("/hung.bin") == data
            took = time.monotonic() - started
        finally:
            fs.close()
    finally:
        os.kill(hung.proc.pid, signal.SIGCONT)
    # Without failover every read of a slice whose first replica is on the hung
    # server would wait the 60 s request timeout.
    assert took < 30, took


def test_a_server_dying_mid_write_leaves_the_write_complete_and_no_partial_replica(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    ports = {}
    for name in ("s1", "s2", "s3"):
        ports[name] = start_server(meta_url, tmp_path, name, servers)[1]
    wait_until(lambda: live_count(meta) == 3, "three servers live")
    data = os.urandom(96 * MiB)
    written = [0]
    failure: list[BaseException] = []

    def write() -> None:
        try:
            with fs.open("/ckpt.bin", "wb") as f:
                for at in range(0, len(data), MiB):
                    f.write(data[at:at + MiB])
                    written[0] = at + MiB
        except BaseException as exc:
            failure.append(exc)

    import threading
    fs = shinglefs.connect(meta_url)
    try:
        writer = threading.Thread(target=write)
        writer.start()
        wait_until(lambda: written[0] >= 24 * MiB or not writer.is_alive(), "writing")
        servers[0].kill()  # s1, mid-write
        writer.join(120)
        assert not writer.is_alive() and not failure, failure
        assert fs.read_bytes("/ckpt.bin") == data
        recorded = replica_servers(meta, fs, "/ckpt.bin")
    finally:
        fs.close()
    # s1 comes back with whatever prefixes it stored: meta names only full copies.
    start_server(meta_url, tmp_path, "s1", servers, port=ports["s1"])
    wait_until(lambda: live_count(meta) == 3, "s1 back")
    key = cluster_key(meta)
    fs = shinglefs.connect(meta_url)
    try:
        ino = fs.stat("/ckpt.bin").st_ino
        by_id = {r.id: r for r in meta.list_servers(TIMEOUT_S)}
        for piece in meta.read_map(ino, 0, len(data)):
            info = meta.get_slice(piece.slice_id)
            for replica in info.replicas:
                with RemoteNode(by_id[int(replica.server)].address, key, timeout=30) as remote:
                    assert remote.length(piece.slice_id, int(replica.drive)) == info.length
    finally:
        fs.close()
    assert all(recorded)


def test_lost_replicas_are_copied_again_and_the_data_outlives_a_second_server(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    fast = ("--repair-after", "1.5", "--repair-interval", "0.3")
    started = [start_server(meta_url, tmp_path, name, servers, None, *fast)
               for name in ("s1", "s2", "s3")]
    wait_until(lambda: live_count(meta) == 3, "three servers live")
    data = os.urandom(40 * MiB + 3)
    first = write_placed(meta_url, meta, "/kept.bin", data)
    assert all(len(r) == 2 for r in first)
    process_of = {r.id: next(srv for srv, port in started if r.address.endswith(f":{port}"))
                  for r in meta.list_servers(TIMEOUT_S)}
    holders = set.union(*first)
    victim_id = min(holders)
    process_of[victim_id].kill()
    assert replication_health(meta, 1.5).slices == len(first)

    def restored() -> bool:
        fs = shinglefs.connect(meta_url)
        try:
            now = replica_servers(meta, fs, "/kept.bin")
        finally:
            fs.close()
        return all(len(r) == 2 and victim_id not in r for r in now)

    wait_until(restored, "every slice back to two replicas without the dead server", limit=60)
    # A long window: no slice has a copy on the victim any more, and a survivor
    # whose heartbeat is late on a loaded machine still counts.
    health = replication_health(meta, 15.0)
    assert (health.goal, health.under_replicated, health.lost) == (2, 0, 0)
    # Every slice is now on both survivors: either can go too.
    process_of[min(set(process_of) - {victim_id})].kill()
    fs = shinglefs.connect(meta_url)
    try:
        assert fs.read_bytes("/kept.bin") == data
    finally:
        fs.close()


KILLED_WRITER = """
import os, sys, shinglefs
fs = shinglefs.connect(sys.argv[1])
data = bytes(range(256)) * 4096  # 1 MiB
with fs.open("/ckpt.tmp", "wb") as f:
    for i in range(256):
        f.write(data)
        print(i + 1, flush=True)
fs.rename("/ckpt.tmp", "/ckpt")
"""


def test_a_client_killed_mid_write_commits_nothing_partial_and_its_orphans_are_collected(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "server live")
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, meta_url],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    for line in writer.stdout:
        if int(line) >= 40:
            break
    writer.kill()
    writer.wait(60)
    orphans = [s.id for s in meta.abandoned_slices(0.0)]
    assert orphans  # the slice being written when it died, registered on the server
    config = ClientConfig(janitor_interval=0.2, abandoned_slice_age=0.5)
    fs = shinglefs.connect(meta_url, config=config)
    try:
        assert not fs.exists("/ckpt")  # the commit (rename) never happened
        size = fs.stat("/ckpt.tmp").st_size
        assert size % MiB == 0 and size <= 40 * MiB + MiB  # whole slices committed, or none
        assert fs.read_bytes("/ckpt.tmp") == (bytes(range(256)) * 4096) * (size // MiB)
        (record,) = meta.list_servers(TIMEOUT_S)
        with RemoteNode(record.address, cluster_key(meta), timeout=30) as remote:
            def collected() -> bool:
                if meta.abandoned_slices(0.0):
                    return False
                for sid in orphans:
                    try:
                        remote.length(sid)
                        return False
                    except SliceMissing:
                        pass
                return True

            wait_until(collected, "the dead writer's slices deleted on the server", limit=60)
    finally:
        fs.close()


def test_a_client_follows_a_server_that_comes_back_at_another_address(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    server, _ = start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "server live")
    data = os.urandom(3 * MiB)
    fs = shinglefs.connect(meta_url)  # one client across the restart
    try:
        fs.write_bytes("/moved.bin", data)
        server.kill()
        start_server(meta_url, tmp_path, "s1", servers)  # same drive, a new port
        wait_until(lambda: live_count(meta) == 1, "server back")

        def writes() -> bool:  # refused at the old port first, then the new one is read
            try:
                fs.write_bytes("/after.bin", data)
            except OSError:
                return False
            return True

        wait_until(writes, "a write through the server's new address", limit=30)
        for sid, _drive in slices_of(meta, fs, "/moved.bin"):
            fs.vfs.cache.drop_slice(sid)  # read it from the server again, not from memory
        assert fs.read_bytes("/moved.bin") == data
        assert fs.read_bytes("/after.bin") == data
    finally:
        fs.close()


def test_reserving_counts_every_copy_a_byte_takes(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """With two servers each byte is stored twice: write(2) must say ENOSPC once
    twice the bytes no longer fit, not leave it to the servers at close."""
    from shinglefs.server.cluster import ClusterNode
    from shinglefs.server.errors import NodeFull

    start_server(meta_url, tmp_path, "s1", servers)
    start_server(meta_url, tmp_path, "s2", servers)
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    node = ClusterNode(meta, cluster_key(meta))
    try:
        free = sum(d.free_bytes for d in node.stats().drives)  # raw (stats(): at the goal)
        assert free > 0
        with pytest.raises(NodeFull) as refused:
            node.reserve(free * 6 // 10)  # 1.2 x free once stored twice
        assert "2 copies" in str(refused.value)
        node.reserve(free * 4 // 10)
        with pytest.raises(NodeFull):
            node.reserve(free * 2 // 10)  # 0.4 + 0.2 of free, twice: 1.2 x
        node.unreserve(free * 4 // 10)
        node.reserve(free * 4 // 10)
    finally:
        node.close()


def test_a_directorys_tier_chooses_drives_across_servers(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """Three servers: two on rack a with a conventional (hot) drive beside an
    SMR one, one on rack b with SMR only. A hot directory's files go to a hot
    drive first and their second copy to the other rack (racks come before
    tiers for a copy: the tier spills); a cold directory's never touch a hot
    drive."""
    for name, rack, hot in (("s1", "a", True), ("s2", "a", True), ("s3", "b", False)):
        drives = [f"emulated:{tmp_path / name}.img:{1024 * MiB}"]
        if hot:
            drives.append(f"conventional:{tmp_path / name}c.img:{512 * MiB}")
        servers.append(server := Server(meta_url, drives, free_port(), "--label", f"rack={rack}"))
        server.ready()
    wait_until(lambda: live_count(meta) == 3, "three servers live")
    records = meta.list_servers()
    tier_of = {(s.id, d.drive_id): d.tier for s in records for d in s.drives}
    rack_of = {s.id: s.labels["rack"] for s in records}
    fs = shinglefs.connect(meta_url)
    try:
        for tier in ("hot", "cold"):
            fs.makedirs(f"/{tier}")
            meta.set_policy(fs.stat(f"/{tier}").st_ino, DirPolicy(tier=tier, replicas=2))
        want = {path: os.urandom(8 * MiB + 5) for path in ("/hot/a", "/hot/b", "/cold/c")}
        for path, data in want.items():
            fs.write_bytes(path, data)
        placed = {path: slices_of(meta, fs, path) for path in want}
        assert all(fs.read_bytes(path) == data for path, data in want.items())
    finally:
        fs.close()
    for path, replicas in placed.items():
        by_slice: dict[int, list[tuple[str, str]]] = {}
        for slice_id, drive in replicas:
            server, _ = split_drive_id(drive)
            by_slice.setdefault(slice_id, []).append(
                (tier_of[split_drive_id(drive)], rack_of[server]))
        for copies in by_slice.values():
            tiers, racks = sorted(t for t, _ in copies), {r for _, r in copies}
            assert racks == {"a", "b"}, (path, copies)
            assert tiers == (["cold", "hot"] if path.startswith("/hot") else
                             ["cold", "cold"]), (path, copies)


def test_existing_data_moves_to_its_new_tier_across_servers(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """``VFS.move_to_tier`` on a file system of storage servers: data written
    before its directory was made hot is rewritten onto the one hot drive
    (its second copy elsewhere), every byte reads back, fsck finds nothing."""
    from shinglefs.meta.check import check_consistency

    for name, hot in (("s1", False), ("s2", True)):
        drives = [f"emulated:{tmp_path / name}.img:{1024 * MiB}"]
        if hot:
            drives.append(f"conventional:{tmp_path / name}c.img:{512 * MiB}")
        servers.append(server := Server(meta_url, drives, free_port()))
        server.ready()
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    tier_of = {(s.id, d.drive_id): d.tier for s in meta.list_servers() for d in s.drives}
    fs = shinglefs.connect(meta_url)
    try:
        fs.makedirs("/data/sub")
        want = {"/data/a": os.urandom(6 * MiB + 1), "/data/sub/b": os.urandom(2 * MiB)}
        for path, data in want.items():
            fs.write_bytes(path, data)

        def tiers(path: str) -> set[str]:
            return {tier_of[split_drive_id(d)] for _, d in slices_of(meta, fs, path)}

        assert all(tiers(path) == {"cold"} for path in want)
        data_ino = fs.stat("/data").st_ino
        meta.set_policy(data_ino, DirPolicy(tier="hot"))
        move = fs.vfs.move_to_tier(data_ino)
        assert (move.files, move.skipped) == (2, 0) and move.chunks >= 2, move
        assert all(tiers(path) == {"cold", "hot"} for path in want)  # goal 2: one copy each
        assert all(fs.read_bytes(path) == data for path, data in want.items())
        assert fs.vfs.move_to_tier(data_ino).chunks == 0
    finally:
        fs.close()
    assert check_consistency(meta) == []


def test_a_writer_whose_server_restarts_mid_slice_keeps_a_prefix_never_a_gap(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """Bytes ``write`` accepted into a slice that then failed (its server was
    killed and came back) are lost with the slice: every later write of that
    handle fails (EIO) rather than go on past a gap. Before, the writer got one
    EIO, wrote on, closed without error, and the file's first 9 MB read zeros."""
    server, port = start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "server live")
    blocks = [bytes([65 + i]) * MiB for i in range(17)]
    fs = shinglefs.connect(meta_url)
    try:
        f = fs.open("/held.bin", "wb", buffering=0)
        for block in blocks[:9]:
            f.write(block)
        server.kill()
        failed = 0
        for block in blocks[9:13]:  # while the server is away
            try:
                f.write(block)
            except OSError as exc:
                assert exc.errno == errno.EIO, exc
                failed += 1
        start_server(meta_url, tmp_path, "s1", servers, port=port)
        wait_until(lambda: live_count(meta) == 1, "server live again")
        for block in blocks[13:]:
            try:
                f.write(block)
            except OSError as exc:
                assert exc.errno == errno.EIO, exc
                failed += 1
        assert failed >= 1  # the loss is reported, and then on every write
        with pytest.raises(OSError):
            f.write(b"after")  # sticky: past the lost bytes nothing is written
        try:
            f.close()
        except OSError as exc:
            assert exc.errno == errno.EIO
    finally:
        fs.close()
    fs = shinglefs.connect(meta_url)
    try:
        content = fs.read_bytes("/held.bin") if fs.exists("/held.bin") else b""
    finally:
        fs.close()
    whole = b"".join(blocks)
    assert content == whole[:len(content)]  # old content (nothing) or a prefix: never zeros


def test_a_reader_finds_its_server_again_at_a_new_address(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """A process that only reads (a DataLoader) must find a restarted server
    (a new port: a restarted `up`) by itself: reads used to fail with EIO
    against the old address for good, since only writes re-read the servers."""
    server, _ = start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "server live")
    want = {f"/r{i}.bin": os.urandom(2 * MiB + i) for i in range(3)}
    fs = shinglefs.connect(meta_url)
    try:
        for path, data in want.items():
            fs.write_bytes(path, data)
        assert fs.read_bytes("/r0.bin") == want["/r0.bin"]  # connected to its address
        server.kill()
        start_server(meta_url, tmp_path, "s1", servers)  # the same drive, another port
        wait_until(lambda: live_count(meta) == 1, "server live again")

        def reads_again() -> bool:
            try:
                return fs.read_bytes("/r1.bin") == want["/r1.bin"]
            except OSError as exc:
                assert exc.errno == errno.EIO, exc
                return False

        wait_until(reads_again, "a read served by the restarted server", limit=30.0)
        assert fs.read_bytes("/r2.bin") == want["/r2.bin"]
    finally:
        fs.close()


def test_using_the_file_system_leaves_the_applications_random_sequence_alone(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """A training script seeds ``random`` for its shuffles: placement drew from
    the module's generator and changed the sequence it then got."""
    import random

    start_server(meta_url, tmp_path, "s1", servers)
    start_server(meta_url, tmp_path, "s2", servers)
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    random.seed(1234)
    expected = [random.random() for _ in range(8)]
    random.seed(1234)
    fs = shinglefs.connect(meta_url)
    try:
        for i in range(3):
            fs.write_bytes(f"/seeded-{i}.bin", os.urandom(3 * MiB))
            fs.read_bytes(f"/seeded-{i}.bin")
    finally:
        fs.close()
    assert [random.random() for _ in range(8)] == expected
