"""The one schema and the one set of SQL statements, for every backend.

Statements are written once with ``?`` placeholders and ``{greatest}`` /
``{blob}`` / ``{without_rowid}`` markers; ``Dialect.sql`` renders them for a
backend (and caches the result, ``Dialect.rendered``). Only SQL that SQLite >= 3.35, PostgreSQL >= 13,
CockroachDB and YugabyteDB all accept is used: ``INSERT ... ON CONFLICT``,
``RETURNING``, plain B-tree indexes, no triggers, no sequences, no stored
procedures. One statement is the exception: ``lock_inodes`` (``SELECT ... FOR
UPDATE``), which SQLite does not parse, is issued only where
``Dialect.row_locks`` is set (PostgreSQL and its relatives), to make writers
that modify several inode rows queue in one order instead of deadlocking.
Isolation itself comes from BEGIN IMMEDIATE on SQLite and the isolation level
on PostgreSQL (SERIALIZABLE but for the modes "snapshot" and "committed",
``backend.py``), not from the row locks (see docs/metadata.md).

Key layout (3FS style): an inode row keyed by ``ino``; directory entries keyed
by ``(parent, name)`` so lookup is one point read and listing one range scan on
``(parent, cookie)``; chunk references keyed by ``(ino, chunk_index, seq)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shinglefs.meta.records import IMMUTABLE

SCHEMA_VERSION = 7
# Version 1 kept the drive list as the root xattr below; opening a version-1
# database migrates it into the drives table (engine/format.py).
# Version 2 had no drives.uuid column (the drive identity written in each
# drive's header); opening a version-2 database adds it, NULL for every drive.
# Version 3 had no inline_slices table (small files whose bytes live in meta);
# opening a version-3 database creates it, empty (the DDL is idempotent).
# Version 4 had no servers table (storage-server membership) and no "server"
# id counter; opening a version-4 database creates both.
# Version 5 had no inodes.replicas column (a directory's replication goal) and
# no drive_states table (drives an operator took offline); opening a version-5
# database adds the column, NULL (inherit) everywhere, and the table, empty.
# Version 6 had no counter_deltas table (statfs counter changes, appended
# instead of updated in place); opening a version-6 database creates it, empty.
V1_DRIVES_XATTR = b"trusted.shinglefs.drives"

# Inode columns in the order InodeAttr takes them.
# The guard of a write that must not touch an immutable inode (a read-only
# snapshot's, ``records.IMMUTABLE``): the row is then not found.
MUTABLE = f"AND (flags & {IMMUTABLE}) = 0"
INODE_COLS = (
    "ino, mode, uid, gid, nlink, size, atime_ns, mtime_ns, ctime_ns, rdev, generation, flags"
)
INODE_COLS_I = ", ".join(f"i.{c.strip()}" for c in INODE_COLS.split(","))
COUNTER_SHARDS = 16

DDL = [
    """CREATE TABLE IF NOT EXISTS format (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        uuid TEXT NOT NULL,
        chunk_size BIGINT NOT NULL,
        block_size BIGINT NOT NULL,
        schema_version INTEGER NOT NULL,
        secret TEXT NOT NULL,
        created_ns BIGINT NOT NULL,
        capacity_bytes BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS ids (
        name TEXT PRIMARY KEY,
        next_id BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS counters (
        shard INTEGER PRIMARY KEY,
        used_bytes BIGINT NOT NULL,
        inodes BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS inodes (
        ino BIGINT PRIMARY KEY,
        mode INTEGER NOT NULL,
        uid BIGINT NOT NULL,
        gid BIGINT NOT NULL,
        nlink BIGINT NOT NULL,
        size BIGINT NOT NULL,
        atime_ns BIGINT NOT NULL,
        mtime_ns BIGINT NOT NULL,
        ctime_ns BIGINT NOT NULL,
        rdev BIGINT NOT NULL,
        generation BIGINT NOT NULL,
        flags BIGINT NOT NULL,
        parent BIGINT NOT NULL,
        next_cookie BIGINT NOT NULL,
        tier TEXT,
        retention TEXT,
        target {blob},
        replicas INTEGER
    )""",
    """CREATE TABLE IF NOT EXISTS dentries (
        parent BIGINT NOT NULL,
        name {blob} NOT NULL,
        ino BIGINT NOT NULL,
        cookie BIGINT NOT NULL,
        PRIMARY KEY (parent, name)
    ){without_rowid}""",
    "CREATE UNIQUE INDEX IF NOT EXISTS dentries_cookie ON dentries (parent, cookie, ino)",
    """CREATE TABLE IF NOT EXISTS xattrs (
        ino BIGINT NOT NULL,
        name {blob} NOT NULL,
        value {blob} NOT NULL,
        PRIMARY KEY (ino, name)
    ){without_rowid}""",
    """CREATE TABLE IF NOT EXISTS chunks (
        ino BIGINT NOT NULL,
        chunk_index BIGINT NOT NULL,
        version BIGINT NOT NULL,
        nrefs BIGINT NOT NULL,
        PRIMARY KEY (ino, chunk_index)
    ){without_rowid}""",
    "CREATE INDEX IF NOT EXISTS chunks_nrefs ON chunks (nrefs)",
    """CREATE TABLE IF NOT EXISTS chunk_refs (
        ino BIGINT NOT NULL,
        chunk_index BIGINT NOT NULL,
        seq BIGINT NOT NULL,
        slice_id BIGINT NOT NULL,
        chunk_offset BIGINT NOT NULL,
        length BIGINT NOT NULL,
        slice_offset BIGINT NOT NULL,
        PRIMARY KEY (ino, chunk_index, seq)
    ){without_rowid}""",
    """CREATE TABLE IF NOT EXISTS slices (
        id BIGINT PRIMARY KEY,
        length BIGINT NOT NULL,
        grp BIGINT NOT NULL,
        state TEXT NOT NULL,
        refcount BIGINT NOT NULL,
        created_ns BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS slice_replicas (
        slice_id BIGINT NOT NULL,
        server TEXT NOT NULL,
        drive TEXT NOT NULL,
        PRIMARY KEY (slice_id, server, drive)
    ){without_rowid}""",
    """CREATE TABLE IF NOT EXISTS deletions (
        slice_id BIGINT PRIMARY KEY,
        queued_ns BIGINT NOT NULL,
        lease_ns BIGINT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS deletions_lease ON deletions (lease_ns)",
    """CREATE TABLE IF NOT EXISTS sessions (
        id BIGINT PRIMARY KEY,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        mountpoint TEXT NOT NULL,
        version TEXT NOT NULL,
        started_ns BIGINT NOT NULL,
        heartbeat_ns BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS open_files (
        session BIGINT NOT NULL,
        ino BIGINT NOT NULL,
        opens BIGINT NOT NULL,
        PRIMARY KEY (session, ino)
    ){without_rowid}""",
    "CREATE INDEX IF NOT EXISTS open_files_ino ON open_files (ino)",
]
INLINE_DDL = """CREATE TABLE IF NOT EXISTS inline_slices (
    slice_id BIGINT PRIMARY KEY,
    data {blob} NOT NULL
)"""
DDL.append(INLINE_DDL)
DRIVES_DDL = """CREATE TABLE IF NOT EXISTS drives (
    id INTEGER PRIMARY KEY,
    spec TEXT NOT NULL,
    uuid TEXT
)"""
ADD_DRIVES_UUID = "ALTER TABLE drives ADD COLUMN uuid TEXT"
DDL.append(DRIVES_DDL)
# Storage servers: one row a server, kept across restarts (its id is what a
# replica will name). ``labels`` and ``drives`` are JSON text (a server has a
# handful of drives, read and written whole); ``stopped_ns`` is 0 while it runs.
SERVERS_DDL = """CREATE TABLE IF NOT EXISTS servers (
    id BIGINT PRIMARY KEY,
    address TEXT NOT NULL,
    labels TEXT NOT NULL,
    drives TEXT NOT NULL,
    started_ns BIGINT NOT NULL,
    heartbeat_ns BIGINT NOT NULL,
    stopped_ns BIGINT NOT NULL
)"""
DDL.append(SERVERS_DDL)
# A drive's state when it is not plain online, keyed by (server id, drive id):
# 'offline' = left out of placement and drained (server/repair.py). No row: online.
DRIVE_STATES_DDL = """CREATE TABLE IF NOT EXISTS drive_states (
    server BIGINT NOT NULL,
    drive BIGINT NOT NULL,
    state TEXT NOT NULL,
    since_ns BIGINT NOT NULL,
    PRIMARY KEY (server, drive)
){without_rowid}"""
DDL.append(DRIVE_STATES_DDL)
COUNTER_DELTAS_DDL = """CREATE TABLE IF NOT EXISTS counter_deltas (
    writer BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    used_bytes BIGINT NOT NULL,
    inodes BIGINT NOT NULL,
    PRIMARY KEY (writer, seq)
){without_rowid}"""
DDL.append(COUNTER_DELTAS_DDL)
ADD_INODE_REPLICAS = "ALTER TABLE inodes ADD COLUMN replicas INTEGER"
# Whether inodes has the replicas column, per dialect (a migration run on a
# database whose tables were created by this version's DDL must not add it twice).
HAS_INODE_REPLICAS = {
    "sqlite": "SELECT COUNT(*) FROM pragma_table_info('inodes') WHERE name = 'replicas'",
    "postgresql": (
        "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'inodes' AND column_name = 'replicas'"
    ),
}

TABLES = [
    "format", "ids", "counters", "inodes", "dentries", "xattrs", "chunks", "chunk_refs",
    "slices", "slice_replicas", "deletions", "sessions", "open_files", "drives",
    "inline_slices", "servers", "drive_states", "counter_deltas",
]  # fmt: skip


def in_list(values: Sequence[int]) -> list[int]:
    """``values`` (not empty) padded with its last to a power-of-two count: each
    statement text is prepared and kept per connection (43 KB for 500 marks on
    SQLite), and lists bound as they came grew a daemon by megabytes, one batch
    size at a time; so at most 16 texts per statement. Repeats change no IN."""
    out = list(values)
    return out + out[-1:] * ((1 << (len(out) - 1).bit_length()) - len(out))


def in_marks(count: int) -> str:
    """``count`` placeholders for an ``IN`` list of ``in_list`` values."""
    if count < 1 or count & (count - 1):
        raise ValueError(f"an IN list of {count} values: pad it with in_list")
    return ", ".join("?" * count)


class Rendered(dict[str, str]):
    """The statements of one dialect, each rendered on first use (``__missing__``).

    ``rendered[text]`` is what a transaction executes: after the first use of a
    statement it is one dict lookup, without a Python call (it runs for every
    statement of every operation)."""

    __slots__ = ("_render",)

    def __init__(self, render: Callable[[str], str]) -> None:
        super().__init__()
        self._render = render

    def __missing__(self, text: str) -> str:
        rendered = self._render(text)
        self[text] = rendered
        return rendered


@dataclass
class Dialect:
    """The small differences between backends, applied to the shared SQL text."""

    name: str
    placeholder: str
    row_locks: bool
    """The backend takes explicit row locks (``FOR UPDATE``) to order writers."""
    blob: str
    greatest: str
    without_rowid: str
    for_share: str = ""
    """`` FOR SHARE`` where row locks exist: a snapshot-isolated writer locks a
    row it read but does not write (see ``backend`` mode "snapshot")."""
    refuse_empty: tuple[str, str] = ("", "")
    """Put around a ``RETURNING`` write used as ``Tx.last``: where the write
    finds no row the statement fails with ``division_by_zero`` (PostgreSQL:
    the write in a CTE, its row joined to ``1 / count(*)``, the preserved side
    of a LEFT JOIN so that it is always evaluated). Nothing on SQLite, where
    ``last`` waits for the answer. (The join condition uses the quotient:
    a column nobody reads is not computed.)"""
    rendered: Rendered = field(init=False, repr=False, compare=False)
    """Every statement used so far, rendered for this backend (``Rendered``)."""

    def __post_init__(self) -> None:
        self.rendered = Rendered(self._render)

    def sql(self, text: str) -> str:
        """Render a statement written with ``?`` and ``{markers}`` for this backend."""
        return self.rendered[text]

    def _render(self, text: str) -> str:
        rendered = text.format(
            blob=self.blob, greatest=self.greatest, without_rowid=self.without_rowid,
            for_share=self.for_share, refuse_empty_open=self.refuse_empty[0],
            refuse_empty_close=self.refuse_empty[1],
        )
        if self.placeholder != "?":
            rendered = rendered.replace("?", self.placeholder)
        return rendered


SQLITE = Dialect(
    name="sqlite",
    placeholder="?",
    row_locks=False,
    blob="BLOB",
    greatest="MAX",
    without_rowid=" WITHOUT ROWID",
)
POSTGRES = Dialect(
    name="postgresql",
    placeholder="%s",
    row_locks=True,
    blob="BYTEA",
    greatest="GREATEST",
    without_rowid="",
    for_share=" FOR SHARE",
    refuse_empty=("WITH u AS (",
                  ") SELECT u.* FROM (SELECT 1 / count(*) AS one FROM u) refuse "
                  "LEFT JOIN u ON refuse.one = 1"),
)


# ---- statements --------------------------------------------------------------------
# Kept here so a reviewer sees every query the engine issues in one place.

SEL_FORMAT = (
    "SELECT name, uuid, chunk_size, block_size, schema_version, secret, created_ns, "
    "capacity_bytes FROM format WHERE id = 1"
)
INS_FORMAT = (
    "INSERT INTO format (id, name, uuid, chunk_size, block_size, schema_version, secret, "
    "created_ns, capacity_bytes) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SEL_DRIVES = "SELECT spec, uuid FROM drives ORDER BY id"
INS_DRIVE = "INSERT INTO drives (id, spec, uuid) VALUES (?, ?, ?)"
DEL_DRIVES = "DELETE FROM drives"
SET_SCHEMA_VERSION = "UPDATE format SET schema_version = ? WHERE id = 1"
SET_CAPACITY = "UPDATE format SET capacity_bytes = ? WHERE id = 1"
INS_ID = "INSERT INTO ids (name, next_id) VALUES (?, ?)"
INS_ID_IF_MISSING = "INSERT INTO ids (name, next_id) VALUES (?, ?) ON CONFLICT (name) DO NOTHING"
SET_SECRET_IF_EMPTY = "UPDATE format SET secret = ? WHERE id = 1 AND secret = ''"
ALLOC_IDS = "UPDATE ids SET next_id = next_id + ? WHERE name = ? RETURNING next_id"
RAISE_IDS = "UPDATE ids SET next_id = ? WHERE name = ? AND next_id <= ?"
INS_COUNTER = "INSERT INTO counters (shard, used_bytes, inodes) VALUES (?, 0, 0)"
# The statfs counters: a base row per shard (format made 16; only shard 0 is
# written now) plus the changes operations append to counter_deltas, keyed by
# (writer, seq): a per-store random id and a per-store sequence. An operation
# only INSERTs a delta, so concurrent writers share no row and no read: with
# an UPDATE of a shard every pair of concurrent creates conflicted (the shard
# row, and under SERIALIZABLE the counters table's one index page).
# FOLD_DELTAS_* move the deltas into shard 0 in one transaction.
ADD_COUNTERS = (
    "UPDATE counters SET used_bytes = used_bytes + ?, inodes = inodes + ? WHERE shard = ?"
)
ADD_DELTA = "INSERT INTO counter_deltas (writer, seq, used_bytes, inodes) VALUES (?, ?, ?, ?)"
SUM_COUNTERS = (
    "SELECT COALESCE(SUM(u), 0), COALESCE(SUM(n), 0) FROM ("
    "SELECT used_bytes AS u, inodes AS n FROM counters UNION ALL "
    "SELECT used_bytes, inodes FROM counter_deltas) t"
)
SUM_DELTAS = (
    "SELECT COALESCE(SUM(used_bytes), 0), COALESCE(SUM(inodes), 0), COUNT(*) FROM counter_deltas"
)
# Under a snapshot (SERIALIZABLE, BEGIN IMMEDIATE) this deletes exactly the
# rows SUM_DELTAS summed: a concurrent insert is not in the snapshot.
DEL_DELTAS = "DELETE FROM counter_deltas"


def lock_inodes(count: int) -> str:
    """Lock ``count`` inode rows in ascending ino order (PostgreSQL-family only:
    SQLite's BEGIN IMMEDIATE already serializes writers). Taking every row an
    operation will modify up front, in one global order, makes deadlocks
    between multi-row operations (rename, unlink, link) impossible; a
    conflicting writer then fails with 40001 and is retried."""
    marks = in_marks(count)
    return f"SELECT ino FROM inodes WHERE ino IN ({marks}) ORDER BY ino FOR UPDATE"


SEL_INODE = f"SELECT {INODE_COLS} FROM inodes WHERE ino = ?"
# A write that changes nothing: under snapshot isolation it makes a concurrent
# writer of the row (an unlink about to free it) fail instead of proceeding
# on a snapshot that misses what this transaction adds (a lock would not).
TOUCH_INODE = "UPDATE inodes SET generation = generation WHERE ino = ? AND nlink > 0"
SEL_INODE_EXTRA = f"SELECT {INODE_COLS}, parent, target, tier, retention FROM inodes WHERE ino = ?"
INS_INODE = (
    f"INSERT INTO inodes ({INODE_COLS}, parent, next_cookie, tier, retention, target) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
DEL_INODE = "DELETE FROM inodes WHERE ino = ?"
DEL_XATTRS_OF = "DELETE FROM xattrs WHERE ino = ?"

# The parent of a new entry: touch it, take an entry cookie, return what the
# permission check needs -- one statement, and the row lock that orders
# concurrent creates in one directory.
TOUCH_PARENT_FOR_INSERT = (
    "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, next_cookie = next_cookie + 1, "
    "nlink = nlink + ? WHERE ino = ? "
    "RETURNING mode, uid, gid, nlink, next_cookie - 1, tier, retention, flags"
)
TOUCH_DIR = "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? WHERE ino = ?"
# A new entry's directory (what the checks and inheritance need) and what the
# name holds now (the child's INODE_COLS from column 6; NULLs for none).
PARENT_AND_CHILD = (
    f"SELECT p.mode, p.uid, p.gid, p.nlink, p.tier, p.retention, {INODE_COLS_I}, p.flags "
    "FROM inodes p LEFT JOIN dentries d ON d.parent = p.ino AND d.name = ? "
    "LEFT JOIN inodes i ON i.ino = d.ino WHERE p.ino = ?"
)
PARENT_AND_CHILD_FLAGS = 18  # the column of the parent's flags (after the child's 12)
# The new name, with the cookie TOUCH_PARENT_TAKE_COOKIE just took; a name
# that exists fails the statement (primary key). With the parent's mode,
# owner and group as the creating transaction read them: when they changed
# since (or the parent is gone), TOUCH_PARENT_TAKE_COOKIE touched nothing,
# the cookie is NULL and the statement fails its NOT NULL constraint.
TOUCH_PARENT_TAKE_COOKIE = (
    "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, next_cookie = next_cookie + 1, "
    f"nlink = nlink + ? WHERE ino = ? AND mode = ? AND uid = ? AND gid = ? {MUTABLE}"
)
INS_NEW_DENTRY = (
    "INSERT INTO dentries (parent, name, ino, cookie) VALUES (?, ?, ?, "
    f"(SELECT next_cookie - 1 FROM inodes WHERE ino = ? AND mode = ? AND uid = ? AND gid = ? "
    f"{MUTABLE}))"
)
TAKE_COOKIE = (
    "UPDATE inodes SET next_cookie = next_cookie + 1 WHERE ino = ? RETURNING next_cookie - 1"
)
SET_NLINK_CTIME = "UPDATE inodes SET nlink = nlink + ?, ctime_ns = ? WHERE ino = ? RETURNING nlink"
SET_CTIME = "UPDATE inodes SET ctime_ns = ? WHERE ino = ?"
SET_PARENT = "UPDATE inodes SET parent = ?, ctime_ns = ? WHERE ino = ?"
UPDATE_ATTRS = (
    "UPDATE inodes SET mode = ?, uid = ?, gid = ?, size = ?, atime_ns = ?, mtime_ns = ?, "
    "ctime_ns = ? WHERE ino = ?"
)
SET_POLICY = (
    "UPDATE inodes SET tier = ?, retention = ?, replicas = ?, ctime_ns = ? WHERE ino = ?"
)
SEL_POLICY = "SELECT mode, tier, retention, replicas FROM inodes WHERE ino = ?"


def replica_goals(count: int) -> str:
    """The replication goal of ``count`` inodes (``?`` each): rows ``(ino, goal)``
    for those with a goal on themselves or a directory above them, the nearest
    one's (the walk up ``parent`` stops at the first goal, at the root -- its
    own parent -- or after 4096 levels)."""
    marks = in_marks(count)
    return (
        "WITH RECURSIVE up (start, ino, parent, replicas, depth) AS ("
        f"SELECT ino, ino, parent, replicas, 0 FROM inodes WHERE ino IN ({marks}) "
        "UNION ALL SELECT up.start, i.ino, i.parent, i.replicas, up.depth + 1 "
        "FROM up JOIN inodes i ON i.ino = up.parent "
        "WHERE up.replicas IS NULL AND up.ino <> up.parent AND up.depth < 4096"
        ") SELECT start, replicas FROM up WHERE replicas IS NOT NULL"
    )

def placement_tiers(count: int) -> str:
    """The tier of ``count`` inodes (``?`` each): rows ``(ino, tier)`` for those
    with one, the nearest set at or above a directory, at or above the
    directory a file was made in (its ``parent``); the walk up stops at the
    first tier, at the root, or after 4096 levels (as ``replica_goals``)."""
    marks = in_marks(count)
    return (
        "WITH RECURSIVE up (start, ino, parent, tier, depth) AS ("
        "SELECT i.ino, d.ino, d.parent, d.tier, 0 FROM inodes i JOIN inodes d ON d.ino = "
        f"CASE WHEN (i.mode & 61440) = 16384 THEN i.ino ELSE i.parent END WHERE i.ino IN ({marks}) "
        "UNION ALL SELECT up.start, p.ino, p.parent, p.tier, up.depth + 1 "
        "FROM up JOIN inodes p ON p.ino = up.parent "
        "WHERE up.tier IS NULL AND up.ino <> up.parent AND up.depth < 4096"
        ") SELECT start, tier FROM up WHERE tier IS NOT NULL"
    )


INS_DENTRY = (
    "INSERT INTO dentries (parent, name, ino, cookie) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (parent, name) DO NOTHING"
)
LOOKUP = (
    "SELECT p.mode, p.uid, p.gid, p.parent, d.ino FROM inodes p "
    "LEFT JOIN dentries d ON d.parent = p.ino AND d.name = ? WHERE p.ino = ?"
)
LOOKUP_ATTR = (
    f"SELECT p.mode, p.uid, p.gid, p.parent, {INODE_COLS_I}, p.flags FROM inodes p "
    "LEFT JOIN dentries d ON d.parent = p.ino AND d.name = ? "
    "LEFT JOIN inodes i ON i.ino = d.ino WHERE p.ino = ?"
)
LOOKUP_ATTR_FLAGS = 16  # the column of the parent's flags (after the child's 12)
SEL_DENTRY = "SELECT ino, cookie FROM dentries WHERE parent = ? AND name = ?"
DEL_DENTRY = "DELETE FROM dentries WHERE parent = ? AND name = ?"
MOVE_DENTRY = "UPDATE dentries SET parent = ?, name = ?, cookie = ? WHERE parent = ? AND name = ?"
SET_DENTRY_INO = "UPDATE dentries SET ino = ? WHERE parent = ? AND name = ?"
ANY_CHILD = "SELECT 1 FROM dentries WHERE parent = ? LIMIT 1"
# The page of entries is chosen in a subquery so that every planner (PostgreSQL
# without statistics included) walks the (parent, cookie) index and stops at
# the LIMIT, instead of joining all remaining entries and sorting them.
READDIR = (
    f"SELECT d.name, d.cookie, {INODE_COLS_I} FROM (SELECT name, cookie, ino FROM dentries "
    "WHERE parent = ? AND cookie > ? ORDER BY cookie LIMIT ?) d "
    "JOIN inodes i ON i.ino = d.ino ORDER BY d.cookie"
)

SEL_XATTR = "SELECT value FROM xattrs WHERE ino = ? AND name = ?"
INS_XATTR = (
    "INSERT INTO xattrs (ino, name, value) VALUES (?, ?, ?) ON CONFLICT (ino, name) DO NOTHING"
)
UPD_XATTR = "UPDATE xattrs SET value = ? WHERE ino = ? AND name = ?"
LIST_XATTR = "SELECT name FROM xattrs WHERE ino = ? ORDER BY name"
DEL_XATTR = "DELETE FROM xattrs WHERE ino = ? AND name = ?"

# ---- content map ---------------------------------------------------------------------
# A slice commit's last statement (``Tx.last``): refused where ``ino`` is no
# regular file (32768: S_IFREG, 61440: S_IFMT), which rolls the commit back.
GROW_FILE_ATTR = (
    "{refuse_empty_open}UPDATE inodes SET size = {greatest}(size, ?), mtime_ns = ?, "
    f"ctime_ns = {{greatest}}(ctime_ns, ?) WHERE ino = ? AND (mode & 61440) = 32768 {MUTABLE} "
    f"RETURNING {INODE_COLS}{{refuse_empty_close}}"
)
# The statfs counters grow by what a file grows by, read from the inode row
# before GROW_FILE_ATTR changes it (no inode: no change; the operation fails).
COUNT_GROWTH = (
    "INSERT INTO counter_deltas (writer, seq, used_bytes, inodes) SELECT ?, ?, g.d, 0 FROM "
    "(SELECT {greatest}(0, ? - COALESCE((SELECT size FROM inodes WHERE ino = ?), ?)) AS d) g "
    "WHERE g.d <> 0"
)
BUMP_CHUNK = (
    "INSERT INTO chunks (ino, chunk_index, version, nrefs) VALUES (?, ?, 1, 1) "
    "ON CONFLICT (ino, chunk_index) DO UPDATE SET version = chunks.version + 1, "
    "nrefs = chunks.nrefs + 1 RETURNING version"
)
SEL_CHUNK = "SELECT version, nrefs FROM chunks WHERE ino = ? AND chunk_index = ?"
SET_CHUNK = "UPDATE chunks SET version = ?, nrefs = ? WHERE ino = ? AND chunk_index = ?"
DEL_CHUNK = "DELETE FROM chunks WHERE ino = ? AND chunk_index = ?"
DEL_CHUNKS_FROM = "DELETE FROM chunks WHERE ino = ? AND chunk_index >= ?"
DEL_CHUNKS_OF = "DELETE FROM chunks WHERE ino = ?"
INS_REF = (
    "INSERT INTO chunk_refs (ino, chunk_index, seq, slice_id, chunk_offset, length, "
    "slice_offset) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# A reference whose seq is the chunk's version (just bumped by BUMP_CHUNK).
INS_REF_AT_VERSION = (
    "INSERT INTO chunk_refs (ino, chunk_index, seq, slice_id, chunk_offset, length, "
    "slice_offset) SELECT ino, chunk_index, version, ?, ?, ?, ? FROM chunks "
    "WHERE ino = ? AND chunk_index = ?"
)
SEL_REFS = (
    "SELECT chunk_index, seq, slice_id, chunk_offset, length, slice_offset FROM chunk_refs "
    "WHERE ino = ? AND chunk_index >= ? AND chunk_index <= ? ORDER BY chunk_index, seq"
)
SEL_REFS_FROM = (
    "SELECT chunk_index, seq, slice_id, chunk_offset, length, slice_offset FROM chunk_refs "
    "WHERE ino = ? AND chunk_index >= ?"
)
SEL_REF_SLICES_OF = "SELECT slice_id FROM chunk_refs WHERE ino = ?"
DEL_REFS_OF = "DELETE FROM chunk_refs WHERE ino = ?"
DEL_REFS_FROM = "DELETE FROM chunk_refs WHERE ino = ? AND chunk_index >= ?"
DEL_REFS_CHUNK = "DELETE FROM chunk_refs WHERE ino = ? AND chunk_index = ?"
DEL_REF = "DELETE FROM chunk_refs WHERE ino = ? AND chunk_index = ? AND seq = ?"
DEL_REFS_SEQS = ("DELETE FROM chunk_refs WHERE ino = ? AND chunk_index = ? "
                 "AND seq BETWEEN ? AND ?")
TRIM_REF = "UPDATE chunk_refs SET length = ? WHERE ino = ? AND chunk_index = ? AND seq = ?"
COUNT_CHUNK_REFS = "SELECT COUNT(*) FROM chunk_refs WHERE ino = ? AND chunk_index = ?"
CANDIDATES = (
    "SELECT ino, chunk_index, version, nrefs FROM chunks WHERE nrefs >= ? "
    "ORDER BY nrefs DESC, ino, chunk_index LIMIT ?"
)

# ---- slices ------------------------------------------------------------------------
INS_SLICE = (
    "INSERT INTO slices (id, length, grp, state, refcount, created_ns) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO NOTHING"
)
# REF_SLICE and REF_REGISTERED_SLICE are ``Tx.later`` statements: refused
# (the commit rolled back) where they touch no row.
REF_SLICE = (
    "{refuse_empty_open}INSERT INTO slices (id, length, grp, state, refcount, created_ns) "
    "VALUES (?, ?, ?, 'committed', ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET refcount = slices.refcount + ?, state = 'committed', "
    "length = {greatest}(slices.length, ?) WHERE slices.state <> 'to_delete' "
    "RETURNING id{refuse_empty_close}"
)
# The reference of a slice its writer registered (add_slice): only an UPDATE,
# so a record discarded and removed meanwhile is never re-created.
REF_REGISTERED_SLICE = (
    "{refuse_empty_open}UPDATE slices SET refcount = refcount + ?, state = 'committed', "
    "length = {greatest}(length, ?) WHERE id = ? AND state <> 'to_delete' "
    "RETURNING id{refuse_empty_close}"
)
DEREF_SLICE = "UPDATE slices SET refcount = refcount - ? WHERE id = ? RETURNING refcount"
DOOM_SLICE = "UPDATE slices SET state = 'to_delete' WHERE id = ?"
# A WRITING slice's created_ns is when it was registered or last vouched for by
# its live writer (touch_slices): the janitor's abandoned age counts from it.
SEL_ABANDONED = (
    "SELECT id FROM slices WHERE state = 'writing' AND refcount = 0 AND created_ns < ? "
    "ORDER BY id LIMIT ?"
)


def touch_slices(count: int) -> str:
    """Set the registration time (first ``?``) of those of ``count`` slice ids
    (``?`` each) still WRITING: a live writer vouches for its slices."""
    marks = in_marks(count)
    return f"UPDATE slices SET created_ns = ? WHERE state = 'writing' AND id IN ({marks})"


DISCARD_SLICE = (
    "UPDATE slices SET state = 'to_delete' WHERE id = ? AND state = 'writing' AND refcount = 0"
)
SEL_SLICE = "SELECT id, length, grp, state, refcount FROM slices WHERE id = ?"
# Committed slices stored on drives (inline ids are above ?), in id order, with
# their replicas (a page of slices, every replica row of each).
SEL_STORED_PAGE = (
    "SELECT s.id, s.length, s.grp, s.refcount, r.server, r.drive FROM slices s "
    "LEFT JOIN slice_replicas r ON r.slice_id = s.id WHERE s.id IN ("
    "SELECT id FROM slices WHERE state = 'committed' AND id > ? AND id < ? ORDER BY id LIMIT ?"
    ") ORDER BY s.id, r.server, r.drive"
)
SEL_SLICE_STATE = "SELECT state FROM slices WHERE id = ?"
SEL_REPLICAS = "SELECT server, drive FROM slice_replicas WHERE slice_id = ? ORDER BY server, drive"
INS_REPLICA = (
    "INSERT INTO slice_replicas (slice_id, server, drive) VALUES (?, ?, ?) "
    "ON CONFLICT (slice_id, server, drive) DO NOTHING"
)
DEL_REPLICAS = "DELETE FROM slice_replicas WHERE slice_id = ?"
DEL_SLICE = "DELETE FROM slices WHERE id = ?"
INS_INLINE = ("INSERT INTO inline_slices (slice_id, data) VALUES (?, ?) "
              "ON CONFLICT (slice_id) DO NOTHING")
SEL_INLINE = "SELECT data FROM inline_slices WHERE slice_id = ?"
DEL_INLINE = "DELETE FROM inline_slices WHERE slice_id = ?"
QUEUE_DELETION = (
    "INSERT INTO deletions (slice_id, queued_ns, lease_ns) VALUES (?, ?, 0) "
    "ON CONFLICT (slice_id) DO NOTHING"
)
SEL_DUE_DELETIONS = (
    "SELECT slice_id FROM deletions WHERE lease_ns <= ? ORDER BY queued_ns, slice_id LIMIT ?"
)
LEASE_DELETION = "UPDATE deletions SET lease_ns = ? WHERE slice_id = ?"
DEL_DELETION = "DELETE FROM deletions WHERE slice_id = ?"
# A storage server's share of the queue (``pop_deletions_on``): due slices queued
# as TO_DELETE with a replica on server ? (the replicas' key prefix), in queue order.
SEL_DUE_DELETIONS_ON = (
    "SELECT d.slice_id FROM deletions d WHERE d.lease_ns <= ? "
    "AND EXISTS (SELECT 1 FROM slice_replicas r WHERE r.slice_id = d.slice_id AND r.server = ?) "
    "AND EXISTS (SELECT 1 FROM slices s WHERE s.id = d.slice_id AND s.state = 'to_delete') "
    "ORDER BY d.queued_ns, d.slice_id LIMIT ?"
)
SEL_REPLICAS_ON = (
    "SELECT server, drive FROM slice_replicas WHERE slice_id = ? AND server = ? ORDER BY drive"
)
DEL_REPLICAS_ON = "DELETE FROM slice_replicas WHERE slice_id = ? AND server = ?"
SEL_ANY_REPLICA = "SELECT 1 FROM slice_replicas WHERE slice_id = ? LIMIT 1"

# ---- sessions ----------------------------------------------------------------------
INS_SESSION = (
    "INSERT INTO sessions (id, host, pid, mountpoint, version, started_ns, heartbeat_ns) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
HEARTBEAT = "UPDATE sessions SET heartbeat_ns = ? WHERE id = ?"
SEL_SESSIONS = (
    "SELECT id, host, pid, mountpoint, version, started_ns, heartbeat_ns FROM sessions ORDER BY id"
)
SEL_EXPIRED = "SELECT id FROM sessions WHERE heartbeat_ns < ? ORDER BY id"
# Open records of sessions that no longer exist: a create at snapshot isolation
# that locked its session row FOR SHARE before an expiry deleted it commits its
# record after the expiry read the session's files (a lock is not a write).
SEL_STRAY_OPEN = (
    "SELECT o.session, o.ino FROM open_files o LEFT JOIN sessions s ON s.id = o.session "
    "WHERE s.id IS NULL ORDER BY o.ino"
)
DEL_SESSION = "DELETE FROM sessions WHERE id = ?"
CLOSE_FILE = "UPDATE open_files SET opens = opens - 1 WHERE session = ? AND ino = ? RETURNING opens"
DEL_OPEN = "DELETE FROM open_files WHERE session = ? AND ino = ?"
# Open ``ino`` in a session that exists (no such session: the NOT NULL
# constraint on open_files.session fails the statement).
# The session row is locked (PostgreSQL): under snapshot isolation a session
# expired concurrently then fails the transaction instead of gaining an open.
OPEN_IN_SESSION = (
    "INSERT INTO open_files (session, ino, opens) "
    "VALUES ((SELECT id FROM sessions WHERE id = ?{for_share}), ?, 1) "
    "ON CONFLICT (session, ino) DO UPDATE SET opens = open_files.opens + 1"
)
# The last close of a file that still has a link: nothing else to do (a row
# deleted). Otherwise (other opens, or no link left) CLOSE_FILE's way.
CLOSE_LINKED = (
    "DELETE FROM open_files WHERE session = ? AND ino = ? AND opens <= 1 "
    "AND EXISTS (SELECT 1 FROM inodes WHERE ino = ? AND nlink > 0)"
)


def close_linked(count: int) -> str:
    """CLOSE_LINKED for ``count`` distinct inodes of one session at once
    (``?`` session, then the inodes); returns the inodes it closed."""
    marks = in_marks(count)
    return (
        f"DELETE FROM open_files WHERE session = ? AND ino IN ({marks}) AND opens <= 1 "
        "AND EXISTS (SELECT 1 FROM inodes i WHERE i.ino = open_files.ino AND i.nlink > 0) "
        "RETURNING ino"
    )


SEL_OPEN_OF_SESSION = "SELECT ino FROM open_files WHERE session = ? ORDER BY ino"
DEL_OPEN_OF_SESSION = "DELETE FROM open_files WHERE session = ?"
IS_OPEN = "SELECT 1 FROM open_files WHERE ino = ? LIMIT 1"

# ---- storage servers ---------------------------------------------------------------
SEL_SERVERS = (
    "SELECT id, address, labels, drives, started_ns, heartbeat_ns, stopped_ns FROM servers "
    "ORDER BY id"
)
INS_SERVER = (
    "INSERT INTO servers (id, address, labels, drives, started_ns, heartbeat_ns, stopped_ns) "
    "VALUES (?, ?, ?, ?, ?, ?, 0)"
)
REJOIN_SERVER = (
    "UPDATE servers SET address = ?, labels = ?, drives = ?, started_ns = ?, heartbeat_ns = ?, "
    "stopped_ns = 0 WHERE id = ?"
)
HEARTBEAT_SERVER = (
    "UPDATE servers SET heartbeat_ns = ?, drives = ? WHERE id = ? AND stopped_ns = 0"
)
STOP_SERVER = "UPDATE servers SET stopped_ns = ? WHERE id = ?"
SEL_DRIVE_STATES = "SELECT server, drive, state, since_ns FROM drive_states ORDER BY server, drive"
SET_DRIVE_STATE = (
    "INSERT INTO drive_states (server, drive, state, since_ns) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (server, drive) DO UPDATE SET state = excluded.state, "
    "since_ns = excluded.since_ns"
)
DEL_DRIVE_STATE = "DELETE FROM drive_states WHERE server = ? AND drive = ?"
DEL_DRIVE_STATES_OF = "DELETE FROM drive_states WHERE server = ?"
DEL_SERVER = "DELETE FROM servers WHERE id = ?"
