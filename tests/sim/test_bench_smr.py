"""``shinglefs bench smr`` on small sizes: every field, the baselines below ShingleFS."""

from __future__ import annotations

import pytest

from shinglefs.bench import smr

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return smr.run(True, tmp_path_factory.mktemp("smr"), total_bytes=256 * MiB,
                   corpus_bytes=128 * MiB, cluster_sample_bytes=8 * MiB)


def test_every_field_of_the_issue_is_reported(result):
    for key in ("epoch_read_fraction_8", "ckpt_write_fraction_16", "ckpt_write_fraction_64",
                "ckpt_write_fraction_16_uncoalesced", "dmsmr_write_fraction_16",
                "restore_read_fraction", "cluster_100gb_seconds"):
        assert isinstance(result[key], float), key
        assert result[key] > 0, key
    assert set(result["targets_met"]) == set(result["targets"])


def test_coalescing_beats_the_uncoalesced_and_dmsmr_baselines(result):
    assert result["ckpt_write_fraction_16"] > result["ckpt_write_fraction_16_uncoalesced"]
    assert result["ckpt_write_fraction_16"] > result["dmsmr_write_fraction_16"]
    assert result["ckpt_zone_switches_16"] < result["ckpt_zone_switches_16_uncoalesced"]
    # past the media cache the DM-SMR drive falls off its cliff
    assert result["dmsmr_write_fraction_16_100gb"] < result["dmsmr_write_fraction_16"]


def test_fractions_are_fractions(result):
    for key, value in result.items():
        if "fraction" in key and isinstance(value, float):
            assert 0 < value <= 1.001, (key, value)


def test_every_rank_count_has_both_baselines(result):
    for ranks in (1, 4, 16, 64):
        for key in (f"ckpt_write_fraction_{ranks}", f"ckpt_write_fraction_{ranks}_uncoalesced",
                    f"dmsmr_write_fraction_{ranks}"):
            assert 0 < result[key] <= 1.001, key


def test_checkpoint_churn_with_retention_resets_zones_without_copying(result):
    series = result["churn"]
    assert [s["round"] for s in series] == list(range(1, len(series) + 1))
    assert series[-1]["zone_resets"] > 0
    assert all(s["waf"] < 1.01 for s in series)
    assert series[-1]["user_gib"] > series[0]["user_gib"]


def test_without_lifetime_groups_gc_copies_and_amplifies(result):
    grouped, baseline = result["churn"][-1], result["churn_ungrouped"][-1]
    assert baseline["user_gib"] == grouped["user_gib"]
    assert baseline["gc_mib_copied"] > grouped["gc_mib_copied"] == 0
    assert baseline["waf"] > grouped["waf"]


def test_concurrent_readers_pay_for_the_seeks_between_their_files(result):
    # the read path interleaves the readers' extents at the drive; one reader streams
    assert result["epoch_read_fraction_8"] < result["epoch_read_fraction_1"]
    assert result["epoch_read_fraction_8"] <= result["epoch_read_fraction_8_drive_bound"]
    paces = result["epoch_read_fraction_8_by_reader_mib_s"]
    assert paces[str(int(result["epoch_reader_mib_s"]))] == result["epoch_read_fraction_8"]
    assert result["restore_read_fraction_paced"] <= result["restore_read_fraction"]
