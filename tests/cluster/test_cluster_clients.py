"""Client hosts of a file system on three storage servers, metadata in PostgreSQL.

The servers are real ``shinglefs server`` processes on hosts s1-s3; the
clients run on hosts a and b (tests/cluster/fsjob.py): a FUSE mount on a
writes files that a FUSE mount on b and a ``connect()`` on b read bit-exact
after close (close-to-open across hosts), and eight writers on both client
hosts at once write files every host reads back, spread over the servers.
"""

from __future__ import annotations

import hashlib
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.cluster.fsjob import content
from tests.cluster.hosts import SERVERS, server_address
from tests.support.netns import Cluster, HostProcess
from tests.support.pgcluster import PgCluster
from tests.support.polling import wait_until

from shinglefs.client.commit import drive_for, split_drive_id
from shinglefs.client.filesystem import format_filesystem
from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_CTX, ROOT_INO, MetaStore
from shinglefs.meta.errors import FsError
from shinglefs.server.repair import replication_health

MiB = 1024 * 1024
FSJOB = Path(__file__).resolve().with_name("fsjob.py")
pytestmark = pytest.mark.cluster


def _shinglefs() -> list[str]:
    script = Path(sys.executable).with_name("shinglefs")
    return [str(script)] if script.exists() else [
        sys.executable, "-c", "from shinglefs.cli.main import main; main()"]


def fsjob(*args: str) -> list[str]:
    return [sys.executable, str(FSJOB), *args]


@dataclass
class OnServers:
    """A file system on the three server hosts: ``url`` (the bridge address, for
    every host), ``root_url`` (for the test itself), the server processes."""

    url: str
    root_url: str
    servers: dict[str, HostProcess] = field(default_factory=dict)


@pytest.fixture
def on_servers(cluster: Cluster, pg: PgCluster, tmp_path: Path) -> Callable[..., OnServers]:
    """Format a file system for servers and start one on each server host (with
    ``extra`` flags); returns it once all three are live."""
    def start(*extra: str) -> OnServers:
        url = pg.new_database()
        database = url.rsplit("/", 1)[1].split("?")[0]
        format_filesystem(url, [], servers=True, name=f"c-{uuid.uuid4().hex[:6]}")
        bridge_url = pg.url(database, host=cluster.bridge_address)
        fs = OnServers(bridge_url, url)
        for host in SERVERS:
            (tmp_path / host).mkdir()
            fs.servers[host] = cluster.spawn(host, [
                *_shinglefs(), "server", bridge_url,
                "--drive", f"emulated:{tmp_path / host / 'd0.img'}:{2 * 1024 * MiB}",
                "--listen", server_address(cluster, host), "--label", f"rack={host}",
                "--heartbeat", "0.5", "--zone-size", "64M", *extra],
                label=f"{host}-shinglefs-server", lifetime=400)
        meta = open_meta(url)
        try:
            wait_until(lambda: sum(s.live for s in meta.list_servers()) == len(SERVERS),
                       "three servers live", limit=60)
        finally:
            meta.close()
        return fs

    return start


def result(proc: HostProcess, limit: float = 180) -> dict[str, str]:
    assert proc.wait(limit) == 0, proc.describe()
    (line,) = proc.json_lines()
    out = line.get("written") or line.get("read")
    assert isinstance(out, dict), proc.describe()
    return out


def sha(name: str, size: int) -> str:
    return hashlib.sha256(content(name, size)).hexdigest()


def test_a_file_closed_on_one_client_host_reads_bit_exact_on_another(
        cluster: Cluster, on_servers: Callable[..., OnServers], tmp_path: Path) -> None:
    url = on_servers().url
    files = {"tiny": 100, "block": 4096, "odd": 3 * MiB + 5, "big": 40 * MiB}
    specs = [f"{n}:{s}" for n, s in files.items()]
    written = result(cluster.spawn("a", fsjob("mount-write", url, str(tmp_path / "mnt-a"),
                                               *specs), label="a-mount-write", lifetime=200))
    assert written == {n: sha(n, s) for n, s in files.items()}
    through_mount = result(cluster.spawn("b", fsjob("mount-read", url, str(tmp_path / "mnt-b"),
                                                     *files), label="b-mount-read", lifetime=200))
    through_api = result(cluster.spawn("b", fsjob("read", url, *files), label="b-read",
                                       lifetime=200))
    assert through_mount == written and through_api == written


@pytest.mark.slow  # `make test-cluster` (CI) runs it; `make test` runs one cluster test
def test_eight_writers_on_two_client_hosts_spread_over_the_servers(
        cluster: Cluster, on_servers: Callable[..., OnServers], tmp_path: Path) -> None:
    url = on_servers().url
    size = 24 * MiB
    names = {host: [f"{host}{i}" for i in range(4)] for host in ("a", "b")}
    procs = {host: cluster.spawn(host, fsjob("write", url, *[f"{n}:{size}" for n in files],
                                              "--writers", "4"),
                                 label=f"{host}-write", lifetime=300)
             for host, files in names.items()}
    written = {}
    for proc in procs.values():
        written.update(result(proc, 280))
    every = [n for files in names.values() for n in files]
    assert written == {n: sha(n, size) for n in every}
    for host in ("a", "b"):
        assert result(cluster.spawn(host, fsjob("read", url, *every), label=f"{host}-read",
                                    lifetime=200)) == written
    meta = open_meta(url)
    try:
        servers = set()
        for name in every:
            attr = meta.lookup(ROOT_INO, name.encode(), ROOT_CTX)
            for piece in meta.read_map(attr.ino, 0, attr.size):
                for replica in meta.get_slice(piece.slice_id).replicas:
                    drive = drive_for(replica)
                    assert drive is not None
                    servers.add(split_drive_id(drive)[0])
        assert len(servers) >= 2, f"every slice on one server: {servers}"
    finally:
        meta.close()


@pytest.mark.slow  # `make test-cluster` (CI) runs it; `make test` runs one cluster test
def test_a_server_killed_during_a_two_rank_dcp_save(
        cluster: Cluster, on_servers: Callable[..., OnServers], tmp_path: Path) -> None:
    """kill -9 of a storage server while two ranks save a torch.distributed.checkpoint
    through a mount on host a: the save completes (or fails cleanly, leaving no
    committed checkpoint); a committed one loads bit-exact on host b; the
    servers left restore two replicas of every slice."""
    pytest.importorskip("torch")
    fs = on_servers("--repair-after", "2", "--repair-interval", "0.5")
    url = fs.url
    work = tmp_path / "work"
    work.mkdir()
    save = cluster.spawn("a", fsjob("dcp-save", url, str(tmp_path / "mnt-a"), "step-1",
                                    str(work)), label="a-dcp-save", lifetime=400)
    meta = open_meta(fs.root_url)
    try:
        # Mid-save for sure: a shard is being written (64 MiB of its 256 committed).
        wait_until(lambda: _shard_bytes(meta) >= 64 * MiB or save.popen.poll() is not None,
                   "a shard being written", limit=180)
        assert save.popen.poll() is None, f"the save ended first: {save.describe()}"
        fs.servers["s1"].kill(signal.SIGKILL)
        assert save.wait(380) == 0, save.describe()
        outcome = save.json_lines()[-1]
        ckpt = meta.lookup(ROOT_INO, b"ckpt", ROOT_CTX)
        names = {e.name for e in meta.readdir(ckpt.ino)}
        if "saved" in outcome:
            assert b"step-1" in names and b"step-1.tmp" not in names
            load = cluster.spawn("b", fsjob("dcp-load", url, str(tmp_path / "mnt-b"), "step-1",
                                            str(work)), label="b-dcp-load", lifetime=300)
            assert load.wait(280) == 0, load.describe()
            assert load.json_lines()[-1] == {"loaded": "step-1"}
        else:
            assert "save_failed" in outcome, save.describe()
            assert b"step-1" not in names  # nothing committed
        wait_until(lambda: _restored(meta), "two replicas of every slice on s2 and s3", limit=120)
    finally:
        meta.close()


def _shard_bytes(meta: MetaStore) -> int:
    """The largest committed size of a shard in ckpt/step-1.tmp (0 before any)."""
    try:
        ckpt = meta.lookup(ROOT_INO, b"ckpt", ROOT_CTX)
        staging = meta.lookup(ckpt.ino, b"step-1.tmp", ROOT_CTX)
    except FsError:  # not created yet, or renamed already
        return 0
    return max((e.attr.size for e in meta.readdir(staging.ino) if e.name.endswith(b".distcp")),
               default=0)


def _restored(meta: MetaStore) -> bool:
    health = replication_health(meta, 2.0)
    return health.goal == 2 and health.under_replicated == 0 and health.lost == 0
