"""Read-ahead across the network (server/cluster_reads.py): a client of storage
servers sends the READs of the runs its read cache reads ahead at once; what
lands is bit-exact, bounded, dropped with its slice, and a server that fails
during read-ahead costs a read nothing but its failover."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.server.test_cluster_node import live_count, slices_of, start_server
from tests.server.test_server_process import TIMEOUT_S, Server
from tests.support.polling import wait_until

import shinglefs
from shinglefs.client.commit import split_drive_id
from shinglefs.meta.api import MetaStore
from shinglefs.server.cluster import ClusterNode
from shinglefs.server.errors import SliceMissing
from shinglefs.server.process import cluster_key

MiB = 1024 * 1024


def write_file(meta_url: str, meta: MetaStore, path: str, data: bytes) -> list[tuple[int, int]]:
    """Write ``path`` through a client; its slices' ``(slice id, first replica's drive)``."""
    fs = shinglefs.connect(meta_url)
    try:
        fs.write_bytes(path, data)
        return slices_of(meta, fs, path)
    finally:
        fs.close()


def test_read_ahead_is_bit_exact_and_bounded(tmp_path: Path, meta_url: str, meta: MetaStore,
                                             servers: list[Server]) -> None:
    start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "one server live")
    data = os.urandom(16 * MiB)
    (slice_id, _), *_ = write_file(meta_url, meta, "/ahead.bin", data)
    node = ClusterNode(meta, cluster_key(meta), readahead_bytes=8 * MiB)
    try:
        node.prefetch(slice_id, 0, 16 * MiB)  # four pieces asked, two fit
        assert node.readahead_bytes == 8 * MiB
        first = node.read_view(slice_id, 0, 4 * MiB)
        assert node.readahead_bytes == 4 * MiB  # taken: the reader holds it now
        assert first == data[:4 * MiB]
        assert node.read_view(slice_id, 4 * MiB, 4 * MiB) == data[4 * MiB:8 * MiB]
        assert node.readahead_bytes == 0
        # not read ahead (did not fit): read on demand
        assert node.read_view(slice_id, 8 * MiB, 8 * MiB) == data[8 * MiB:]
        # read ahead again, more than fits: the bound kept
        node.prefetch(slice_id, 0, 8 * MiB)
        node.prefetch(slice_id, 8 * MiB, 8 * MiB)
        assert node.readahead_bytes <= 8 * MiB
        assert node.read_view(slice_id, 12 * MiB, 4 * MiB) == data[12 * MiB:]
        # a piece read ahead serves only its own offset, at most its length
        assert node.read_view(slice_id, 8 * MiB + 5, 100) == data[8 * MiB + 5:8 * MiB + 105]
    finally:
        node.close()
    assert node.readahead_bytes == 0


def test_a_whole_file_reads_bit_exact_through_read_ahead(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """Through a client (its read cache hints runs; ClusterNode sends them ahead),
    several files read at once, and a file whose last piece is short."""
    start_server(meta_url, tmp_path, "s1", servers)
    start_server(meta_url, tmp_path, "s2", servers)
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    files = {f"/f{i}": os.urandom(24 * MiB + 4097 * i) for i in range(3)}
    fs = shinglefs.connect(meta_url)
    try:
        for path, data in files.items():
            fs.write_bytes(path, data)
    finally:
        fs.close()
    fs = shinglefs.connect(meta_url)
    try:
        handles = {path: fs.open(path, "rb", buffering=0) for path in files}
        got = {path: bytearray() for path in files}
        while any(len(got[p]) < len(files[p]) for p in files):
            for path, f in handles.items():
                got[path] += f.read(MiB)
        for f in handles.values():
            f.close()
        assert got == files
    finally:
        fs.close()


def test_a_deleted_slice_is_not_served_from_read_ahead(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    start_server(meta_url, tmp_path, "s1", servers)
    wait_until(lambda: live_count(meta) == 1, "one server live")
    data = os.urandom(8 * MiB)
    (slice_id, drive), *_ = write_file(meta_url, meta, "/gone.bin", data)
    node = ClusterNode(meta, cluster_key(meta))
    try:
        node.prefetch(slice_id, 0, 8 * MiB)
        assert node.readahead_bytes == 8 * MiB
        node.delete(slice_id, drive)
        assert node.readahead_bytes == 0
        try:
            node.read_view(slice_id, 0, 4 * MiB)
        except SliceMissing:
            pass
        else:
            raise AssertionError("a deleted slice was read")
    finally:
        node.close()


def test_a_server_hung_during_read_ahead_fails_over(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server]) -> None:
    """The READs sent ahead went to a server that then answers nothing: the
    read waits for them ``failover_after_s``, then fails over like any read."""
    by_port = {}
    for name in ("s1", "s2"):
        server, port = start_server(meta_url, tmp_path, name, servers)
        by_port[port] = server
    wait_until(lambda: live_count(meta) == 2, "two servers live")
    data = os.urandom(12 * MiB)
    (slice_id, drive), *_ = write_file(meta_url, meta, "/hang.bin", data)
    assert len(meta.get_slice(slice_id).replicas) == 2
    server_id = split_drive_id(drive)[0]
    address = next(r.address for r in meta.list_servers(TIMEOUT_S) if r.id == server_id)
    hung = by_port[int(address.rsplit(":", 1)[1])]
    node = ClusterNode(meta, cluster_key(meta), failover_after_s=0.5)
    try:
        assert node.read_view(slice_id, 0, 1) == data[:1]  # connected to the first
        os.kill(hung.proc.pid, signal.SIGSTOP)
        try:
            node.prefetch(slice_id, 0, 12 * MiB)  # sent to the server now hung
            for off in range(0, 12 * MiB, 4 * MiB):
                assert node.read_view(slice_id, off, 4 * MiB) == data[off:off + 4 * MiB]
        finally:
            os.kill(hung.proc.pid, signal.SIGCONT)
    finally:
        node.close()
