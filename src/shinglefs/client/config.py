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


SESSION_HEARTBEAT_S = 10.0
"""The longest interval between two heartbeats of a client's session
(``ClientConfig.heartbeat_interval``)."""
HEARTBEATS_PER_AGE = 4
"""At least this many heartbeats fit in ``abandoned_slice_age``: each one vouches
for the slices the client's writers have in progress (``MetaStore.touch_slices``),
so a live writer's slice never looks abandoned to any client's janitor."""


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

    Abandoned slices: the janitor discards a WRITING slice that no live
    writer has vouched for within ``abandoned_slice_age``; a client's session
    heartbeat (every ``heartbeat_interval``, derived from that age) vouches
    for its writers' slices. Every client of one file system must take an
    age well above the others' heartbeat interval (10 s at most): the
    default, 6 h, is. UsageError for an age that is not positive.
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
    # A WRITING slice not vouched for by its writer this long was left by a dead
    # or silent writer (janitor); the session heartbeat vouches for live ones.
    abandoned_slice_age: float = 6 * 3600.0
    session_timeout: float = 120.0  # a session silent this long is expired (crashed client)
    deferred_close: bool = True  # release: meta's open-file row is dropped in batches (maintenance)
    # Ended slices of one file committing in the background. Many, so that a file
    # written in small scattered pieces (np.memmap r+, random pwrite: one slice
    # each) shares drive flushes and commit transactions among them: 1,000
    # random 4 KiB writes took 1.2-1.5 ms each with 4 (and 4 threads), 0.47
    # with 32 (and 16). A big file's slices are few; its bytes are bounded by
    # the write budget, not by this.
    max_settling_slices: int = 32
    commit_threads: int = 16  # settle slices ended while writing (ordered commits: client/commit.py)

    def __post_init__(self) -> None:
        if not self.abandoned_slice_age > 0:
            raise UsageError(f"abandoned_slice_age = {self.abandoned_slice_age} is not a "
                             "positive number of seconds",
                             hint="a WRITING slice younger than this is never discarded; "
                                  "the default is 21600 (6 h)")
        # The janitor is safe across clients only with heartbeats << the age.
        assert self.heartbeat_interval * HEARTBEATS_PER_AGE <= self.abandoned_slice_age

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between two heartbeats of this client's session (which also
        vouch for its writers' slices): ``SESSION_HEARTBEAT_S``, or less so that
        ``HEARTBEATS_PER_AGE`` of them fit in ``abandoned_slice_age``."""
        return min(SESSION_HEARTBEAT_S, self.abandoned_slice_age / HEARTBEATS_PER_AGE)
