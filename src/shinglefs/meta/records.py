"""The records of the metadata contract: constants and frozen, slotted dataclasses.

Everything a caller passes to or gets back from a ``MetaStore`` (see
``shinglefs.meta.api``): credentials (``Ctx``), inode attributes, directory
entries, slice references and the chunk map, slices and replicas, sessions,
storage servers (membership), the format record and statfs. Pure values: no
I/O, no database, no import of the rest of the package, so every layer may
hold and compare them freely.
``shinglefs.meta.api`` re-exports every name here.
"""

from __future__ import annotations

import enum
import os
import stat
from dataclasses import dataclass
from typing import Final

ROOT_INO: Final = 1
CHUNK_SIZE: Final = 64 * 1024 * 1024
"""The default chunk size: the file-offset unit of the chunk map, a format
parameter (``FormatInfo.chunk_size``) defined here only. ``format`` refuses one
above the store's largest slice (``shinglefs.store.api.MAX_SLICE_SIZE``), which
this default equals: a slice never crosses a chunk and one fills a chunk."""
INLINE_SLICE_BIT: Final = 1 << 62
"""Set in the id of an *inline slice*: a small slice whose bytes live in the
metadata itself (``SliceCommit.inline``), never on a drive. Regular slice ids
stay below it."""


def is_inline_slice(slice_id: int) -> bool:
    """Whether ``slice_id`` names an inline slice (its bytes are in meta)."""
    return bool(slice_id & INLINE_SLICE_BIT)
BLOCK_SIZE: Final = 4096
NAME_MAX: Final = 255
SYMLINK_MAX: Final = 4095
XATTR_NAME_MAX: Final = 255
XATTR_SIZE_MAX: Final = 65536
LINK_MAX: Final = 65000
"""Largest nlink of a file (ext4's bound); ``link`` beyond it raises EMLINK."""
MAX_FILE_SIZE: Final = 1 << 48
"""Largest file size (256 TiB): a truncate beyond it is EFBIG, a write is cut
there (EFBIG at it). The file system's used-bytes counter sums file sizes in
64 bits; unbounded sparse files (``truncate -s 4E`` twice) overflowed it and
left ``statfs`` failing for good."""
TIME_NS_MIN: Final = -(1 << 63)
TIME_NS_MAX: Final = (1 << 63) - 1
"""Timestamps are kept as 64-bit nanoseconds (1678 to 2262); a time set
outside is clamped, as Linux clamps to a file system's time range."""

# setattr time markers, the values Linux uses in timespec.tv_nsec.
UTIME_NOW: Final = (1 << 30) - 1
UTIME_OMIT: Final = (1 << 30) - 2

# setxattr flags (linux/xattr.h)
XATTR_CREATE: Final = 1
XATTR_REPLACE: Final = 2

# renameat2 flags (linux/fs.h)
RENAME_NOREPLACE: Final = 1
RENAME_EXCHANGE: Final = 2

# access() mask bits
F_OK: Final = os.F_OK
R_OK: Final = os.R_OK
W_OK: Final = os.W_OK
X_OK: Final = os.X_OK

FIRST_COOKIE: Final = 3
"""Cookies 1 and 2 are left for '.' and '..' (which ``readdir`` does not return)."""


@dataclass(frozen=True, slots=True)
class Ctx:
    """The credentials of the process making a request.

    ``umask`` is applied by ``mknod``/``mkdir``/``create`` (pass 0 when the
    kernel already applied it). ``groups`` are the supplementary groups.
    """

    uid: int = 0
    gid: int = 0
    pid: int = 0
    groups: tuple[int, ...] = ()
    umask: int = 0

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


ROOT_CTX: Final = Ctx()


IMMUTABLE = 0x10
"""``InodeAttr.flags`` bit of an inode of a read-only snapshot (the value of
Linux's ``FS_IMMUTABLE_FL``): no one, root included, may write it, change
its attributes or extended attributes, link, rename or remove it, or (a
directory) add or remove its entries: EPERM, as ``chattr +i`` gives.
``MetaStore.make_writable`` clears it on a tree."""


@dataclass(frozen=True, slots=True)
class InodeAttr:
    """The attributes of one inode. ``mode`` is ``st_mode`` including the type bits."""

    ino: int
    mode: int
    uid: int
    gid: int
    nlink: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    rdev: int = 0
    generation: int = 0
    flags: int = 0

    @property
    def type(self) -> int:
        """The ``stat.S_IFMT`` bits (``stat.S_IFREG``, ``stat.S_IFDIR``...)."""
        return stat.S_IFMT(self.mode)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def blocks(self) -> int:
        """``st_blocks``: 512-byte units, from the logical size (holes not subtracted)."""
        return (self.size + 511) // 512

    @property
    def immutable(self) -> bool:
        """Part of a read-only snapshot (``IMMUTABLE``): no one may change it."""
        return bool(self.flags & IMMUTABLE)


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One directory entry as ``readdir`` returns it (readdirplus: with attributes).

    ``cookie`` is the entry's stable position: pass it back to ``readdir`` to
    resume after this entry, whatever was inserted or deleted meanwhile.
    """

    name: bytes
    ino: int
    attr: InodeAttr
    cookie: int


@dataclass(frozen=True, slots=True)
class SliceRef:
    """One reference in a chunk's overlay: ``length`` bytes at ``chunk_offset`` in
    the chunk come from ``slice_id`` starting at ``slice_offset``.

    Within a chunk, references are ordered; a later one wins where they overlap.
    ``chunk_offset + length`` never exceeds the chunk size.
    """

    slice_id: int
    chunk_offset: int
    length: int
    slice_offset: int = 0


ChunkPiece = SliceRef
"""Alias: the client speaks of the pieces it commits, the map of the references it holds."""


@dataclass(frozen=True, slots=True)
class ReadPiece:
    """A resolved run of file bytes: ``length`` bytes at ``file_offset`` are
    ``slice_id`` bytes from ``slice_offset``, or zeros when ``slice_id`` is None (a hole).
    For an inline slice ``inline`` holds exactly those ``length`` bytes."""

    file_offset: int
    length: int
    slice_id: int | None
    slice_offset: int = 0
    inline: bytes | None = None

    @property
    def is_hole(self) -> bool:
        return self.slice_id is None


@dataclass(frozen=True, slots=True)
class ChunkMap:
    """A chunk's overlay as stored: references in order (oldest first) and a version
    that changes on every modification (for ``replace_chunk``). ``seqs[i]`` is
    ``refs[i]``'s place in the overlay (ascending, at most ``version``)."""

    ino: int
    chunk_index: int
    version: int
    refs: tuple[SliceRef, ...]
    seqs: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """A chunk worth compacting (``compaction_candidates``)."""

    ino: int
    chunk_index: int
    version: int
    nrefs: int


class SliceState(enum.StrEnum):
    """The life of a slice in the metadata: WRITING (added, bytes still being
    written or not yet referenced), COMMITTED (referenced by at least one
    chunk), TO_DELETE (refcount reached zero; queued for the storage layer)."""

    WRITING = "writing"
    COMMITTED = "committed"
    TO_DELETE = "to_delete"


@dataclass(frozen=True, slots=True)
class Replica:
    """Where one copy of a slice lives: a storage server (its id, or
    ``LOCAL_SERVER`` for a drive of the file system's own drive list) and one
    of its drives."""

    server: str
    drive: str


LOCAL_SERVER = "local"
"""The server of a replica on a drive recorded at format time (an embedded file system)."""


@dataclass(frozen=True, slots=True)
class SliceCommit:
    """One slice reference to commit (``MetaStore.commit_slices``): ``piece`` into
    chunk ``chunk_index`` of ``ino``, growing the file to at least ``new_size``;
    the other fields as in ``commit_slice``. ``inline``: the whole slice's bytes,
    stored in meta in the same transaction (``piece.slice_id`` must be an
    inline slice id, see ``INLINE_SLICE_BIT``); data and reference then become
    visible and durable together, so no drive flush has to precede the commit.
    ``replicas``, when given, become the slice's replica set (replacing the one
    recorded when it was registered: a replica that failed while the slice was
    written is gone from it); empty leaves the recorded set. ``registered``:
    the writer registered the slice (``add_slice``) before storing its bytes;
    its record must then still exist (WRITING or COMMITTED) -- a record the
    janitor discarded and the deletion consumer removed names deleted bytes,
    so the commit is refused (ESTALE, ``SliceStateError``) instead of
    recording the slice anew. False (a slice stored in one piece, an inline
    one): the commit registers the slice itself."""

    ino: int
    chunk_index: int
    piece: SliceRef
    new_size: int
    group: int = 0
    slice_length: int | None = None
    replicas: tuple[Replica, ...] = ()
    mtime_ns: int | None = None
    inline: bytes | None = None
    registered: bool = False


@dataclass(frozen=True, slots=True)
class SliceInfo:
    """A slice as the metadata knows it. ``group`` is its lifetime group."""

    id: int
    length: int
    group: int = 0
    state: SliceState = SliceState.WRITING
    refcount: int = 0
    replicas: tuple[Replica, ...] = ()


@dataclass(frozen=True, slots=True)
class StatFs:
    """What ``statfs`` reports. ``used_bytes`` is the sum of the logical sizes of all
    allocated inodes (unlinked-but-open ones included); ``inodes`` counts them."""

    block_size: int
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    inodes: int
    inodes_free: int
    name_max: int = NAME_MAX


@dataclass(frozen=True, slots=True)
class DriveRecord:
    """One drive of the file system as the metadata records it: its spec (a
    relative PATH is relative to the metadata file's directory) and the drive
    uuid written in its header at format time (None for a drive recorded
    before drive identities existed)."""

    spec: str
    uuid: str | None


@dataclass(frozen=True, slots=True)
class FormatInfo:
    """The format record of a file system (one row, written by ``format``)."""

    name: str
    uuid: str
    chunk_size: int
    block_size: int
    schema_version: int
    secret: str
    created_ns: int


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What a mounted client says about itself when it registers."""

    host: str = ""
    pid: int = 0
    mountpoint: str = ""
    version: str = ""


@dataclass(frozen=True, slots=True)
class Session:
    """A registered client session as ``list_sessions`` returns it."""

    id: int
    info: SessionInfo
    started_ns: int
    heartbeat_ns: int
    open_inodes: tuple[int, ...] = ()


SERVER_HEARTBEAT_S = 3.0
"""How often a storage server heartbeats in meta (``shinglefs server --heartbeat``)."""
SERVER_TIMEOUT_S = 15.0
"""A server whose last heartbeat is older than this is not live (five missed beats)."""
REPAIR_AFTER_S = 300.0
"""How long a storage server may be gone before its replicas count as lost and
are copied elsewhere (server/repair.py)."""
TIERS = ("hot", "cold")
"""Tiers of drives: hot (flash or conventional drives) and cold (SMR)."""


@dataclass(frozen=True, slots=True)
class ServerDrive:
    """One drive of a storage server as meta records it: the server's own id for
    it, its spec on the server's host, the drive uuid in its header (None for a
    drive without one, e.g. a zoned block device), its tier, and its capacity
    and free bytes as of the last heartbeat."""

    drive_id: int
    spec: str
    uuid: str | None
    tier: str
    capacity_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """A registered storage server as ``list_servers`` returns it.

    ``stopped_ns`` is 0 while the server runs and the time of its clean stop
    (``unregister_server``) after one; ``live`` says it runs and its last
    heartbeat is younger than the timeout ``list_servers`` was given."""

    id: int
    address: str
    labels: dict[str, str]
    drives: tuple[ServerDrive, ...]
    started_ns: int
    heartbeat_ns: int
    stopped_ns: int
    live: bool

    def tiers(self) -> dict[str, tuple[int, int]]:
        """``{tier: (capacity_bytes, free_bytes)}`` summed over the server's drives."""
        out: dict[str, tuple[int, int]] = {}
        for d in self.drives:
            cap, free = out.get(d.tier, (0, 0))
            out[d.tier] = (cap + d.capacity_bytes, free + d.free_bytes)
        return out


@dataclass(frozen=True, slots=True)
class RenameResult:
    """What ``rename`` did: the inode now at the target name, and the inode the
    target name held before (None if it was free). For RENAME_EXCHANGE
    ``replaced`` is the inode now at the source name (nothing is released).
    ``released`` says the replaced inode lost its last link and was freed (its
    slices queued for deletion); False when it still has links or is open
    somewhere (then it is freed on its last close or session expiry)."""

    ino: int
    replaced: InodeAttr | None = None
    released: bool = False


@dataclass(frozen=True, slots=True)
class DirPolicy:
    """Policy of a directory: tier (``TIERS``: the drives new slices of the files
    below go to, the nearest directory's that sets one,
    ``MetaStore.placement_tiers``; a new subdirectory copies its parent's), retention (``keep-last=N``: the directory keeps its N
    newest entries, client/background/retention.py; a subdirectory does not
    inherit it), and the replication goal ``replicas`` (copies of each slice
    of the files below it).

    ``replicas`` is the directory's own goal, None to inherit: the goal of a
    file is that of the nearest directory above it with one set
    (``MetaStore.replica_goals``), looked up when it is written, so a goal set
    on a tree applies to everything below that sets none; with none set the
    default is 1 with one storage server and 2 with two or more."""

    tier: str | None = None
    retention: str | None = None
    replicas: int | None = None


@dataclass(frozen=True, slots=True)
class Created:
    """What ``create_file`` did: the file's attributes, and whether this call
    made it (else it opened a regular file that existed: no O_EXCL)."""

    attr: InodeAttr
    made: bool


@dataclass(frozen=True, slots=True)
class UnlinkResult:
    """What ``unlink``/``rmdir`` did: the attributes of the inode after losing the
    entry (``nlink`` may be 0) and whether it was freed (slices queued)."""

    attr: InodeAttr
    released: bool


def permits(mode: int, uid: int, gid: int, ctx: Ctx, mask: int) -> bool:
    """Linux's generic_permission on mode bits (no ACLs)."""
    mask &= 7
    if ctx.uid == 0:
        # root: anything but executing a file nobody may execute
        return not (mask & X_OK and not stat.S_ISDIR(mode) and not mode & 0o111)
    if ctx.uid == uid:
        bits = (mode >> 6) & 7
    elif ctx.in_group(gid):
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & mask == mask


__all__ = [
    "BLOCK_SIZE",
    "CHUNK_SIZE",
    "FIRST_COOKIE",
    "F_OK",
    "IMMUTABLE",
    "INLINE_SLICE_BIT",
    "LINK_MAX",
    "LOCAL_SERVER",
    "MAX_FILE_SIZE",
    "NAME_MAX",
    "RENAME_EXCHANGE",
    "RENAME_NOREPLACE",
    "REPAIR_AFTER_S",
    "ROOT_CTX",
    "ROOT_INO",
    "R_OK",
    "SERVER_HEARTBEAT_S",
    "SERVER_TIMEOUT_S",
    "SYMLINK_MAX",
    "TIERS",
    "TIME_NS_MAX",
    "TIME_NS_MIN",
    "UTIME_NOW",
    "UTIME_OMIT",
    "W_OK",
    "XATTR_CREATE",
    "XATTR_NAME_MAX",
    "XATTR_REPLACE",
    "XATTR_SIZE_MAX",
    "X_OK",
    "ChunkInfo",
    "ChunkMap",
    "ChunkPiece",
    "Ctx",
    "DirEntry",
    "DirPolicy",
    "DriveRecord",
    "FormatInfo",
    "InodeAttr",
    "ReadPiece",
    "RenameResult",
    "Replica",
    "ServerDrive",
    "ServerRecord",
    "Session",
    "SessionInfo",
    "SliceCommit",
    "SliceInfo",
    "SliceRef",
    "SliceState",
    "StatFs",
    "UnlinkResult",
    "is_inline_slice",
    "permits",
]
