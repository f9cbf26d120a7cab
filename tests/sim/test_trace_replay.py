"""Traces our drives record, written to a file, read back and replayed (``shinglefs sim replay``)."""

from __future__ import annotations

import json

import pytest
from tests.sim.clikit import sim_app as _app
from typer.testing import CliRunner

from shinglefs.errors import UsageError
from shinglefs.sim import hc620
from shinglefs.sim.tracefile import Trace, read_trace, write_trace
from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive

MiB = 1024 * 1024


@pytest.fixture
def recorded(tmp_path):
    drive = EmulatedZonedDrive.create(str(tmp_path / "d.drive"), zone_size=32 * MiB,
                                      zone_count=16, conventional_zones=2)
    store = SliceStore.format(drive, gc_background=False)
    try:
        drive.start_trace()
        data = bytes(range(256)) * 4096  # 1 MiB
        for sid in range(16):
            store.submit(sid, 0, data, group=sid % 2).result()
        store.flush()
        buf = bytearray(MiB)
        for sid in range(16):
            store.readinto(sid, 0, buf)
        trace = Trace.of(drive, drive.stop_trace())
    finally:
        store.close()
        drive.close_drive()
    return trace


def test_a_recorded_trace_round_trips_through_the_file(recorded, tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(recorded, path)
    back = read_trace(path)
    assert back.records == recorded.records
    assert back.zone_size == 32 * MiB and back.zone_count == 16
    assert any(r.op == "write" for r in back.records)
    assert any(r.op == "read" for r in back.records)


def test_replaying_a_recorded_trace_models_the_bytes_the_drive_saw(recorded):
    r = hc620().replay(recorded.records, zone_size=recorded.zone_size)
    written = sum(x.length for x in recorded.records if x.op == "write")
    assert r.bytes_written == written >= 16 * MiB
    assert r.bytes_read >= 16 * MiB
    assert 0 < r.seconds < 5


def test_sim_replay_command_prints_json_for_every_model(recorded, tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(recorded, path)
    out = CliRunner().invoke(_app(), ["sim", "replay", str(path), "--model", "all", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert set(doc["models"]) == {"hc620", "dmsmr", "cmr", "flash"}
    assert doc["models"]["hc620"]["bytes_written"] > 0
    assert doc["models"]["flash"]["seconds"] < doc["models"]["hc620"]["seconds"]


def test_a_malformed_trace_is_a_usage_error_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"op": "write", "zone": 1, "offset": 0, "length": 4096}\nnot json\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2"):
        read_trace(path)


def test_an_unknown_model_is_a_usage_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("")
    out = CliRunner().invoke(_app(), ["sim", "replay", str(path), "--model", "tape"])
    assert isinstance(out.exception, UsageError)


def test_size_prints_drives_cost_and_the_seed_claim_with_its_prices(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text('{"drive_usd": 450, "nvme_usd_per_tb_month": 120}')
    out = CliRunner().invoke(_app(), ["size", "--dataset", "200TB", "--checkpoint", "100GB",
                                      "--every", "1000", "--steps-per-hour", "600", "--keep", "5",
                                      "--price-file", str(prices), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["drives"] == 15  # 200.6 TB / (15 TB x 0.9)
    assert doc["prices"]["drive_usd"] == 450
    assert doc["monthly_usd"]["drives"] == pytest.approx(15 * 450 / 60)
    assert doc["checkpoint_seconds"] > 0
    assert "80 TB" in doc["seed_claim"]["claim"]
    text = CliRunner().invoke(_app(), ["size", "--dataset", "200TB", "--checkpoint", "100GB"])
    assert "seed claim" in text.output and "prices:" in text.output


def test_size_refuses_an_unknown_price(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text('{"tape_usd": 1}')
    out = CliRunner().invoke(_app(), ["size", "--dataset", "1TB", "--checkpoint", "1GB",
                                      "--price-file", str(prices)])
    assert isinstance(out.exception, UsageError)


def test_size_takes_any_printed_assumption_from_the_file_and_flags_win(tmp_path):
    given = tmp_path / "assumptions.json"
    given.write_text(json.dumps({"fill_fraction": 0.5, "write_amplification": 1.2,
                                 "node_gbit": 100, "drive_usd": 450, "cmr_drive_usd": 999}))
    out = CliRunner().invoke(_app(), ["size", "--dataset", "200TB", "--checkpoint", "100GB",
                                      "--price-file", str(given), "--drive-usd", "200", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["drives"] == 27  # 200.6 TB / (15 TB x 0.5)
    assert doc["expected_write_amplification"] == 1.2
    assert doc["cluster"]["node_gbit"] == 100
    assert doc["prices"]["drive_usd"] == 200  # the flag over the file
    assert doc["prices"]["cmr_drive_usd"] == 999
    assert doc["seed_claim"]["holds"] is True
    # every key the command prints is one the file may set back
    keys = {**doc["prices"], **doc["assumptions"], **doc["cluster"]}
    keys.pop("nodes"), keys.pop("drives_per_node")  # these follow from the sizing
    given.write_text(json.dumps(keys))
    again = CliRunner().invoke(_app(), ["size", "--dataset", "200TB", "--checkpoint", "100GB",
                                        "--price-file", str(given), "--json"])
    assert again.exit_code == 0, again.output
