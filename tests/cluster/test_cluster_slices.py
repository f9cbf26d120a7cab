"""The slice protocol between real hosts: storage servers and clients each in a
network namespace of their own (tests/support/netns.py), talking over a bridge.

Servers run as processes on s1, s2, s3 over their own emulated drives;
clients are processes on a and b (tests/cluster/hostjob.py), which print
what they observed as JSON; the assertions are made here. `make test` runs
the first test; `make test-cluster` all of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.cluster.hosts import SERVERS, hostjob, server_address
from tests.support.netns import Cluster, HostProcess
from tests.support.pgcluster import PgCluster

from shinglefs.meta import open_meta

pytestmark = pytest.mark.cluster

StartServers = Callable[..., dict[str, HostProcess]]
WIRE_FAILURES = {"ConnectionLost", "ServerUnreachable", "RequestTimeout"}


def job(cluster: Cluster, host: str, *args: str, timeout: float = 60.0) -> dict[str, object]:
    """Run a hostjob on ``host``; its JSON lines merged (fails on a non-zero exit)."""
    code, proc = cluster.run(host, hostjob(*args), timeout=timeout, label=f"{host}-{args[0]}")
    assert code == 0, proc.describe()
    merged: dict[str, object] = {}
    for line in proc.json_lines():
        merged.update(line)
    return merged


def servers_args(cluster: Cluster, names: tuple[str, ...] = SERVERS) -> list[str]:
    return [arg for name in names for arg in ("--server", server_address(cluster, name))]


def assert_all_read_back(result: dict[str, object], expected_slices: int) -> None:
    rows = result["read"]
    assert isinstance(rows, list)
    assert len(rows) == expected_slices
    bad = [row for row in rows if not row[2]]
    assert bad == [], f"slices not read back bit-exact (server, slice, ok, offset): {bad}"


@pytest.mark.slow  # `make test-cluster` (CI) runs it; `make test` runs one cluster test
def test_slices_written_on_one_host_read_bit_exact_on_another(
        cluster: Cluster, start_servers: StartServers, secret_file: Path) -> None:
    start_servers(*SERVERS)
    common = ["--secret-file", str(secret_file), *servers_args(cluster), "--slices", "2"]
    written = job(cluster, "a", "write", *common)["written"]
    assert isinstance(written, list)
    assert {row[0] for row in written} == {server_address(cluster, s) for s in SERVERS}
    assert len(written) == 6
    assert_all_read_back(job(cluster, "b", "read", *common), 6)


@pytest.mark.slow
def test_killed_server_fails_fast_others_serve_and_restart_serves_durable_slices(
        cluster: Cluster, start_servers: StartServers, secret_file: Path) -> None:
    servers = start_servers(*SERVERS)
    secret = ["--secret-file", str(secret_file)]
    durable = [*secret, *servers_args(cluster), "--slices", "2"]
    job(cluster, "a", "write", *durable)  # durable on every server (flushed)

    victim, others = "s2", ("s1", "s3")
    stream = cluster.spawn("a", hostjob(
        "stream", *secret, "--victim", server_address(cluster, victim),
        *[arg for o in others for arg in ("--other", server_address(cluster, o))],
        "--timeout", "5"), label="a-stream", lifetime=90)
    stream.wait_line('{"streaming"')
    servers[victim].kill()  # SIGKILL mid-stream: no goodbye, nothing flushed
    assert stream.wait(60) == 0, stream.describe()  # 60 s: a bound against a hang
    seen: dict[str, object] = {}
    for line in stream.json_lines():
        seen.update(line)
    assert seen["victim_error"] in WIRE_FAILURES, stream.describe()
    assert seen["others"] == {server_address(cluster, o): True for o in others}
    assert seen["victim_again"] == "ServerUnreachable"

    # While the victim is down, the others serve a second host too.
    assert_all_read_back(job(cluster, "b", "read", *secret, *servers_args(cluster, others),
                             "--slices", "2"), 4)
    # Restarted over the same drives, the victim serves its durable slices again.
    start_servers(victim)
    assert_all_read_back(job(cluster, "b", "read", *durable), 6)


@pytest.mark.slow
def test_wrong_secret_replayed_handshake_and_malformed_frame_are_refused(
        cluster: Cluster, start_servers: StartServers, secret_file: Path,
        tmp_path: Path) -> None:
    server = start_servers("s1")["s1"]
    wrong = tmp_path / "wrong.secret"
    wrong.write_bytes(b"not the cluster secret, 32 bytes")
    seen = job(cluster, "b", "hostile", "--secret-file", str(secret_file),
               "--wrong-secret-file", str(wrong),
               "--server", server_address(cluster, "s1"))["hostile"]
    assert isinstance(seen, dict)
    assert seen["wrong_secret_client"] == "AuthFailed"
    assert seen["recorded"] == "answered WELCOME"  # the handshake replayed below was good
    for attempt in ("wrong_proof", "replayed", "malformed"):
        assert str(seen[attempt]).startswith("closed"), (attempt, seen)
    assert seen["good_client"] == "answered"
    peer = f"connection from {cluster.host('b').address}:"
    refusals = [line for line in server.errors().splitlines() if peer in line]
    assert sum("AuthFailed: the client's proof is wrong" in line for line in refusals) == 2, refusals
    assert any("FrameError" in line for line in refusals), refusals
    # The server keeps serving whoever holds the secret, from any host.
    common = ["--secret-file", str(secret_file), "--server", server_address(cluster, "s1"),
              "--slices", "1", "--size", "5000"]
    job(cluster, "b", "write", *common)
    assert_all_read_back(job(cluster, "a", "read", *common), 1)


@pytest.mark.slow
def test_host_opens_the_metadata_on_postgresql_through_the_bridge(
        cluster: Cluster, pg: PgCluster) -> None:
    url = pg.new_database()
    name, fs_uuid = "cluster-test", str(uuid.uuid4())
    meta = open_meta(url)
    try:
        meta.format(name, fs_uuid, secret="s3cret")
    finally:
        meta.close()
    database = url.rsplit("/", 1)[1]
    seen = job(cluster, "a", "meta", pg.url(database, host=cluster.bridge_address))["meta"]
    assert isinstance(seen, dict)
    assert (seen["name"], seen["uuid"]) == (name, fs_uuid)
    # The host is isolated: its 127.0.0.1 is its own loopback, with no PostgreSQL.
    code, local = cluster.run("a", hostjob("meta", url), timeout=60, label="a-meta-loopback")
    assert code != 0
    assert "MetaUnavailable" in local.errors(), local.describe()


@pytest.mark.slow
def test_a_host_cut_off_from_the_metadata_gets_an_error_and_recovers(
        cluster: Cluster, pg: PgCluster) -> None:
    """The link of a client host goes down while it holds a connection to the
    metadata (a network partition): its next request fails (EIO to an
    application) instead of hanging for the kernel's ~15 minutes of
    retransmissions, and it works again once the link is back
    (``pgbackend.TCP_LIVENESS``)."""
    import subprocess

    url = pg.new_database()
    meta = open_meta(url)
    try:
        meta.format("partition-test", str(uuid.uuid4()), secret="s3cret")
    finally:
        meta.close()
    database = url.rsplit("/", 1)[1]
    proc = cluster.spawn("a", hostjob("meta-partition", pg.url(database, host=cluster.bridge_address),
                                      "--max-seconds", "150"), label="a-partition", lifetime=400)
    proc.wait_line('{"ready"', limit=60)
    veth = cluster.host("a").veth
    subprocess.run(["ip", "link", "set", veth, "down"], check=True, timeout=30)
    try:
        proc.wait_for(lambda p: any("partition" in line for line in p.json_lines()),
                      "the host's request ends", limit=180)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True, timeout=30)
    assert proc.wait(limit=200) == 0, proc.describe()
    seen: dict[str, object] = {}
    for line in proc.json_lines():
        seen.update(line)
    partition = seen["partition"]
    assert isinstance(partition, dict) and partition["error"] == "MetaUnavailable", seen
    assert seen.get("recovered_s") is not None, seen
