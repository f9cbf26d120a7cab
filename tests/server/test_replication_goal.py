"""Replication goals per directory and draining an offline drive, on one host.

Real ``shinglefs server`` processes on loopback, metadata in SQLite: a
directory's goal decides how many servers hold its files' slices, the
servers bring slices to their goal when it rises, ``status --servers``
counts health against each slice's goal, a drive taken offline gets no
new slice and is emptied onto other drives without losing a byte, and a
client that remembered a slice's old drive finds it on its new one; a
server takes a drive with a failed zone offline by itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.server.test_cluster_node import live_count, replica_servers, start_server
from tests.server.test_server_process import TIMEOUT_S, Server, cli, free_port
from tests.support.polling import wait_until

import shinglefs
from shinglefs.meta.api import DirPolicy, MetaStore, Replica
from shinglefs.server.errors import SliceMissing
from shinglefs.server.process import ServerConfig, StorageServer, cluster_key
from shinglefs.server.remote import RemoteNode
from shinglefs.server.repair import replication_health
from shinglefs.zoned.model import ZoneCondition

MiB = 1024 * 1024
# Repair passes every 0.3 s, and a server counted missing only after 600 s: no
# test here kills a server while they run, and a heartbeat late on a loaded
# machine must not send copies of its slices elsewhere.
REPAIR_PASSES = ("--repair-after", "600", "--repair-interval", "0.3")
# The window a health check counts a server present in (no server is gone).
PRESENT_S = 15.0
NO_REPAIR = ("--repair-interval", "0")


def three_servers(meta_url: str, meta: MetaStore, tmp_path: Path, servers: list[Server],
                  *extra: str) -> None:
    for name in ("s1", "s2", "s3"):
        start_server(meta_url, tmp_path, name, servers, None, *extra)
    wait_until(lambda: live_count(meta) == 3, "three servers live")


def set_goal(meta: MetaStore, fs: shinglefs.ShingleFS, path: str, goal: int | None) -> None:
    meta.set_policy(fs.stat(path).st_ino, DirPolicy(replicas=goal))


def copies(meta: MetaStore, meta_url: str, path: str) -> list[int]:
    """How many servers hold each stored slice of ``path`` (a fresh client)."""
    fs = shinglefs.connect(meta_url)
    try:
        return [len(s) for s in replica_servers(meta, fs, path)]
    finally:
        fs.close()


def test_each_directory_s_goal_decides_how_many_servers_hold_its_files(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    three_servers(meta_url, meta, tmp_path, servers, *NO_REPAIR)
    big, small = os.urandom(20 * MiB + 5), os.urandom(MiB)
    fs = shinglefs.connect(meta_url)
    try:
        for path in ("/one", "/three/deeper", "/plain"):
            fs.makedirs(path)
        set_goal(meta, fs, "/one", 1)
        set_goal(meta, fs, "/three", 3)  # /three/deeper inherits it
        for d in ("/one", "/three/deeper", "/plain"):
            fs.write_bytes(f"{d}/big.bin", big)  # a group of its own (its inode)
            fs.write_bytes(f"{d}/small.bin", small)  # its directory's group
        placed = {d: {n for name in ("big", "small")
                      for n in map(len, replica_servers(meta, fs, f"{d}/{name}.bin"))}
                  for d in ("/one", "/three/deeper", "/plain")}
        assert fs.read_bytes("/three/deeper/big.bin") == big
    finally:
        fs.close()
    assert placed == {"/one": {1}, "/three/deeper": {3}, "/plain": {2}}


def test_health_counts_each_slice_against_its_own_goal(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        capsys: pytest.CaptureFixture[str]) -> None:
    three_servers(meta_url, meta, tmp_path, servers, *NO_REPAIR)
    fs = shinglefs.connect(meta_url)
    try:
        for d in ("/raised", "/lowered"):
            fs.makedirs(d)
            fs.write_bytes(f"{d}/f.bin", os.urandom(20 * MiB))  # two slices, two copies each
        set_goal(meta, fs, "/raised", 3)
        set_goal(meta, fs, "/lowered", 1)
    finally:
        fs.close()
    health = replication_health(meta, PRESENT_S)
    assert (health.goal, health.slices, health.under_replicated, health.lost) == (2, 4, 2, 0)
    assert cli("status", meta_url, "--servers", "--json", "--server-timeout", "5") == 0
    assert json.loads(capsys.readouterr().out)["replication"]["under_replicated"] == 2


def test_the_servers_bring_existing_slices_up_to_a_raised_goal(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    three_servers(meta_url, meta, tmp_path, servers, *REPAIR_PASSES)
    data = os.urandom(40 * MiB + 3)
    fs = shinglefs.connect(meta_url)
    try:
        for d in ("/precious", "/plain"):
            fs.makedirs(d)
            fs.write_bytes(f"{d}/f.bin", data)
        assert set(map(len, replica_servers(meta, fs, "/precious/f.bin"))) == {2}
        set_goal(meta, fs, "/precious", 3)
    finally:
        fs.close()
    wait_until(lambda: set(copies(meta, meta_url, "/precious/f.bin")) == {3},
               "every slice of /precious on three servers", limit=60)
    assert set(copies(meta, meta_url, "/plain/f.bin")) == {2}  # its goal stays the default
    health = replication_health(meta, PRESENT_S)
    assert (health.slices, health.under_replicated, health.lost) == (6, 0, 0)
    fs = shinglefs.connect(meta_url)
    try:
        assert fs.read_bytes("/precious/f.bin") == data
    finally:
        fs.close()


def test_copies_that_bring_a_slice_to_its_goal_go_to_its_tier(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """Three servers, each with a big SMR (cold) drive beside a smaller
    conventional (hot) one: when a hot directory's goal rises, the new copies
    go to the third server's hot drive, not to its freer cold one."""
    from tests.server.test_cluster_node import slices_of

    from shinglefs.client.commit import split_drive_id

    for name in ("s1", "s2", "s3"):
        drives = [f"emulated:{tmp_path / name}.img:{1024 * MiB}",
                  f"conventional:{tmp_path / name}c.img:{512 * MiB}"]
        servers.append(server := Server(meta_url, drives, free_port(), *REPAIR_PASSES))
        server.ready()
    wait_until(lambda: live_count(meta) == 3, "three servers live")
    tier_of = {(s.id, d.drive_id): d.tier for s in meta.list_servers() for d in s.drives}
    data = os.urandom(20 * MiB + 7)
    fs = shinglefs.connect(meta_url)
    try:
        fs.makedirs("/hot")
        meta.set_policy(fs.stat("/hot").st_ino, DirPolicy(tier="hot", replicas=2))
        fs.write_bytes("/hot/f.bin", data)
        meta.set_policy(fs.stat("/hot").st_ino, DirPolicy(tier="hot", replicas=3))
    finally:
        fs.close()
    wait_until(lambda: set(copies(meta, meta_url, "/hot/f.bin")) == {3},
               "every slice of /hot on three servers", limit=60)
    fs = shinglefs.connect(meta_url)
    try:
        placed = slices_of(meta, fs, "/hot/f.bin")
        assert fs.read_bytes("/hot/f.bin") == data
    finally:
        fs.close()
    assert {tier_of[split_drive_id(drive)] for _, drive in placed} == {"hot"}, placed


def replicas_of(meta: MetaStore, meta_url: str, path: str) -> list[tuple[int, tuple[Replica, ...]]]:
    """``(slice id, its replicas)`` of every stored slice of ``path``."""
    fs = shinglefs.connect(meta_url)
    try:
        ino = fs.stat(path).st_ino
        return [(p.slice_id, meta.get_slice(p.slice_id).replicas)
                for p in meta.read_map(ino, 0, fs.stat(path).st_size) if p.inline is None]
    finally:
        fs.close()


def gone(remote: RemoteNode, slice_id: int, drive: int) -> bool:
    """The server's drive holds no copy of the slice."""
    try:
        remote.length(slice_id, drive)
    except SliceMissing:
        return True
    return False


def test_an_offline_drive_gets_no_new_slice_and_is_drained_onto_other_drives(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        capsys: pytest.CaptureFixture[str]) -> None:
    two_drives = Server(meta_url, [f"emulated:{tmp_path / 'a0.img'}:{1024 * MiB}",
                                   f"emulated:{tmp_path / 'a1.img'}:{1024 * MiB}"],
                        free_port(), *REPAIR_PASSES)
    two_drives.ready()
    servers.append(two_drives)
    start_server(meta_url, tmp_path, "b", servers, None, *REPAIR_PASSES)
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    a = next(s for s in meta.list_servers(TIMEOUT_S) if len(s.drives) == 2)
    data = os.urandom(40 * MiB + 7)
    fs = shinglefs.connect(meta_url)
    try:
        fs.write_bytes("/ckpt.bin", data)
    finally:
        fs.close()
    before = replicas_of(meta, meta_url, "/ckpt.bin")
    on_a = [r for _, rs in before for r in rs if r.server == str(a.id)]
    assert len(on_a) == len(before)  # one copy of each slice on each server
    drive = int(on_a[0].drive)
    moving = [slice_id for slice_id, rs in before if Replica(str(a.id), str(drive)) in rs]

    assert cli("drive", "offline", meta_url, f"{a.id}:{drive}") == 0
    assert "offline" in capsys.readouterr().out
    assert meta.drive_states() == {(a.id, drive): "offline"}

    def drained() -> bool:
        now = replicas_of(meta, meta_url, "/ckpt.bin")
        return all(len(rs) == 2 and Replica(str(a.id), str(drive)) not in rs for _, rs in now)

    wait_until(drained, "no slice left on the offline drive, two copies each", limit=60)
    after = replicas_of(meta, meta_url, "/ckpt.bin")
    assert all(Replica(str(a.id), str(1 - drive)) in rs for _, rs in after)  # a's other drive
    health = replication_health(meta, PRESENT_S)
    assert (health.under_replicated, health.lost, health.draining) == (0, 0, 0)
    with RemoteNode(a.address, cluster_key(meta), timeout=30) as remote:
        # Deleted right after the record drops them: the drive ends up empty.
        wait_until(lambda: all(gone(remote, s, drive) for s in moving),
                   "the drained copies deleted from the drive")
    fs = shinglefs.connect(meta_url)
    try:
        assert fs.read_bytes("/ckpt.bin") == data
        fs.write_bytes("/new.bin", os.urandom(20 * MiB))
    finally:
        fs.close()
    assert all(Replica(str(a.id), str(drive)) not in rs
               for _, rs in replicas_of(meta, meta_url, "/new.bin"))
    assert cli("status", meta_url, "--servers", "--json", "--server-timeout", "5") == 0
    listed = json.loads(capsys.readouterr().out)
    assert {s["id"]: s["offline_drives"] for s in listed["servers"]}[a.id] == [drive]
    assert listed["replication"]["draining"] == 0
    assert cli("drive", "online", meta_url, f"{a.id}:{drive}") == 0
    assert meta.drive_states() == {}


def test_a_client_that_read_a_slice_before_it_moved_finds_it_on_its_new_drive(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    one = Server(meta_url, [f"emulated:{tmp_path / 'a0.img'}:{1024 * MiB}",
                            f"emulated:{tmp_path / 'a1.img'}:{1024 * MiB}"],
                 free_port(), *REPAIR_PASSES)
    one.ready()
    servers.append(one)
    wait_until(lambda: live_count(meta) == 1, "the server live")
    (server,) = meta.list_servers(TIMEOUT_S)
    data = os.urandom(20 * MiB + 1)
    fs = shinglefs.connect(meta_url)  # remembers where it put each slice
    try:
        fs.write_bytes("/only.bin", data)
        (drive,) = {int(r.drive) for _, rs in replicas_of(meta, meta_url, "/only.bin")
                    for r in rs}
        meta.set_drive_state(server.id, drive, "offline")
        wait_until(lambda: all(rs == (Replica(str(server.id), str(1 - drive)),)
                               for _, rs in replicas_of(meta, meta_url, "/only.bin")),
                   "the one copy of each slice moved to the other drive", limit=60)
        moved = [slice_id for slice_id, _ in replicas_of(meta, meta_url, "/only.bin")]
        with RemoteNode(server.address, cluster_key(meta), timeout=30) as remote:
            wait_until(lambda: all(gone(remote, s, drive) for s in moved),
                       "the old copies deleted")
        assert fs.read_bytes("/only.bin") == data
    finally:
        fs.close()


def test_a_server_takes_a_drive_with_a_failed_zone_offline_and_drains_it(
        tmp_path: Path, meta_url: str, meta: MetaStore) -> None:
    config = ServerConfig(meta_url, tuple(f"emulated:{tmp_path / n}:{1024 * MiB}"
                                          for n in ("a0.img", "a1.img")),
                          ("127.0.0.1", 0), heartbeat_s=0.2, zone_size=16 * MiB,
                          repair_after_s=1.5, repair_interval_s=0.3)
    data = os.urandom(20 * MiB + 9)
    with StorageServer(config).start() as server:
        wait_until(lambda: live_count(meta) == 1, "the server live")
        fs = shinglefs.connect(meta_url)
        try:
            fs.write_bytes("/on_a_bad_disk.bin", data)
        finally:
            fs.close()
        (drive,) = {int(r.drive) for _, rs in replicas_of(meta, meta_url, "/on_a_bad_disk.bin")
                    for r in rs}
        assert meta.drive_states() == {}
        assert server.repairer is not None
        emulated = server.repairer.node.store(drive).drive  # type: ignore[attr-defined]
        last = emulated.report_zones()[-1]
        assert last.condition == ZoneCondition.EMPTY  # no data is lost: the head failed there
        emulated.fail_zone(last.index, ZoneCondition.READ_ONLY)
        wait_until(lambda: meta.drive_states() == {(server.server_id, drive): "offline"},
                   "the server took its failing drive offline")
        wait_until(lambda: all(rs == (Replica(str(server.server_id), str(1 - drive)),)
                               for _, rs in replicas_of(meta, meta_url, "/on_a_bad_disk.bin")),
                   "every slice moved to the healthy drive", limit=60)
        fs = shinglefs.connect(meta_url)
        try:
            assert fs.read_bytes("/on_a_bad_disk.bin") == data
        finally:
            fs.close()


def test_a_slice_short_of_its_goal_after_a_server_died_mid_write_is_copied_to_a_live_server(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    # Long --repair-after: the dead server stays "present" (its replicas waited for)
    # the whole test, and it is the freest: the copy must still go to a live one.
    slow = ("--repair-after", "600", "--repair-interval", "0.3")
    big = Server(meta_url, [f"emulated:{tmp_path / 'big.img'}:{4096 * MiB}"], free_port(),
                 *slow)
    big.ready()
    servers.append(big)
    for name in ("s2", "s3"):
        start_server(meta_url, tmp_path, name, servers, None, *slow)
    wait_until(lambda: live_count(meta) == 3, "three servers live")
    big_id = max(meta.list_servers(TIMEOUT_S), key=lambda s: s.drives[0].capacity_bytes).id
    data = os.urandom(64 * MiB)
    written = [0]
    fs = shinglefs.connect(meta_url)
    try:
        with fs.open("/ckpt.bin", "wb") as f:
            for at in range(0, len(data), MiB):
                f.write(data[at:at + MiB])
                written[0] = at + MiB
                if written[0] == 24 * MiB:
                    big.kill()  # mid-write: every slice had its first replica there
    finally:
        fs.close()
    assert all(str(big_id) not in {r.server for r in rs}
               for _, rs in replicas_of(meta, meta_url, "/ckpt.bin"))
    wait_until(lambda: all(len(rs) == 2 for _, rs in replicas_of(meta, meta_url, "/ckpt.bin")),
               "every slice back to two copies on the live servers", limit=60)
    fs = shinglefs.connect(meta_url)
    try:
        assert fs.read_bytes("/ckpt.bin") == data
    finally:
        fs.close()


def test_a_lowered_goal_drops_the_copies_above_it(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    three_servers(meta_url, meta, tmp_path, servers, *REPAIR_PASSES)
    data = os.urandom(40 * MiB + 1)
    fs = shinglefs.connect(meta_url)
    try:
        fs.makedirs("/scratch")
        set_goal(meta, fs, "/scratch", 3)
        fs.write_bytes("/scratch/f.bin", data)
        before = replicas_of(meta, meta_url, "/scratch/f.bin")
        assert {len(rs) for _, rs in before} == {3}
        set_goal(meta, fs, "/scratch", 1)
    finally:
        fs.close()
    wait_until(lambda: set(copies(meta, meta_url, "/scratch/f.bin")) == {1},
               "one copy of each slice left", limit=60)
    after = dict(replicas_of(meta, meta_url, "/scratch/f.bin"))
    by_id = {str(s.id): s for s in meta.list_servers(TIMEOUT_S)}
    key = cluster_key(meta)
    for slice_id, replicas in before:
        for replica in set(replicas) - set(after[slice_id]):
            with RemoteNode(by_id[replica.server].address, key, timeout=30) as remote:
                wait_until(lambda r=remote, s=slice_id, d=int(replica.drive): gone(r, s, d),
                           "the dropped copy deleted from its drive")
    assert replication_health(meta, PRESENT_S).under_replicated == 0
    fs = shinglefs.connect(meta_url)
    try:
        assert fs.read_bytes("/scratch/f.bin") == data
    finally:
        fs.close()
