"""The test bed itself (tests/support/netns.py): processes are bounded, teardown
leaves nothing, a crashed session's leftovers are removed. Each test builds its
own small cluster under another prefix, so the session's hosts are untouched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.netns import Cluster, remove_leftovers, unavailable_reason

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(unavailable_reason() is not None,
                       reason=f"test hosts need network namespaces: {unavailable_reason()}"),
]
PREFIX = "sfsu"


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.split()}


def links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return {str(link["ifname"]) for link in json.loads(out or "[]")}


def test_teardown_kills_processes_and_removes_namespaces_and_links(tmp_path: Path) -> None:
    cluster = Cluster.create(["x", "y"], tmp_path, prefix=PREFIX)
    try:
        cluster.check_reachability()
        ours = {h.netns for h in cluster.hosts.values()}
        assert ours <= namespaces()
        assert {cluster.bridge, *(h.veth for h in cluster.hosts.values())} <= links()
        expired = cluster.spawn("x", ["sleep", "60"], lifetime=0.5)
        assert expired.wait(30) != 0  # killed by its lifetime, not by 60 s passing
        assert expired.lifetime_expired
        sleeper = cluster.spawn("y", ["sleep", "60"])
        # The host's only route is its subnet: no way off the machine.
        code, routes = cluster.run("y", ["ip", "-4", "route"], timeout=10)
        assert code == 0
        assert routes.output().split()[0] == str(cluster.subnet)
        assert "default" not in routes.output()
    finally:
        cluster.close()
    assert sleeper.popen.poll() is not None
    assert not ours & namespaces()
    assert not {cluster.bridge, *(h.veth for h in cluster.hosts.values())} & links()


def test_a_dead_sessions_leftovers_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    leftover = f"{PREFIX}{dead_pid}-z"
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    live = Cluster.create(["w"], tmp_path, prefix=PREFIX)  # removes the leftover first
    try:
        assert leftover not in namespaces()
        assert live.host("w").netns in namespaces()
        assert remove_leftovers(PREFIX) == []  # this session is alive: nothing removed
        assert live.host("w").netns in namespaces()
    finally:
        live.close()
        subprocess.run(["ip", "netns", "delete", leftover], capture_output=True)
