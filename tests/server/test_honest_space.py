"""Honest space on a file system on storage servers (issue 10).

Each byte is stored as many times as its goal asks, each copy on a distinct
server, so what can still be written is not the servers' free bytes summed:
``replicated_room`` bounds it (server/space.py), ``statfs`` reports it at the
default goal, and ``write(2)`` says ENOSPC before any server has to refuse a
copy, at the default goal and at a directory's higher one.

Real ``shinglefs server`` processes on loopback with drives of unequal size,
metadata in SQLite.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import random
import time
from pathlib import Path

import pytest
from tests.server.test_server_process import TIMEOUT_S, Server, free_port
from tests.support.polling import wait_until

import shinglefs
from shinglefs.client.commit import drive_for, split_drive_id
from shinglefs.meta.api import DirPolicy, MetaStore
from shinglefs.meta.records import SERVER_TIMEOUT_S
from shinglefs.server.cluster import ClusterNode
from shinglefs.server.errors import NodeFull
from shinglefs.server.process import cluster_key
from shinglefs.server.space import FIGURE_SKEW_NS, SentBytes, fits_replicated, replicated_room

MiB = 1024 * 1024


# ---------------------------------------------------------------------- the bound
def greedy_room(frees: list[int], copies: int) -> int:
    """Units placed one at a time, each on the ``copies`` servers with the most
    left (an independent count of the bound, for small figures)."""
    left = sorted(frees, reverse=True)
    placed = 0
    while len(left) >= copies and left[copies - 1] > 0:
        for i in range(copies):
            left[i] -= 1
        placed += 1
        left.sort(reverse=True)
    return placed


def test_the_bound_is_what_fits_on_distinct_servers_not_the_sum_over_copies() -> None:
    assert replicated_room([10, 1, 1], 2) == 2  # the sum over copies says 6
    assert replicated_room([10, 4], 2) == 4
    assert replicated_room([6, 6, 6], 2) == 9  # equal servers: the sum over copies
    assert replicated_room([10, 10], 3) == 0  # fewer servers than copies
    assert replicated_room([7, -3, 5], 1) == 12  # a negative figure counts as 0
    rng = random.Random(10)
    for _ in range(400):
        frees = [rng.randrange(0, 30) for _ in range(rng.randrange(1, 6))]
        copies = rng.randrange(1, 4)
        assert replicated_room(frees, copies) == greedy_room(frees, copies), (frees, copies)


def test_bytes_of_several_goals_fit_only_as_the_cut_allows() -> None:
    for frees, copies in itertools.product(([10, 1, 1], [9, 7, 3, 1], [5, 5, 5]), (1, 2, 3)):
        room = replicated_room(frees, copies)
        assert fits_replicated(frees, {copies: room})
        assert not fits_replicated(frees, {copies: room + 1})
    # 3 servers of 10: 4 bytes at 3 copies (12) and 6 at 2 (12) fill 24 of 30.
    assert fits_replicated([10, 10, 10], {3: 4, 2: 6})
    assert not fits_replicated([10, 10, 10], {3: 4, 2: 10})  # 12 + 20 > 30
    # Enough bytes in total, but a 3-copy byte needs the small server too.
    assert fits_replicated([20, 20, 1], {2: 10, 3: 1})
    assert not fits_replicated([20, 20, 1], {2: 10, 3: 2})
    assert not fits_replicated([20, 20], {3: 1})
    assert fits_replicated([], {2: 0})


# ---------------------------------------------------------------------- real servers
def start(meta_url: str, tmp_path: Path, servers: list[Server], sizes_mib: list[int],
          meta: MetaStore) -> None:
    """One server per size, each with one emulated drive of that many MiB."""
    for i, size in enumerate(sizes_mib):
        server = Server(meta_url, [f"emulated:{tmp_path}/d{i}.img:{size * MiB}"], free_port())
        server.ready()
        servers.append(server)
    wait_until(lambda: sum(s.live for s in meta.list_servers(TIMEOUT_S)) == len(sizes_mib),
               f"{len(sizes_mib)} servers live")


def server_figures(meta: MetaStore) -> tuple[list[int], list[int]]:
    """``(capacities, frees)`` per live server as its last heartbeat reported."""
    # The clients' own window (a heartbeat late on a loaded machine still counts).
    live = [s for s in meta.list_servers(SERVER_TIMEOUT_S) if s.live]
    return ([sum(d.capacity_bytes for d in s.drives) for s in live],
            [sum(d.free_bytes for d in s.drives) for s in live])


@pytest.mark.parametrize("sizes_mib", [[512, 128], [512, 128, 128]], ids=["2", "3"])
def test_df_reports_what_can_be_written_twice_on_unequal_servers(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        sizes_mib: list[int]) -> None:
    start(meta_url, tmp_path, servers, sizes_mib, meta)
    fs = shinglefs.connect(meta_url)
    try:
        statfs = fs.statvfs()
        capacities, frees = server_figures(meta)  # idle servers: the same heartbeats
    finally:
        fs.close()
    small = sum(sorted(frees)[:-1])  # every byte needs a copy off the big server
    assert sum(frees) // 2 > small  # the old figure (raw sum; even / 2) overstates
    assert statfs.free_bytes == small == replicated_room(frees, 2)
    assert statfs.capacity_bytes == replicated_room(capacities, 2)
    assert statfs.used_bytes == 0  # the files' bytes: none written yet


def test_a_reservation_at_the_default_goal_stops_at_the_bound(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    start(meta_url, tmp_path, servers, [512, 128, 128], meta)
    node = ClusterNode(meta, cluster_key(meta))
    try:
        room = node.stats().free_bytes
        with pytest.raises(NodeFull, match="2 copies"):
            node.reserve(room + 1)
        node.reserve(room)
        with pytest.raises(NodeFull):
            node.reserve(1)
        node.unreserve(room)
        node.reserve(room // 2)
    finally:
        node.close()


def replica_servers_of(meta: MetaStore, fs: shinglefs.ShingleFS, path: str) -> list[list[int]]:
    """The servers of each stored slice of ``path``, as meta records them."""
    ino, size = fs.stat(path).st_ino, fs.stat(path).st_size
    out = []
    for piece in meta.read_map(ino, 0, size):
        if piece.inline is None and piece.slice_id:
            drives = [drive_for(r) for r in meta.get_slice(piece.slice_id).replicas]
            out.append([split_drive_id(d)[0] for d in drives if d is not None])
    return out


def fill(fs: shinglefs.ShingleFS, path: str) -> tuple[int, OSError]:
    """Write 4 MiB blocks to ``path`` until a ``write`` fails, then close it;
    ``(bytes written by the writes that returned, the write's error)``."""
    block = os.urandom(4 * MiB)
    written = 0
    with fs.open(path, "wb", buffering=0) as f:  # each write one write(2)
        for _ in range(1000):
            try:
                f.write(block)
            except OSError as exc:
                return written, exc
            written += len(block)
    raise AssertionError(f"{written} bytes written and no ENOSPC")


def check_filled(meta: MetaStore, meta_url: str, path: str, goal: int, room: int,
                 written: int, error: OSError, caplog: pytest.LogCaptureFixture) -> None:
    """write() said ENOSPC, and every slice kept its ``goal`` copies on distinct
    servers: no server refused one (a refused copy is dropped with a warning and
    the slice goes on below its goal)."""
    assert error.errno == errno.ENOSPC
    fs = shinglefs.connect(meta_url)
    try:
        placed = replica_servers_of(meta, fs, path)
        assert fs.stat(path).st_size == written
    finally:
        fs.close()
    # Not far too early either (space.FIGURE_SKEW_NS: early by what a drive
    # stores in 0.25 s; the drives' figures keep a margin: they take more).
    assert written >= room // 2, (written, room)
    assert not [r for r in caplog.records if "replica of slice" in r.getMessage()]
    assert placed and all(len(set(s)) == len(s) == goal for s in placed), placed


def test_filling_at_goal_2_is_enospc_from_write_before_a_server_refuses(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        caplog: pytest.LogCaptureFixture) -> None:
    start(meta_url, tmp_path, servers, [512, 128, 128], meta)
    caplog.set_level(logging.WARNING, logger="shinglefs.server.cluster")
    fs = shinglefs.connect(meta_url)
    try:
        room = fs.statvfs().free_bytes
        written, error = fill(fs, "/big.bin")
    finally:
        fs.close()
    check_filled(meta, meta_url, "/big.bin", 2, room, written, error, caplog)


def test_a_directory_s_higher_goal_is_reserved_at_that_goal(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        caplog: pytest.LogCaptureFixture) -> None:
    start(meta_url, tmp_path, servers, [128, 128, 128], meta)
    caplog.set_level(logging.WARNING, logger="shinglefs.server.cluster")
    fs = shinglefs.connect(meta_url)
    try:
        fs.makedirs("/three/deeper")
        meta.set_policy(fs.stat("/three").st_ino, DirPolicy(replicas=3))
        _, frees = server_figures(meta)
        room = replicated_room(frees, 3)  # two thirds of what fits at goal 2
        assert replicated_room(frees, 2) > room
        written, error = fill(fs, "/three/deeper/big.bin")
    finally:
        fs.close()
    check_filled(meta, meta_url, "/three/deeper/big.bin", 3, room, written, error, caplog)


def test_placement_still_picks_a_drive_when_every_figure_is_overdrawn() -> None:
    """Submitted bytes since the last heartbeat can exceed every drive's figure
    (other goals, other clients): the freest is then the least overdrawn."""
    from shinglefs.server.cluster import _freest

    frees = {1: -100, 2: -95, 3: -300}
    picks = {_freest(frees.__getitem__, list(frees)) for _ in range(50)}
    assert picks and picks <= {1, 2}


def test_bytes_stored_after_a_heartbeat_stay_counted_until_a_later_one() -> None:
    """A membership read brings figures as of each server's heartbeat: a piece
    stored after it is not in them and must stay counted (it was reset to 0 at
    every read, and a server refused a copy the reservation had admitted)."""
    sent = SentBytes()
    sent.sent(1, 10, reserved=False)  # a piece no reservation holds: counted at once
    sent.sent(1, 5, reserved=True)  # its writer's hold counts it until it is answered
    assert sent.since(1) == 10
    before = time.time_ns()
    sent.done(1, 10, False)
    sent.done(1, 5, True)
    after = time.time_ns()
    assert sent.since(1) == 15
    sent.figures_read({1: before - 10**9})  # a heartbeat from before they were stored
    assert sent.since(1) == 15
    sent.figures_read({1: before + FIGURE_SKEW_NS - 1})  # within the skew: maybe not in it
    assert sent.since(1) == 15
    sent.figures_read({1: after + FIGURE_SKEW_NS})
    assert sent.since(1) == 0
    sent.sent(2, 7, reserved=False)
    sent.figures_read({2: after + 10**10})  # in flight: in no figure, whatever its age
    assert sent.since(2) == 7 and sent.since(1) == 0


def test_placement_counts_the_reserved_bytes_in_flight_to_each_drive() -> None:
    """Admission counts a reserved piece in its writer's hold, so ``since`` leaves
    it out; placement must not: the hold says how much is coming, not to which
    drive. (Placement subtracted ``since`` alone: a fill at goal 2 put slice after
    slice on the small server that looked freest until it refused copies, in
    about one run in four of the fill test above.)"""
    sent = SentBytes()
    sent.sent(1, 30, reserved=True)
    sent.sent(1, 4, reserved=False)
    assert (sent.since(1), sent.headed_for(1)) == (4, 34)
    sent.done(1, 30, True)  # answered: stored, in since until a later figure holds it
    assert (sent.since(1), sent.headed_for(1)) == (34, 34)
    sent.done(1, 4, False)
    sent.figures_read({1: time.time_ns() + FIGURE_SKEW_NS + 1})
    assert (sent.since(1), sent.headed_for(1)) == (0, 0)
