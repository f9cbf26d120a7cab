"""`shinglefs server` on three namespace hosts, membership in PostgreSQL on the bridge.

Each storage host runs the real command against the file system's metadata
in the root namespace's PostgreSQL; the servers register, heartbeat, and the
test (root namespace, another host on the bridge) talks to each one with the
cluster secret read from meta. A server killed with SIGKILL goes stale; one
stopped with SIGTERM is recorded stopped.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from tests.cluster.hosts import SERVERS, server_address
from tests.support.netns import Cluster
from tests.support.pgcluster import PgCluster
from tests.support.polling import wait_until

from shinglefs.meta import open_meta
from shinglefs.server.process import cluster_key
from shinglefs.server.remote import RemoteNode

MiB = 1024 * 1024
pytestmark = pytest.mark.cluster


def _shinglefs() -> list[str]:
    script = Path(sys.executable).with_name("shinglefs")
    return [str(script)] if script.exists() else [
        sys.executable, "-c", "from shinglefs.cli.main import main; main()"]


@pytest.mark.slow  # `make test-cluster` (CI) runs it; `make test` runs one cluster test
def test_servers_on_three_hosts_register_serve_and_go_stale_in_meta(
        cluster: Cluster, pg: PgCluster, tmp_path: Path) -> None:
    url = pg.new_database()
    database = url.rsplit("/", 1)[1].split("?")[0]
    bridge_url = pg.url(database, host=cluster.bridge_address)
    from shinglefs.client.filesystem import format_filesystem

    format_filesystem(url, [f"emulated:{tmp_path / 'format.img'}:{2 * 1024 * MiB}"],
                      name=f"hosts-{uuid.uuid4().hex[:6]}")
    procs = {}
    for host in SERVERS:
        (tmp_path / host).mkdir()
        procs[host] = cluster.spawn(host, [
            *_shinglefs(), "server", bridge_url,
            "--drive", f"emulated:{tmp_path / host / 'd0.img'}:{2 * 1024 * MiB}",
            "--listen", server_address(cluster, host), "--label", f"rack={host}",
            "--heartbeat", "0.2", "--zone-size", "64M"], label=f"{host}-shinglefs-server")
    meta = open_meta(url)
    try:
        def live() -> dict[str, bool]:
            return {s.labels.get("rack", ""): s.live for s in meta.list_servers(timeout_s=1.5)}

        wait_until(lambda: live() == {h: True for h in SERVERS}, "three servers registered",
                   limit=60)
        key = cluster_key(meta)
        pieces = {}
        for record in meta.list_servers():
            piece = os.urandom(MiB + record.id)
            with RemoteNode(record.address, key, timeout=30) as remote:
                remote.write(1000 + record.id, 0, piece, group=1, durable=True)
                assert remote.read(1000 + record.id, 0, len(piece)) == piece
            pieces[record.labels["rack"]] = piece

        procs["s1"].kill(signal.SIGKILL)
        procs["s2"].kill(signal.SIGTERM)
        wait_until(lambda: live() == {"s1": False, "s2": False, "s3": True},
                   "s1 stale, s2 stopped, s3 live", limit=30)
        by_rack = {s.labels["rack"]: s for s in meta.list_servers(timeout_s=1.5)}
        assert by_rack["s1"].stopped_ns == 0  # crashed: only its heartbeat stopped
        assert by_rack["s2"].stopped_ns > 0  # a clean stop unregisters
        with RemoteNode(by_rack["s3"].address, key, timeout=30) as remote:
            sid = 1000 + by_rack["s3"].id
            assert remote.read(sid, 0, len(pieces["s3"])) == pieces["s3"]
    finally:
        meta.close()
