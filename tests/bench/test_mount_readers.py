"""``shinglefs bench mount``'s concurrent readers: the measuring function on real
files, and the fields and target it reports (``read_scaling_8`` >= 1.0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shinglefs.bench import mount
from shinglefs.bench.report import declared_targets

MiB = 1024 * 1024


def test_concurrent_read_reads_every_file_whole(tmp_path: Path) -> None:
    paths = mount._write_reader_files(tmp_path / "readers", 3, 2 * MiB)
    assert [p.stat().st_size for p in paths] == [2 * MiB] * 3
    assert len({p.read_bytes()[:64] for p in paths}) == 3  # each file its own bytes
    assert mount._concurrent_read(paths) > 0


def test_concurrent_read_fails_when_a_reader_fails(tmp_path: Path) -> None:
    paths = mount._write_reader_files(tmp_path / "readers", 2, MiB)
    with pytest.raises(RuntimeError, match="1 concurrent reader"):
        mount._concurrent_read([*paths, tmp_path / "missing"])


def test_report_states_read_scaling_and_its_target() -> None:
    plan = mount.Plan.of(True, 3)
    figures = {k: [100.0, 100.0, 100.0] for k in mount.FIGURES}
    figures["read_1"] = [400.0, 300.0, 500.0]
    figures["read_8"] = [200.0, 330.0, 600.0]  # per round: 0.5, 1.1, 1.2
    figures["floor_read_1"] = [1000.0, 1000.0, 1000.0]
    figures["floor_read_8"] = [1400.0, 1300.0, 1350.0]
    result = mount._report(plan, figures, True, {"daemon_rss_peak_mib": 500.0})
    assert result["read_mib_s_1"] == 400.0 and result["read_mib_s_8"] == 330.0
    assert result["read_scaling_8"] == 1.1  # the median of the paired ratios
    assert result["floor_read_scaling_8"] == 1.35
    assert result["local_read_scaling_8"] == 1.0
    assert result["reader_bytes"] == 64 * MiB
    assert result["targets_met"]["read_scaling_8"] is True
    assert result["floor_targets_met"]["read_scaling_8"] is True
    assert declared_targets("mount", result)["read_scaling_8"] == (">=", 1.0)
    figures["read_8"] = [200.0, 200.0, 200.0]
    assert mount._report(plan, figures, True, {"daemon_rss_peak_mib": 500.0})[
        "targets_met"]["read_scaling_8"] is False
