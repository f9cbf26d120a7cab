"""Differential test: random write/append/truncate/read/flush/fsync/reopen/compact sequences on the
VFS against a bytearray model. Small chunks and pieces so chunk ends, streamed pieces,
overlays and holes all occur within a megabyte."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsfixtures import drive_specs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import format_filesystem, open_filesystem
from shinglefs.client.vfs import VFS, SetAttrChanges
from shinglefs.meta.api import ROOT_CTX, ROOT_INO

KiB = 1024
CHUNK = 256 * KiB
LIMIT = 4 * CHUNK + 1000

_names = itertools.count()


@pytest.fixture(scope="module")
def small_vfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VFS]:
    root: Path = tmp_path_factory.mktemp("differential")
    url = f"sqlite3://{root}/meta.db"
    format_filesystem(url, drive_specs(root, 1), chunk_size=CHUNK)
    config = ClientConfig(
        piece_size=16 * KiB,
        file_buffer_bytes=64 * KiB,
        read_extent=32 * KiB,
        readahead_bytes=128 * KiB,
        compaction=False,
    )
    vfs = open_filesystem(url, config=config)
    yield vfs
    vfs.shutdown()


offsets = st.integers(0, LIMIT)
op = st.one_of(
    st.tuples(st.just("write"), offsets, st.integers(1, 70 * KiB), st.integers(0, 255)),
    st.tuples(st.just("append"), st.integers(1, 40 * KiB), st.integers(0, 255)),
    st.tuples(st.just("truncate"), offsets),
    st.tuples(st.just("read"), offsets, st.integers(0, 300 * KiB)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("compact"), st.integers(0, 4)),
    st.tuples(st.just("fsync")),
    st.tuples(st.just("other_read"), offsets, st.integers(0, 300 * KiB)),
)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=1, max_size=25))
def test_vfs_matches_a_bytearray_model(small_vfs: VFS, ops: list[tuple]) -> None:
    vfs = small_vfs
    name = f"file{next(_names)}".encode()
    fh, attr = vfs.create(ROOT_INO, name, 0o644, os.O_RDWR | os.O_CREAT, ROOT_CTX)
    ino = attr.ino
    model = bytearray()
    try:
        for step in ops:
            kind = step[0]
            if kind == "write":
                _, off, n, fill = step
                data = bytes([fill]) * n
                assert vfs.write(fh, off, data) == n
                if off > len(model):
                    model.extend(bytes(off - len(model)))
                model[off : off + n] = data
            elif kind == "append":
                _, n, fill = step
                afh = vfs.open(ino, os.O_WRONLY | os.O_APPEND, ROOT_CTX)
                vfs.write(afh, 0, bytes([fill]) * n)
                vfs.release(afh)
                model.extend(bytes([fill]) * n)
            elif kind == "truncate":
                _, size = step
                vfs.setattr(ino, SetAttrChanges(size=size), fh, ROOT_CTX)
                if size < len(model):
                    del model[size:]
                else:
                    model.extend(bytes(size - len(model)))
            elif kind == "read":
                _, off, n = step
                assert vfs.read(fh, off, n) == bytes(model[off : off + n])
            elif kind == "flush":
                vfs.flush(fh)
            elif kind == "reopen":
                vfs.release(fh)
                fh = vfs.open(ino, os.O_RDWR, ROOT_CTX)
            elif kind == "fsync":
                vfs.fsync(fh, False)
            elif kind == "other_read":  # a second handle sees this client's writes
                _, off, n = step
                rfh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
                assert vfs.read(rfh, off, n) == bytes(model[off : off + n])
                vfs.release(rfh)
            elif kind == "compact":
                vfs.flush(fh)
                vfs.compact_chunk(ino, step[1])
            assert vfs.getattr(ino).size == len(model)
        assert vfs.read(fh, 0, LIMIT * 2) == bytes(model)
    finally:
        vfs.release(fh)
        vfs.unlink(ROOT_INO, name, ROOT_CTX)
    vfs.run_deletions()
