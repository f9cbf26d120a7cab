"""``shinglefs sim plots``: PNG files from a benchmark result, each claim beside its baseline."""

from __future__ import annotations

import json

from tests.sim.clikit import sim_app as _app
from typer.testing import CliRunner

from shinglefs.errors import UsageError
from shinglefs.sim.plots import write_plots

RESULT = {
    **{f"epoch_read_fraction_{n}": 0.97 - 0.01 * n for n in (1, 4, 8)},
    **{f"epoch_read_fraction_{n}_drive_bound": 0.97 for n in (1, 4, 8)},
    **{f"ckpt_write_fraction_{n}": 0.96 for n in (1, 4, 16, 64)},
    **{f"ckpt_write_fraction_{n}_uncoalesced": 0.6 for n in (1, 4, 16, 64)},
    **{f"dmsmr_write_fraction_{n}": 0.5 for n in (1, 4, 16, 64)},
    "churn": [{"round": i, "user_gib": i * 0.2, "waf": 1.0004, "gc_mib_copied": 0.0,
               "zone_resets": 3 * i, "modeled_mib_s": 220.0} for i in range(1, 5)],
    "churn_ungrouped": [{"round": i, "user_gib": i * 0.2, "waf": 1.0 + 0.02 * i,
                         "gc_mib_copied": 30.0 * i, "zone_resets": i, "modeled_mib_s": 215.0}
                        for i in range(1, 5)],
    "cluster_scaling": [{"nodes": n, "drives_per_node": d, "ranks": 96, "replicas": 1,
                         "seconds": 420 / (n * d), "bottleneck": "drives", "drive_fraction": 0.96}
                        for n, d in ((4, 1), (8, 1), (12, 1), (12, 2), (24, 1))],
    "tier_usd_per_tb_month": {"HM-SMR (ShingleFS)": 4.3, "managed NVMe": 100.0},
}

PNG = b"\x89PNG\r\n\x1a\n"


def test_every_plot_is_a_png(tmp_path):
    paths = write_plots(RESULT, tmp_path)
    assert {p.name for p in paths} == {"smr-epoch-reads.png", "smr-checkpoint.png",
                                       "smr-churn-waf.png", "smr-churn-gc.png",
                                       "smr-cluster.png", "smr-cost.png"}
    for p in paths:
        assert p.read_bytes()[:8] == PNG


def test_plots_command_writes_every_png(tmp_path):
    result = tmp_path / "bench.json"
    result.write_text(json.dumps({"smr": RESULT}))
    out = CliRunner().invoke(_app(), ["sim", "plots", str(result), "--out", str(tmp_path / "img")])
    assert out.exit_code == 0, out.output
    assert len(list((tmp_path / "img").glob("smr-*.png"))) == 6
    assert "smr-checkpoint.png" in out.output


def test_plots_refuses_a_result_without_smr(tmp_path):
    result = tmp_path / "bench.json"
    result.write_text(json.dumps({"store": {}}))
    out = CliRunner().invoke(_app(), ["sim", "plots", str(result)])
    assert isinstance(out.exception, UsageError)
