"""The cluster model (real node placement and schedulers on a sample) and 5 PB sizing."""

from __future__ import annotations

import pytest

from shinglefs.sim import cluster
from shinglefs.sim.sizing import SizingAssumptions, size_cluster

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def sampler(tmp_path_factory):
    return cluster.NodeSampler(tmp_path_factory.mktemp("cluster"), sample_per_stream=16 * MiB)


def test_the_headline_checkpoint_is_drive_bound_and_within_the_claim(sampler):
    e = cluster.estimate(cluster.ClusterSpec(), cluster.HEADLINE_BYTES, sampler)
    assert e.bottleneck == "drives"
    assert e.streams_per_node == 8
    assert 0.85 <= e.drive_fraction <= 1.0
    # 100 GB / 12 drives at ~235 MiB/s is ~34 s before losses
    assert 33 <= e.seconds <= 72


def test_time_halves_with_twice_the_nodes_or_drives_and_doubles_with_two_replicas(sampler):
    base = cluster.estimate(cluster.ClusterSpec(), cluster.HEADLINE_BYTES, sampler).seconds
    more_nodes = cluster.estimate(cluster.ClusterSpec(nodes=24), cluster.HEADLINE_BYTES, sampler)
    more_drives = cluster.estimate(cluster.ClusterSpec(drives_per_node=2),
                                   cluster.HEADLINE_BYTES, sampler)
    replicas = cluster.estimate(cluster.ClusterSpec(replicas=2), cluster.HEADLINE_BYTES, sampler)
    assert more_nodes.seconds == pytest.approx(base / 2, rel=0.15)
    assert more_drives.seconds == pytest.approx(base / 2, rel=0.15)
    assert replicas.seconds == pytest.approx(base * 2, rel=0.15)


def test_a_slow_network_becomes_the_bottleneck(sampler):
    e = cluster.estimate(cluster.ClusterSpec(node_gbit=1.0), cluster.HEADLINE_BYTES, sampler)
    assert e.bottleneck == "node network"
    assert e.seconds == pytest.approx(100e9 / 12 / (1e9 / 8 * 0.94) + 0.05, rel=0.01)


def test_5pb_sizing_counts_drives_zones_rows_and_index_memory():
    s = size_cluster(5 * 10**15)
    assert s["drives"] == 371  # 5 PB / (15.0 TB x 0.9)
    assert s["zones"] == 371 * 55_880
    assert s["files"] == pytest.approx(5e15 / (64 * MiB), rel=1e-6)
    assert s["metadata_rows"] == 6 * s["files"]  # inode, dentry, chunk, ref, slice, replica
    assert s["index_mib_per_server"] == pytest.approx(s["index_mib_per_drive"] * 24, rel=0.01)
    two = size_cluster(5 * 10**15, SizingAssumptions(replicas=2))
    assert two["drives"] == pytest.approx(2 * s["drives"], abs=1)
