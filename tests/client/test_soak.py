"""Soak: threads hammering their own files through one client with random writes,
truncates, appends and reads, each checked against a bytearray model, while another
thread reads every file; then fragmented chunks are compacted under that reader and
everything is re-read, after a restart too."""

from __future__ import annotations

import os
import random
import threading

from fsfixtures import FsFactory, create, read_all

from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import open_filesystem
from shinglefs.client.vfs import VFS, SetAttrChanges
from shinglefs.meta.api import ROOT_CTX

KiB = 1024


def test_threads_writing_their_files_match_their_models(fs_factory: FsFactory) -> None:
    config = ClientConfig(
        piece_size=64 * KiB, file_buffer_bytes=256 * KiB, total_buffer_bytes=1024 * KiB,
        read_extent=64 * KiB, readahead_bytes=256 * KiB, compact_threshold=6,
        compaction_scan_interval=0.5,
    )
    vfs: VFS = fs_factory.vfs(config, chunk_size=512 * KiB)
    files = [create(vfs, f"f{i}".encode()) for i in range(4)]
    models = [bytearray() for _ in files]
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(index: int) -> None:
        rng = random.Random(index)
        fh, ino = files[index]
        model = models[index]
        try:
            for _ in range(400):
                kind = rng.random()
                if kind < 0.55:
                    off = rng.randrange(0, 3 * 512 * KiB)
                    data = rng.randbytes(rng.randrange(1, 200 * KiB))
                    vfs.write(fh, off, data)
                    if off > len(model):
                        model.extend(bytes(off - len(model)))
                    model[off : off + len(data)] = data
                elif kind < 0.65:
                    size = rng.randrange(0, 2 * 512 * KiB)
                    vfs.setattr(ino, SetAttrChanges(size=size), fh, ROOT_CTX)
                    del model[size:]
                    model.extend(bytes(size - len(model)))
                elif kind < 0.75:
                    vfs.flush(fh)
                else:
                    off = rng.randrange(0, len(model) + 1)
                    n = rng.randrange(0, 300 * KiB)
                    assert vfs.read(fh, off, n) == bytes(model[off : off + n])
                assert vfs.getattr(ino).size == len(model)
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        rng = random.Random(99)
        try:
            while not stop.is_set():
                _fh, ino = rng.choice(files)
                rfh = vfs.open(ino, os.O_RDONLY, ROOT_CTX)
                vfs.read(rfh, rng.randrange(0, 1024 * KiB), 256 * KiB)  # any bytes; must not fail
                vfs.release(rfh)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(files))]
    side = threading.Thread(target=reader)
    side.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fh, _ino in files:
        vfs.flush(fh)
    # Writers are quiet now: compaction wins its races while the side reader goes on.
    assert vfs.compact_fragmented(min_refs=2) >= 1
    stop.set()
    side.join()
    assert not errors, errors[0]
    for (fh, ino), model in zip(files, models, strict=True):
        assert vfs.read(fh, 0, len(model) + 1) == bytes(model)
        # One slice per chunk now (several references when holes split its runs).
        assert len({r.slice_id for r in vfs.meta.get_chunk(ino, 0).refs}) <= 1
        vfs.release(fh)
    vfs.shutdown()
    again = open_filesystem(fs_factory.meta_url)
    fs_factory.opened.append(again)
    for (_fh, ino), model in zip(files, models, strict=True):
        assert read_all(again, ino) == bytes(model)
