"""``shinglefs status URL --servers`` shows each live server's per-drive write
figures, asked of the server (bytes written, runs, switches, queue depth)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.server.test_cluster_node import live_count, start_server
from tests.server.test_server_process import Server, cli
from tests.support.polling import wait_until

import shinglefs
from shinglefs.meta.api import MetaStore

MiB = 1024 * 1024


def test_status_of_the_servers_shows_each_drive_s_write_figures(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("s1", "s2"):
        start_server(meta_url, tmp_path, name, servers)
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    fs = shinglefs.connect(meta_url)
    try:
        for i in range(3):  # three files: three groups, each on both servers
            fs.write_bytes(f"/f{i}.bin", os.urandom(5 * MiB))
    finally:
        fs.close()
    assert cli("status", meta_url, "--servers", "--json", "--server-timeout", "5") == 0
    shown = json.loads(capsys.readouterr().out)["servers"]
    assert len(shown) == 2
    for server in shown:
        [writes] = server["drive_writes"]
        assert writes["bytes_written"] == 15 * MiB  # two replicas: every byte on each
        assert writes["group_switches"] >= 3 and writes["zone_switches"] >= 3
        assert writes["runs"] >= 3
        assert writes["mean_run_bytes"] == writes["bytes_written"] // writes["runs"]
        assert (writes["queued_pieces"], writes["queued_bytes"]) == (0, 0)
    assert cli("status", meta_url, "--servers", "--server-timeout", "5") == 0
    assert "switches" in capsys.readouterr().out  # the table's writes column
