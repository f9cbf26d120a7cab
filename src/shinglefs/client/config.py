"""Tunables of one client (one mounted or connected file system).

``shinglefs format/mount/up`` fill a ``ClientConfig`` from the configuration
file's ``[client]`` section and their flags (docs/configuration.md). The one
environment variable, ``SHINGLEFS_READ_CACHE_MIB``, is read when a
``ClientConfig`` is made without ``read_cache_bytes``, never at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from shinglefs.errors import UsageError

MiB = 1024 * 1024
READ_CACHE_ENV = "SHINGLEFS_READ_CACHE_MIB"
DEFAULT_READ_CACHE_MIB = 256
LOCAL_FILE_BUFFER = 16 * MiB
"""A file's written-but-not-stored bound on its own drives (``file_buffer_bytes``)."""
CLUSTER_FILE_BUFFER = 64 * MiB
"""The same for a client of storage servers: at least a server's zone run
(``StoreConfig.switch_bytes``, 32 MiB), since what a file has in flight bounds
its runs there. Locally no more: a full file system fills as exactly with
64 MiB since bytes in flight count once (server/space.py; test_full_filesystem
6 runs of 6), but ``bench mount --quick`` measured no gain (write 121 and 158
MiB/s against 145 and 148 with 16 MiB, on a loaded 2-core VM)."""


def read_cache_default() -> int:
    """The read cache's bound in bytes: ``$SHINGLEFS_READ_CACHE_MIB`` MiB when set
    (how an operator sizes a mount's cache), else 256 MiB. Raises UsageError
    for a value that is not a whole number of MiB >= 1."""
    value = os.environ.get(READ_CACHE_ENV, "").strip()
    if not value:
        return DEFAULT_READ_CACHE_MIB * MiB
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{READ_CACHE_ENV}={value!r} is not a whole number of MiB",
                         hint=f"set it to e.g. {DEFAULT_READ_CACHE_MIB}, or unset it")
    return int(value) * MiB


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What a client may buffer, read ahead and run in the background.

    Memory bounds: a file holds at most ``file_buffer_bytes`` of written but
    not yet stored bytes (pending + in flight to the store); all files
    together at most ``total_buffer_bytes`` (writers block when it is full:
    back-pressure). The read cache holds at most ``read_cache_bytes`` of
    memory, counted as what its extents really keep alive (client/reader.py);
    the reads in flight add at most ``read_extent`` per reading thread.
    """

    piece_size: int = 4 * MiB  # stream a slice to the store in pieces of at least this
    # per open file: pending + in flight. A client of storage servers takes
    # CLUSTER_FILE_BUFFER when this is left at its default (client/filesystem.py)
    file_buffer_bytes: int = LOCAL_FILE_BUFFER
    total_buffer_bytes: int = 256 * MiB  # all files of this client
    small_file_bytes: int = 4 * MiB  # a file whose first slice ends below this is "small"
    # A whole file of at most this many bytes, written in one go (nothing of it
    # streamed yet at its flush/close), is committed inline: its bytes go into
    # meta with its reference, in one transaction, and never to a drive
    # (docs/client.md, "Inline files"). One block by default; 0 turns it off.
    inline_max_bytes: int = 4096
    read_extent: int = 4 * MiB  # unit of drive reads and of the shared read cache
    # How far one sequential reader is read ahead (>= 8 MiB); many at once share
    # 3/4 of the read cache instead (client/readahead.py).
    readahead_bytes: int = 64 * MiB
    read_cache_bytes: int = field(default_factory=read_cache_default)  # $SHINGLEFS_READ_CACHE_MIB
    io_threads: int = 8  # background readers (readahead) and compaction
    compact_threshold: int = 16  # slices in a chunk before it is compacted in the background
    compaction: bool = True
    compaction_scan_interval: float = 60.0  # seconds between scans of meta for fragmented chunks (0: off)
    deletion_interval: float = 0.5  # seconds between polls of the deletion queue
    deletion_batch: int = 256
    deletion_consumer: bool = True
    janitor_interval: float = 300.0  # seconds between sweeps for abandoned WRITING slices (0: off)
    abandoned_slice_age: float = 6 * 3600.0  # a WRITING slice this old was left by a crashed client
    session_timeout: float = 120.0  # a session silent this long is expired (crashed client)
    deferred_close: bool = True  # release: meta's open-file row is dropped in batches (maintenance)
    max_settling_slices: int = 4  # ended slices of one file committing in the background
    commit_threads: int = 4  # settle slices ended while writing (ordered commits: client/commit.py)
