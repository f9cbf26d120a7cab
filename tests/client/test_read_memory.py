"""The read cache holds no more memory than it counts, and counts no more than its bound.

Memory is measured with tracemalloc (every buffer of these reads is a Python
allocation: slices this small are read into bytearrays), so "what the cache
really holds" is what the interpreter really allocated, not what the cache
says about itself.
"""

from __future__ import annotations

import os
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

from fsfixtures import FsFactory, MiB, pattern, write_file

from shinglefs.client.config import ClientConfig
from shinglefs.client.reader import ENTRY_OVERHEAD, ExtentCache, held_bytes
from shinglefs.meta.api import ROOT_CTX

KiB = 1024


def traced_growth(work) -> int:  # type: ignore[no-untyped-def]
    """Bytes still allocated after ``work()`` that were not before it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_cache_of_small_files_holds_no_more_memory_than_its_bound(fs_factory: FsFactory) -> None:
    capacity = 512 * KiB
    # On a drive, not inline in meta (inline reads: test_inline_files.py).
    vfs = fs_factory.vfs(ClientConfig(read_cache_bytes=capacity, read_extent=4 * MiB,
                                      inline_max_bytes=0))
    files = {write_file(vfs, f"s{i}".encode(), pattern(i, 4096)): i for i in range(200)}

    def read_every_file() -> None:
        for ino, i in files.items():
            fh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
            assert vfs.read(fh, 0, 128 * KiB) == pattern(i, 4096)
            vfs.release(fh)

    growth = traced_growth(read_every_file)
    # Every entry counts its buffer and bookkeeping: ~6 KiB for a 4 KiB file.
    assert len(vfs.cache) >= 2
    assert vfs.cache.cached_bytes >= len(vfs.cache) * (4096 + ENTRY_OVERHEAD)
    assert vfs.cache.cached_bytes <= capacity
    # What the interpreter really kept: the cache's bound, the slice log's
    # 260 KiB scratch buffer of the reading thread (once per thread) and the
    # client's per-inode memos of 200 files; never an extent per file.
    assert growth <= capacity + 512 * KiB, f"{growth / MiB:.1f} MiB kept for {len(files)} files"


def test_cached_view_of_a_larger_buffer_does_not_keep_the_buffer_alive() -> None:
    # A read source whose results are short views of large buffers: what a
    # drive read into an extent-sized buffer returns for a short slice.
    def read_slice(slice_id: int, offset: int, length: int) -> memoryview:
        buf = bytearray(length)
        buf[:100] = bytes([slice_id % 256]) * 100
        return memoryview(buf)[:100].toreadonly()

    with ThreadPoolExecutor(1) as pool:
        cache = ExtentCache(read_slice, extent=MiB, capacity=4 * MiB, pool=pool)

        def read_fifty() -> None:
            for sid in range(1, 51):
                assert bytes(cache.read(sid, 0, 100)) == bytes([sid]) * 100

        growth = traced_growth(read_fifty)
    # Before: 50 views kept fifty 1 MiB buffers (counted as 100 bytes each).
    assert growth < MiB, f"{growth / MiB:.1f} MiB kept for 50 entries of 100 bytes"
    assert cache.cached_bytes <= 50 * (held_bytes(b"x" * 100) + ENTRY_OVERHEAD)


def test_held_bytes_counts_the_base_buffer_of_a_view() -> None:
    view = memoryview(bytearray(4 * MiB))[:4096]
    assert held_bytes(view) >= 4 * MiB
    assert 4096 <= held_bytes(bytes(4096)) < 4096 + 100
