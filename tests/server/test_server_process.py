"""`shinglefs server` as a real process: it registers in meta, serves slices to a
RemoteNode holding the cluster secret from meta, goes stale when killed, rejoins
under its id with its data after a restart, and unregisters on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.polling import wait_until

from shinglefs.cli.main import main
from shinglefs.client.filesystem import format_filesystem
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO, DirPolicy, MetaStore, ServerRecord
from shinglefs.server.process import ServerConfig, StorageServer, cluster_key
from shinglefs.server.remote import RemoteNode

MiB = 1024 * 1024
CLI = [sys.executable, "-c", "from shinglefs.cli.main import main; main()"]
HEARTBEAT = "0.2"
TIMEOUT_S = 1.0  # five heartbeats: the liveness timeout the tests read with


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def formatted(url: str, tmp_path: Path) -> str:
    format_filesystem(url, [f"emulated:{tmp_path / 'fs0.img'}:{256 * MiB}"],
                      zone_size=16 * MiB)
    return url


@pytest.fixture
def meta_url(tmp_path: Path) -> str:
    return formatted(f"sqlite3://{tmp_path / 'meta.db'}", tmp_path)


@pytest.fixture
def any_meta_url(any_backend_url: str, tmp_path: Path) -> str:
    """A formatted file system's metadata on each backend (PostgreSQL: many hosts)."""
    return formatted(any_backend_url, tmp_path)


class Server:
    """One `shinglefs server` subprocess (killed at the end of the test if still running)."""

    def __init__(self, meta_url: str, drives: list[str], port: int, *extra: str) -> None:
        args = [*CLI, "server", meta_url, "--listen", f"127.0.0.1:{port}",
                "--heartbeat", HEARTBEAT, "--zone-size", "16M", *extra]
        for drive in drives:
            args += ["--drive", drive]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def ready(self) -> str:
        """The line the server prints once it serves and is registered."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "serving" in line, f"server did not come up: {self.stop_output()}"
        return line

    def stop_output(self) -> str:
        out, err = self.proc.communicate(timeout=60)
        return out + err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=60)


def only(meta: MetaStore) -> ServerRecord:
    (server,) = meta.list_servers(TIMEOUT_S)
    return server


def test_a_server_registers_serves_goes_stale_rejoins_and_unregisters(
        tmp_path: Path, any_meta_url: str, servers: list[Server]) -> None:
    meta_url = any_meta_url
    meta = open_meta(meta_url)
    try:
        life_cycle(tmp_path, meta_url, meta, servers)
    finally:
        meta.close()


def life_cycle(tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    port = free_port()
    drives = [f"emulated:{tmp_path / 's0.img'}:{256 * MiB}",
              f"conventional:{tmp_path / 's1.img'}:{128 * MiB}"]
    servers.append(first := Server(meta_url, drives, port, "--label", "rack=a"))
    first.ready()
    registered = only(meta)
    assert registered.live and registered.address == f"127.0.0.1:{port}"
    assert registered.labels == {"rack": "a"}
    assert sorted(registered.tiers()) == ["cold", "hot"]
    assert all(d.uuid for d in registered.drives)

    key = cluster_key(meta)
    assert len(key) == 64  # format created a random secret
    piece = os.urandom(3 * MiB + 17)
    with RemoteNode(registered.address, key, timeout=30) as remote:
        drive = remote.write(77, 0, piece, group=5, durable=True)
        assert remote.read(77, 0, len(piece)) == piece

    first.proc.send_signal(signal.SIGKILL)
    first.proc.communicate(timeout=60)
    wait_until(lambda: not only(meta).live, "the killed server went stale")
    assert only(meta).stopped_ns == 0  # crashed, not stopped

    servers.append(second := Server(meta_url, drives, port, "--label", "rack=a"))
    second.ready()
    rejoined = only(meta)
    assert rejoined.id == registered.id and rejoined.live
    assert rejoined.started_ns > registered.started_ns
    with RemoteNode(rejoined.address, key, timeout=30) as remote:
        assert remote.read(77, 0, len(piece), drive_id=drive) == piece

    meta.unregister_server(rejoined.id)  # e.g. an operator: its next heartbeat registers again
    wait_until(lambda: only(meta).live, "the unregistered server registered again")
    assert only(meta).id == registered.id

    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=60) == 0
    stopped = only(meta)
    assert not stopped.live and stopped.stopped_ns > 0


def test_a_server_places_a_groups_slices_on_the_tier_its_directory_sets(
        tmp_path: Path, meta_url: str, servers: list[Server]) -> None:
    """A storage server reads the tier of the group a client sends (the file's
    directory's ``DirPolicy.tier``) and uses that tier's drive of its own."""
    drives = [f"emulated:{tmp_path / 's0.img'}:{256 * MiB}",
              f"conventional:{tmp_path / 's1.img'}:{128 * MiB}"]
    servers.append(server := Server(meta_url, drives, free_port()))
    server.ready()
    meta = open_meta(meta_url)
    try:
        record = only(meta)
        tier_of = {d.drive_id: d.tier for d in record.drives}
        files = {}
        for tier in ("hot", "cold"):
            directory = meta.mkdir(ROOT_INO, tier.encode(), 0o755)
            meta.set_policy(directory.ino, DirPolicy(tier=tier))
            files[tier] = meta.create(directory.ino, b"f", 0o644).ino
        with RemoteNode(record.address, cluster_key(meta), timeout=30) as remote:
            for n, (tier, group) in enumerate(sorted(files.items())):
                drive = remote.write(100 + n, 0, os.urandom(2 * MiB), group=group, durable=True)
                assert tier_of[drive] == tier
    finally:
        meta.close()


def cli(*args: str) -> int:
    """``shinglefs ARGS`` in this process (no interpreter start-up); its exit code."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
        raise SystemExit(0)
    return int(exited.value.code or 0)


def test_status_lists_the_servers(tmp_path: Path, meta_url: str, servers: list[Server],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    servers.append(server := Server(meta_url, [f"emulated:{tmp_path / 's0.img'}:{256 * MiB}"],
                                    free_port(), "--label", "rack=b"))
    server.ready()
    assert cli("status", meta_url, "--json", "--server-timeout", "5") == 0
    (row,) = json.loads(capsys.readouterr().out)["servers"]
    assert (row["state"], row["labels"], row["drives"]) == ("up", {"rack": "b"}, 1)
    assert 0 < row["free_bytes"] <= row["capacity_bytes"] == row["tiers"]["cold"]["capacity_bytes"]
    assert cli("status", meta_url, "--servers", "--json") == 0  # opens no drive
    only_servers = json.loads(capsys.readouterr().out)
    assert set(only_servers) == {"meta_url", "servers", "replication"}
    assert only_servers["replication"] == {"goal": 1, "slices": 0, "under_replicated": 0,
                                           "lost": 0, "draining": 0}
    assert [r["state"] for r in only_servers["servers"]] == ["up"]
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    assert cli("status", meta_url) == 0
    text = capsys.readouterr().out
    assert "storage servers" in text and "rack=b" in text and "stopped" in text


def test_an_address_in_use_is_exit_23_before_any_drive_is_made(
        tmp_path: Path, meta_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli("server", meta_url, "--listen", f"127.0.0.1:{port}",
                   "--drive", f"emulated:{tmp_path / 's0.img'}:{256 * MiB}") == 23
    assert "address is in use" in capsys.readouterr().err
    assert not (tmp_path / "s0.img").exists()


def test_a_drive_in_use_is_exit_3(tmp_path: Path, meta_url: str, servers: list[Server],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    drive = f"emulated:{tmp_path / 's0.img'}:{256 * MiB}"
    servers.append(first := Server(meta_url, [drive], free_port()))
    first.ready()
    assert cli("server", meta_url, "--drive", drive, "--listen", "127.0.0.1:0", "--zone-size",
               "16M", "--drive", f"emulated:{tmp_path / 'new.img'}:{256 * MiB}") == 3
    assert f"in use by pid {first.proc.pid}" in capsys.readouterr().err
    assert not (tmp_path / "new.img").exists()  # refused before any drive was made


def test_unreachable_metadata_is_exit_3(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli("server", f"postgresql://nobody@127.0.0.1:{port}/meta", "--listen",
               "127.0.0.1:0", "--drive", f"emulated:{tmp_path / 's0.img'}:{256 * MiB}") == 3
    assert capsys.readouterr().err.startswith("shinglefs: error:")
    assert not (tmp_path / "s0.img").exists()


def test_a_drive_of_another_file_system_is_refused(tmp_path: Path, meta_url: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    other = f"sqlite3://{tmp_path / 'other.db'}"
    format_filesystem(other, [f"emulated:{tmp_path / 'theirs.img'}:{256 * MiB}"],
                      zone_size=16 * MiB)
    assert cli("server", meta_url, "--listen", "127.0.0.1:0",
               "--drive", f"emulated:{tmp_path / 'theirs.img'}") == 18
    assert "belongs to another file system" in capsys.readouterr().err


def test_reordered_drives_keep_their_ids(tmp_path: Path, meta_url: str) -> None:
    a, b = (f"emulated:{tmp_path / name}:{256 * MiB}" for name in ("a.img", "b.img"))

    def drive_ids(drives: list[str]) -> dict[str, int]:
        config = ServerConfig(meta_url, tuple(drives), ("127.0.0.1", 0), heartbeat_s=60,
                              zone_size=16 * MiB)
        with StorageServer(config).start() as server:
            return {d.spec.split(":")[1]: d.drive_id for d in server.drive_records()}

    first = drive_ids([a, b])
    assert sorted(first.values()) == [0, 1]
    assert drive_ids([b, a]) == first


@pytest.mark.parametrize("flags, says", [
    (["--listen", "7070"], "is not HOST:PORT"),
    (["--listen", "127.0.0.1:0", "--label", "rack"], "is not KEY=VALUE"),
    (["--listen", "127.0.0.1:0", "--heartbeat", "0"], "not a positive number"),
])
def test_malformed_flags_are_exit_2(tmp_path: Path, meta_url: str, flags: list[str], says: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    drive = f"emulated:{tmp_path / 's0.img'}:{256 * MiB}"
    assert cli("server", meta_url, "--drive", drive, *flags) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "s0.img").exists()
