"""``shinglefs forget-server``: a storage server taken out of the cluster for good.

Real ``shinglefs server`` processes on loopback, metadata in SQLite (the
metadata side, and the command, on PostgreSQL too). A server that is up is
refused, an id never registered and a malformed one too. A crashed server
whose slices have other copies is forgotten: no record names it, ``status``
no longer lists it, ``scrub`` no longer reports it, its queued deletions
and its drive state go, the repair pass brings its slices back to their
goal on the others, and the files read back bit-exact; started again with
its drive, it registers under a new id and its orphan sweep deletes its
old copies. A server holding the only copy of a file's slices is refused
(with the file named) until ``--force``, after which that file reads EIO.
Every step may run again.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
from pathlib import Path

import pytest
from tests.server.test_replication_goal import gone, replicas_of
from tests.server.test_server_deletions import queued
from tests.server.test_server_process import Server, cli, free_port
from tests.support.polling import wait_until

import shinglefs
from shinglefs.meta import open_meta
from shinglefs.meta.api import (
    ROOT_INO,
    MetaStore,
    Replica,
    ServerDrive,
    SliceInfo,
    SliceRef,
    SliceState,
)
from shinglefs.meta.errors import FsError
from shinglefs.server.process import cluster_key
from shinglefs.server.remote import RemoteNode

MiB = 1024 * 1024
EXIT_NOT_SCRUBBED = 42


def drive(tmp_path: Path, name: str) -> str:
    return f"emulated:{tmp_path / name}.img:{256 * MiB}"


def start(meta_url: str, tmp_path: Path, name: str, servers: list[Server],
          *extra: str, port: int | None = None) -> tuple[Server, int]:
    """A ``shinglefs server`` on one emulated drive; the server and its id."""
    server = Server(meta_url, [drive(tmp_path, name)], port or free_port(), *extra)
    servers.append(server)
    found = re.match(r"server (\d+) serving", server.ready())
    assert found is not None
    return server, int(found.group(1))


def stop(server: Server) -> None:
    """A clean stop (SIGTERM): the server is ``stopped`` at once."""
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0


def write(meta_url: str, path: str, data: bytes) -> None:
    with shinglefs.connect(meta_url) as fs:
        fs.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        fs.write_bytes(path, data)


def read(meta_url: str, path: str) -> bytes:
    with shinglefs.connect(meta_url) as fs:
        return fs.read_bytes(path)


def named(meta: MetaStore, server_id: int) -> list[int]:
    """The slices whose records name a replica on the server."""
    out: list[int] = []
    while page := meta.server_slices(server_id, out[-1] if out else 0):
        out += [i.id for i in page]
    return out


def test_a_server_that_is_up_an_unknown_id_and_a_malformed_one_are_refused(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        capsys: pytest.CaptureFixture[str]) -> None:
    _, up = start(meta_url, tmp_path, "s1", servers, "--repair-interval", "0")
    assert cli("forget-server", meta_url, str(up)) == 1
    err = capsys.readouterr().err
    assert f"error: storage server {up} (127.0.0.1:" in err and "is up" in err
    assert "hint: stop its `shinglefs server` process first" in err
    assert [s.id for s in meta.list_servers() if s.live] == [up]  # nothing changed
    with pytest.raises(FsError) as refused:  # the call itself refuses too
        meta.forget_server(up)
    assert refused.value.errno == errno.EBUSY
    assert cli("forget-server", meta_url, str(up + 1)) == 1
    assert f"no storage server {up + 1} was ever registered" in capsys.readouterr().err
    for bad in ("two", "0", "1:0"):
        assert cli("forget-server", meta_url, bad) == 2
        assert "is not a storage server id" in capsys.readouterr().err


def test_a_crashed_server_is_forgotten_and_its_slices_get_their_goal_back_on_the_others(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        capsys: pytest.CaptureFixture[str]) -> None:
    # --repair-after 600: the crashed server stays "present" to the repair pass
    # (its replicas waited for), so only forgetting it lets the others copy.
    slow = ("--repair-after", "600", "--repair-interval", "0.3")
    started = {name: start(meta_url, tmp_path, name, servers, *slow)
               for name in ("s1", "s2", "s3")}
    data = {f"/d/f{i}.bin": os.urandom(6 * MiB + i) for i in range(6)}
    for path, content in data.items():
        write(meta_url, path, content)
    doomed = os.urandom(3 * MiB)
    write(meta_url, "/doomed.bin", doomed)
    doomed_slices = [s for s, _ in replicas_of(meta, meta_url, "/doomed.bin")]
    holders = {r.server for s in doomed_slices for r in meta.get_slice(s).replicas}
    victim_name, (victim, victim_id) = next(
        (n, sv) for n, sv in started.items() if str(sv[1]) in holders)
    on_victim = named(meta, victim_id)
    assert set(doomed_slices) <= set(on_victim)
    victim.kill()  # a crash: no clean stop, its registration says running
    wait_until(lambda: not any(s.live for s in meta.list_servers() if s.id == victim_id),
               "the clients count the crashed server down", limit=60)
    meta.unlink(ROOT_INO, b"doomed.bin")  # no client runs: the queue is the servers'
    wait_until(lambda: all(meta.get_slice(s).replicas == (Replica(str(victim_id), "0"),)
                           for s in doomed_slices), "the live servers freed their copies")
    assert queued(meta) == len(doomed_slices)  # the crashed server's copies are still owed
    assert set(named(meta, victim_id)) == set(on_victim)  # the repair pass waits for it
    assert cli("scrub", meta_url) == EXIT_NOT_SCRUBBED
    assert f"not scrubbed: server {victim_id} (" in capsys.readouterr().out

    assert cli("forget-server", meta_url, str(victim_id), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["forgotten"] and report["registered"] and report["lost"] == 0
    assert report["slices"] == report["records_changed"] == len(on_victim)
    assert report["queued"] == len(doomed_slices)
    assert named(meta, victim_id) == []
    assert not meta.slice_records(doomed_slices) and queued(meta) == 0
    assert victim_id not in {s.id for s in meta.list_servers()}
    assert cli("status", meta_url, "--servers", "--json") == 0
    listed = json.loads(capsys.readouterr().out)["servers"]
    assert sorted(r["id"] for r in listed) == sorted(
        sid for n, (_, sid) in started.items() if n != victim_name)

    def goal_met() -> bool:
        return all(len(rs) == 2 and str(victim_id) not in {r.server for r in rs}
                   for path in data for _, rs in replicas_of(meta, meta_url, path))

    wait_until(goal_met, "every slice back to two copies on the servers left", limit=120)
    for path, content in data.items():
        assert read(meta_url, path) == content
    assert cli("scrub", meta_url) == 0
    assert "not scrubbed" not in capsys.readouterr().out
    assert cli("forget-server", meta_url, str(victim_id)) == 0  # again: nothing left to do
    assert "was forgotten already; 0 slice record(s) named it still" in capsys.readouterr().out

    # Started again with its drive: no registration shares it, so a new id; the
    # copies it holds are named by no record and its orphan sweep deletes them.
    _, back_id = start(meta_url, tmp_path, victim_name, servers, "--repair-interval", "0",
                       "--orphan-grace", "0", "--sweep-interval", "0.3")
    assert back_id > max(sid for _, sid in started.values())
    address = next(s.address for s in meta.list_servers() if s.id == back_id)
    with RemoteNode(address, cluster_key(meta)) as remote:
        wait_until(lambda: all(gone(remote, s, 0) for s in on_victim) and not named(
            meta, back_id), "the returned server's sweep deleted its old copies", limit=60)
    for path, content in data.items():
        assert read(meta_url, path) == content


def test_the_only_copy_of_a_file_is_refused_until_forced_and_then_reads_eio(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        capsys: pytest.CaptureFixture[str]) -> None:
    no_repair = ("--repair-interval", "0")
    holder, holder_id = start(meta_url, tmp_path, "s1", servers, *no_repair)
    only = os.urandom(20 * MiB + 1)  # two slices, one copy: a single server
    write(meta_url, "/only.bin", only)
    _, other_id = start(meta_url, tmp_path, "s2", servers, *no_repair)
    wait_until(lambda: sum(s.live for s in meta.list_servers()) == 2, "two servers live")
    both = os.urandom(4 * MiB)
    write(meta_url, "/both.bin", both)  # two copies, one on each
    only_slices = [s for s, _ in replicas_of(meta, meta_url, "/only.bin")]
    stop(holder)

    assert cli("forget-server", meta_url, str(holder_id)) == 1
    err = capsys.readouterr().err
    assert (f"error: 2 committed slice(s) have no copy on another present server and would "
            f"be lost with server {holder_id}: files /only.bin") in err
    assert "(--force: forget it all the same)" in err
    assert f"hint: start server {holder_id} again, wait until" in err
    assert holder_id in {s.id for s in meta.list_servers()}  # nothing changed
    assert len(named(meta, holder_id)) == 3

    assert cli("forget-server", meta_url, str(holder_id), "--force") == 0
    out = capsys.readouterr().out
    assert f"server {holder_id} forgotten: 3 slice record(s) no longer name it" in out
    assert "lost: 2 slice(s) had no other copy; reads of their bytes fail (EIO): " \
           "files /only.bin" in out
    assert all(meta.get_slice(s).replicas == () for s in only_slices)  # records kept, empty
    assert [rs for _, rs in replicas_of(meta, meta_url, "/both.bin")] == [
        (Replica(str(other_id), "0"),)]
    assert read(meta_url, "/both.bin") == both
    with shinglefs.connect(meta_url) as fs, pytest.raises(OSError) as failed:
        fs.read_bytes("/only.bin")
    assert failed.value.errno == errno.EIO
    assert cli("status", meta_url, "--servers", "--json") == 0
    assert json.loads(capsys.readouterr().out)["replication"]["lost"] == 2
    assert cli("forget-server", meta_url, str(holder_id), "--force") == 0
    assert "was forgotten already" in capsys.readouterr().out


def commit(meta: MetaStore, ino: int, index: int, replicas: list[Replica]) -> int:
    sid = meta.next_slice_id()
    meta.commit_slice(ino, index, SliceRef(sid, 0, 10, 0), 16 * MiB * index + 10,
                      slice_length=10, replicas=replicas)
    return sid


def test_forgetting_in_the_metadata_on_sqlite_and_postgresql(
        any_meta_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """More slices than a batch; one already done (a forget interrupted there);
    queued deletions as if acknowledged; its drive state; a rerun after a
    record named it again (a repairer that read before the forget)."""
    meta = open_meta(any_meta_url)
    try:
        gone_id, kept_id = (meta.register_server(f"h:{i}", [ServerDrive(
            0, f"emulated:/d{i}", f"uuid-{i}", "cold", 100, 100)]) for i in (1, 2))
        gone, kept = Replica(str(gone_id), "0"), Replica(str(kept_id), "0")
        ino = meta.mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644).ino
        shared = [commit(meta, ino, i, [gone, kept]) for i in range(1100)]
        alone = commit(meta, ino, 1100, [gone])
        meta.set_slice_replicas(shared[7], [kept])  # done by an interrupted forget
        queued_alone, queued_shared = (commit(meta, ino, i, r) for i, r in
                                       ((1101, [gone]), (1102, [gone, kept])))
        meta.truncate(ino, 16 * MiB * 1101)  # the last two are queued for deletion
        meta.set_drive_state(gone_id, 0, "offline")
        assert len(named(meta, gone_id)) == 1102
        first = meta.server_slices(gone_id, 0, 3)
        assert first == [SliceInfo(s, 10, 0, SliceState.COMMITTED, 1, (gone, kept))
                         for s in shared[:3]]
        with pytest.raises(FsError) as busy:
            meta.forget_server(gone_id)  # it heartbeated just now
        assert busy.value.errno == errno.EBUSY
        meta.unregister_server(gone_id)  # a clean stop

        assert cli("forget-server", any_meta_url, str(gone_id), "--json") == 1
        assert "1 committed slice(s) have no copy" in capsys.readouterr().err
        assert cli("forget-server", any_meta_url, str(gone_id), "--force", "--json") == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["slices"], report["committed"], report["queued"], report["lost"],
                report["lost_slices"], report["lost_files"]) == (
            1102, 1100, 2, 1, [alone], ["/f"])
        assert named(meta, gone_id) == []
        assert gone_id not in {s.id for s in meta.list_servers()}
        assert meta.drive_states() == {}
        assert meta.get_slice(alone).replicas == ()
        assert all(meta.get_slice(s).replicas == (kept,) for s in shared[::100])
        assert not meta.slice_records([queued_alone])  # its record and queue entry went
        assert [i.id for i in meta.pop_deletions_on(kept_id)] == [queued_shared]
        assert queued(meta) == 1

        meta.set_slice_replicas(shared[0], [kept, gone])  # a stale repairer's record
        assert meta.forget_server(gone_id) == 1
        assert meta.get_slice(shared[0]).replicas == (kept,)
        assert meta.forget_server(gone_id) == 0
        with pytest.raises(FsError) as unknown:
            meta.forget_server(kept_id + 1)
        assert unknown.value.errno == errno.ENOENT
    finally:
        meta.close()
