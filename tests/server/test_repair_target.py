"""Where re-replication puts a copy (``repair._target``): racks first, then the
slice's tier when one of its drives has room, else the freest drive."""

from __future__ import annotations

import pytest

from shinglefs.meta.api import Replica, ServerDrive, ServerRecord
from shinglefs.server.repair import _target


def server(sid: int, *drives: tuple[str, int], rack: str | None = None) -> ServerRecord:
    """A live server with drives ``(tier, free bytes)``, numbered from 0."""
    return ServerRecord(sid, f"127.0.0.1:{sid}", {"rack": rack} if rack else {},
                        tuple(ServerDrive(i, f"d{i}", None, tier, 1000, free)
                              for i, (tier, free) in enumerate(drives)), 0, 0, 0, True)


HOLDER = server(1, ("hot", 500))
HEALTHY = [Replica("1", "0")]


def where(servers: list[ServerRecord], tier: str | None, length: int,
          offline: frozenset[tuple[str, str]] = frozenset()) -> tuple[int, int] | None:
    chosen = _target(HEALTHY, servers, servers, offline, tier, length)
    return None if chosen is None else (chosen[0].id, chosen[1])


@pytest.mark.parametrize("length", [0, 1, 100])
def test_a_drive_of_the_tier_with_room_wins_over_a_freer_one(length: int) -> None:
    other = server(2, ("cold", 900), ("hot", 200))
    assert where([HOLDER, other], "hot", length) == (2, 1)
    assert where([HOLDER, other], None, length) == (2, 0)  # no tier: the freest


@pytest.mark.parametrize("length", [0, 10])
def test_a_full_tier_spills_to_the_freest_drive_even_for_an_empty_slice(length: int) -> None:
    other = server(2, ("hot", 0), ("cold", 900))
    assert where([HOLDER, other], "hot", length) == (2, 1)


def test_too_little_room_on_the_tier_spills_and_offline_drives_are_skipped() -> None:
    other = server(2, ("hot", 50), ("cold", 900))
    assert where([HOLDER, other], "hot", 100) == (2, 1)
    roomy = server(2, ("hot", 500), ("cold", 900))
    assert where([HOLDER, roomy], "hot", 100, frozenset({("2", "0")})) == (2, 1)


def test_another_rack_comes_before_the_tier() -> None:
    holder = server(1, ("hot", 500), rack="a")
    same_rack_hot = server(2, ("hot", 900), rack="a")
    other_rack_cold = server(3, ("cold", 100), rack="b")
    chosen = _target(HEALTHY, [holder, same_rack_hot, other_rack_cold],
                     [holder, same_rack_hot, other_rack_cold], set(), "hot", 10)
    assert chosen is not None and (chosen[0].id, chosen[1]) == (3, 0)
