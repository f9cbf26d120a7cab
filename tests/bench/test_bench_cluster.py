"""``shinglefs bench cluster``: end to end on loopback (slow: three servers,
21 writers, 25 readers and a failover reader as processes, a private
PostgreSQL), and the zone-switch arithmetic of ``mean_run_mib``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shinglefs.bench.cluster import TARGETS, run_figures
from shinglefs.testbed.pgcluster import PgClusterError, find_bindir

MiB = 1024 * 1024
CLI = [sys.executable, "-c", "from shinglefs.cli.main import main; main()"]
POSITIVE = ("write_mib_s_1", "write_mib_s_4", "write_mib_s_16", "scaling_16", "mean_run_mib",
            "read_mib_s_1", "read_mib_s_8", "read_scaling_8", "read_mib_s_16",
            "protocol_mib_s", "socket_mib_s", "failover_read_s", "pg_small_files_per_s")


def _postgres_installed() -> bool:
    try:
        find_bindir()
    except PgClusterError:
        return False
    return True


@pytest.mark.slow
def test_bench_cluster_quick_on_loopback_reports_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "bench", "cluster", "--quick", "--json", "--hosts", "loopback",
                           "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["hosts"] == "loopback" and "hosts_note" in result
    assert result["servers"] == 3 and result["quick"] is True
    expected = POSITIVE if _postgres_installed() else POSITIVE[:-1]
    for key in expected:
        assert isinstance(result[key], int | float) and result[key] > 0, (key, result[key])
    assert set(result["targets_met"]) == set(TARGETS)
    assert len(result["samples"]) == result["rounds"] == 1
    assert set(result["cpu_busy"]) == {"write_1", "write_4", "write_16", "read_1", "read_8",
                                       "read_16"}
    assert all(0.0 < busy <= 1.0 for busy in result["cpu_busy"].values()), result["cpu_busy"]


def test_a_zone_switch_is_a_change_of_group_or_a_full_zone() -> None:
    before = {"s1/0": [(7, 4 * MiB)]}
    after = {"s1/0": [(7, 4 * MiB),  # seen before: not counted
                      (1, 4 * MiB), (1, 4 * MiB),  # one group, 8 MiB: one switch
                      (2, 4 * MiB),  # another group: one switch
                      (1, 40 * MiB), (1, 40 * MiB)],  # 80 MiB of one group: two 64 MiB zones
             "s2/0": [(3, 16 * MiB)]}
    figures = run_figures(before, after, zone=64 * MiB)
    assert figures["zone_switches_16"] == 1 + 1 + 2 + 1
    assert figures["mean_run_mib"] == round(108 / 5, 2)
    assert figures["mean_scheduler_run_mib"] == round(108 / 6, 2)
    assert run_figures(after, after) == {"mean_run_mib": 0.0, "mean_scheduler_run_mib": 0.0,
                                         "zone_switches_16": 0}
