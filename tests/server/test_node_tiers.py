"""Placement by tier on one storage node: a lifetime group whose directory sets
a tier (``StorageNode.tier_of``) goes to that tier's drives while one has
room, and spills to the others rather than fail (docs/cluster.md, "Tiers")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.server.node import StorageNode, drive_tier

MiB = 1024 * 1024
GiB = 1024 * MiB
TIERS = {10: "hot", 11: "cold"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StorageNode]:
    """Drives 0 and 1 SMR (cold, 2 GiB), drive 2 conventional (hot, 1 GiB)."""
    specs = [(0, f"emulated:{tmp_path}/s0.img:{2 * GiB}"),
             (1, f"emulated:{tmp_path}/s1.img:{2 * GiB}"),
             (2, f"conventional:{tmp_path}/c.img:{GiB}")]
    n = StorageNode.open(specs, create=True, zone_size=64 * MiB)
    yield n
    n.close()


def test_drive_tiers_by_kind() -> None:
    assert drive_tier("conventional:/x:1G") == "hot" == drive_tier("flash:/x:1G")
    assert drive_tier("cmr:/x:1G") == "hot"
    assert drive_tier("emulated:/x:1G") == "cold" == drive_tier("linux:/dev/sda")
    assert drive_tier("smr:/x:1G") == "cold" == drive_tier("zoned:/dev/sdb")
    assert drive_tier("drive0") is None


def test_a_groups_tier_chooses_its_drives(node: StorageNode) -> None:
    node.tier_of = TIERS.get
    assert node.write(1, 0, b"h" * MiB, group=10) == 2
    assert node.write(2, 0, b"h" * MiB, group=10) == 2
    assert node.write(3, 0, b"c" * MiB, group=11) in (0, 1)
    node.refresh_stats()
    # The conventional drive has the least room; only its tier brings slices there.
    assert all(node.place(100 + g, g) in (0, 1) for g in range(20, 30))


def test_a_tier_set_later_wins_over_the_groups_last_drive(node: StorageNode) -> None:
    first = node.write(1, 0, b"x" * MiB, group=10)  # no tier yet: the freest SMR drive
    assert first in (0, 1)
    node.tier_of = TIERS.get
    assert node.write(2, 0, b"x" * MiB, group=10) == 2


def test_a_full_tier_spills_to_the_other(node: StorageNode) -> None:
    node.tier_of = TIERS.get
    assert node.place(1, 10, size_hint=GiB + 256 * MiB) in (0, 1)  # larger than the hot drive
    assert node.place(2, 10, size_hint=MiB) == 2


def test_a_failed_lookup_places_anyway_and_one_tier_asks_nothing(node: StorageNode,
                                                                  tmp_path: Path) -> None:
    def broken(group: int) -> str | None:
        raise ConnectionError("meta is down")

    node.tier_of = broken
    assert node.write(1, 0, b"x" * MiB, group=10) in (0, 1, 2)
    asked: list[int] = []
    with StorageNode.open([(0, f"emulated:{tmp_path}/only.img:{2 * GiB}")], create=True,
                          zone_size=64 * MiB) as single:
        single.tier_of = lambda group: asked.append(group) or "hot"
        assert single.write(1, 0, b"x" * MiB, group=10) == 0
    assert asked == []  # nothing to choose between: no lookup on the write path


def test_a_tier_uses_any_of_its_drives_with_room_before_spilling(tmp_path: Path) -> None:
    """Two hot drives: the emptier one has no room for the slice, the smaller
    one has: the slice goes to the smaller hot drive, not to the cold one."""
    specs = [(0, f"conventional:{tmp_path}/a.img:{4 * GiB}"),
             (1, f"conventional:{tmp_path}/b.img:{GiB}"),
             (2, f"emulated:{tmp_path}/c.img:{3 * GiB}")]
    with StorageNode.open(specs, create=True, zone_size=64 * MiB,
                          min_free_fraction=0.5) as node:
        node.tier_of = TIERS.get
        assert node.place(1, 99, size_hint=2 * GiB) == 0  # untiered: the freest, now half full
        assert node.place(2, 10, size_hint=256 * MiB) == 1


def test_a_full_tier_spills_to_the_other_tier_not_back_to_itself(tmp_path: Path) -> None:
    """The hot drive still has the most free bytes but no room for the slice:
    it goes to the cold drive."""
    specs = [(0, f"conventional:{tmp_path}/a.img:{8 * GiB}"),
             (1, f"emulated:{tmp_path}/c.img:{2 * GiB}")]
    with StorageNode.open(specs, create=True, zone_size=64 * MiB,
                          min_free_fraction=0.5) as node:
        node.tier_of = TIERS.get
        assert node.place(1, 99, size_hint=int(4.5 * GiB)) == 0
        assert node.place(2, 10, size_hint=64 * MiB) == 1


def test_a_tier_lookup_remembers_a_failure_as_no_tier(tmp_path: Path) -> None:
    """Meta unreachable: the first lookup raises (the node places anywhere),
    the next ones within the TTL answer "no tier" without asking again."""
    from shinglefs.client.filesystem import format_filesystem
    from shinglefs.meta import open_meta
    from shinglefs.meta.errors import MetaUnavailable
    from shinglefs.server.tiers import TierLookup

    url = f"sqlite3://{tmp_path / 'm.db'}"
    format_filesystem(url, [f"emulated:{tmp_path}/d.img:{2 * GiB}"])
    meta = open_meta(url)
    lookup = TierLookup(meta, ttl_s=60)
    assert lookup(1) is None and lookup.known(1)
    meta.close()
    with pytest.raises(MetaUnavailable):  # closed: as a database that went away
        lookup(2)
    assert lookup.known(2) and lookup(2) is None
