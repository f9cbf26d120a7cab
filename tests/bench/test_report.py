"""``shinglefs bench report``: docs/benchmarks.md from the benchmarks' JSON files."""

from __future__ import annotations

import json
import re

import pytest
import typer
from tests.sim.test_plots import PNG, RESULT
from typer.testing import CliRunner

from shinglefs.bench.report import ReportInputError, write_report
from shinglefs.cli import bench as bench_cli
from shinglefs.errors import UsageError

SMR = {**RESULT, "epoch_read_fraction_8": 0.84, "ckpt_write_fraction_16": 0.96,
       "ckpt_write_fraction_64": 0.88, "restore_read_fraction": 0.9,
       "cluster_100gb_seconds": 35.0, "quick": True, "host": "vm",
       "targets": {"ckpt_write_fraction_16": 0.95, "ckpt_write_fraction_64": 0.9,
                   "epoch_read_fraction_8": 0.85, "restore_read_fraction": 0.85,
                   "cluster_100gb_seconds": 72}}
META = {"quick": True, "target_create_per_s": 5000, "sqlite": {"create_per_s": 6100.5}}


def app() -> typer.Typer:
    a = typer.Typer()

    @a.callback()
    def _root() -> None:
        pass

    bench_cli.register(a)
    return a


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "data").mkdir()
    smr, meta = tmp_path / "data" / "smr.json", tmp_path / "data" / "meta.json"
    smr.write_text(json.dumps(SMR))
    meta.write_text(json.dumps(META))
    return [smr, meta]


def row(text: str, field: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("|") and f"`{field}`" in line)


def test_the_report_tables_every_target_met_or_missed(inputs, tmp_path):
    out = tmp_path / "docs" / "benchmarks.md"
    written = write_report(inputs, out, tmp_path / "docs" / "img")
    text = out.read_text()
    assert written[-1] == out
    targets = text[text.index("## Targets"):text.index("## `shinglefs bench")]
    assert "| met |" in row(targets, "ckpt_write_fraction_16")
    assert "**missed**" in row(targets, "ckpt_write_fraction_64")
    assert "**missed**" in row(targets, "epoch_read_fraction_8")
    assert "<= 72" in row(targets, "cluster_100gb_seconds")
    assert "| met |" in row(targets, "cluster_100gb_seconds")
    assert ">= 5,000" in row(targets, "sqlite.create_per_s")
    assert text.index("## `shinglefs bench meta`") < text.index("## `shinglefs bench smr`")


def test_every_plot_is_written_linked_and_captioned(inputs, tmp_path):
    out = tmp_path / "docs" / "benchmarks.md"
    written = write_report(inputs, out, tmp_path / "docs" / "img")
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(links) == sorted(f"img/{p.name}" for p in written[:-1])
    assert len(links) == 6
    for link in links:
        assert (out.parent / link).read_bytes()[:8] == PNG
        caption = text[text.index(link):].splitlines()[2]
        assert caption.startswith("*") and len(caption) > 40, caption


def test_a_bench_all_file_holds_every_benchmark(tmp_path):
    both = tmp_path / "bench.json"
    both.write_text(json.dumps({"smr": SMR, "meta": META}))
    out = tmp_path / "report.md"
    write_report([both], out, tmp_path / "img")
    text = out.read_text()
    assert "## `shinglefs bench smr`" in text and "## `shinglefs bench meta`" in text


def test_a_bad_input_writes_nothing(inputs, tmp_path):
    bad = tmp_path / "data" / "mount.json"
    bad.write_text("{ not json")
    out = tmp_path / "report.md"
    with pytest.raises(ReportInputError, match=r"mount\.json"):
        write_report([*inputs, bad], out, tmp_path / "img")
    assert not out.exists() and not (tmp_path / "img").exists()


def test_the_command_writes_the_report_and_its_images(inputs, tmp_path):
    out = tmp_path / "docs" / "benchmarks.md"
    res = CliRunner().invoke(app(), ["bench", "report", *map(str, inputs), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "docs" / "img" / "smr-epoch-reads.png").exists()
    assert str(out) in res.output


def test_report_without_files_and_a_benchmark_with_files_are_usage_errors(inputs):
    res = CliRunner().invoke(app(), ["bench", "report"])
    assert isinstance(res.exception, UsageError)
    res = CliRunner().invoke(app(), ["bench", "smr", str(inputs[0])])
    assert isinstance(res.exception, UsageError)
