"""The contract of the metadata engine, as the client and the storage side see it.

``MetaStore`` is the one abstract interface. Its records (frozen, slotted
dataclasses, the constants of Linux's calls) live in ``meta.records``,
re-exported here: a caller imports the whole contract from this module.
``meta.engine.SqlMetaStore`` implements it over SQLite and PostgreSQL;
``meta.connect.open_meta`` (also ``shinglefs.meta.open_meta``) opens one
from a URL. The contract does not import its implementations.

Rules every method follows (stated once here, repeated only where they bend):

- Every operation is ONE database transaction: it happens completely or not at
  all. Serialization failures and lock timeouts of the database are retried
  invisibly with backoff; a caller never sees half an operation.
- Failures a Linux file system would report raise ``FsError`` carrying that
  errno (``ENOENT``, ``EEXIST``, ``ENOTDIR``, ``EISDIR``, ``ENOTEMPTY``,
  ``EINVAL``, ``EACCES``, ``EPERM``, ``ENAMETOOLONG``, ``EMLINK``,
  ``ENODATA``, ``ERANGE``, ``E2BIG``, ``EOPNOTSUPP``...). A raised error means
  the transaction was rolled back.
- ``ctx`` is the caller's credentials; the default ``ROOT_CTX`` bypasses
  permission checks as root does on Linux (execute only if some x bit is set).
- Names are ``bytes`` (no encoding is assumed). Times are integer nanoseconds
  since the epoch. Inode numbers and slice ids are positive 64-bit integers;
  inode numbers are never reused, so ``generation`` is constant.
- When a call returns, its transaction is committed: durable against a crash
  of the calling process always, against power loss per the backend's
  durability setting (see docs/metadata.md and ``MetaStore.durability``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

from shinglefs.meta.records import (
    BLOCK_SIZE,
    CHUNK_SIZE,
    F_OK,
    FIRST_COOKIE,
    IMMUTABLE,
    INLINE_SLICE_BIT,
    LINK_MAX,
    LOCAL_SERVER,
    NAME_MAX,
    R_OK,
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    REPAIR_AFTER_S,
    ROOT_CTX,
    ROOT_INO,
    SERVER_HEARTBEAT_S,
    SERVER_TIMEOUT_S,
    SYMLINK_MAX,
    TIERS,
    UTIME_NOW,
    UTIME_OMIT,
    W_OK,
    X_OK,
    XATTR_CREATE,
    XATTR_NAME_MAX,
    XATTR_REPLACE,
    XATTR_SIZE_MAX,
    ChunkInfo,
    ChunkMap,
    ChunkPiece,
    Created,
    Ctx,
    DirEntry,
    DirPolicy,
    DriveRecord,
    FormatInfo,
    InodeAttr,
    ReadPiece,
    RenameResult,
    Replica,
    ServerDrive,
    ServerRecord,
    Session,
    SessionInfo,
    SliceCommit,
    SliceInfo,
    SliceRef,
    SliceState,
    StatFs,
    UnlinkResult,
    is_inline_slice,
)

SLICE_RECORDS_BATCH = 500
"""The most slice ids one ``slice_records``, ``claim_orphans`` or ``touch_slices`` call takes."""


class ServerRegistry(ABC):
    """The storage servers of a file system as its metadata records them:
    membership (register, heartbeat, list, unregister), drive states, the
    cluster secret, and what a server's orphan sweep asks of the slice records
    (server/sweep.py). Part of every ``MetaStore``."""

    @abstractmethod
    def register_server(self, address: str, drives: Sequence[ServerDrive],
                        labels: Mapping[str, str] | None = None) -> int:
        """Register a starting storage server (``address`` = ``host:port`` clients
        connect to) with its drives and labels; returns its server id, live from
        now (heartbeat = now, not stopped).

        A server that registered before rejoins under its old id, its row
        updated (address, drives, labels, start time): the registration sharing
        the most drive uuids with ``drives``, else (drives without uuid) the one
        at the same address with the same drive specs. Otherwise a new id, never
        one used before. EINVAL for an empty address, no drives, repeated drive
        ids, a tier not in ``TIERS`` or labels that are not strings."""

    @abstractmethod
    def heartbeat_server(self, server_id: int, drives: Sequence[ServerDrive], *,
                         at_ns: int | None = None) -> None:
        """Mark the server alive and record its drives' figures (free bytes).
        ``at_ns``: when the figures were read, taken before reading them (default:
        now); it is the heartbeat's time, so a piece stored after it is known not
        to be in the figures however long the transaction waits for the
        database. ESTALE when the server is stopped or removed: it must
        ``register_server`` again."""

    @abstractmethod
    def list_servers(self, timeout_s: float = SERVER_TIMEOUT_S) -> list[ServerRecord]:
        """Every registered server by id, stopped and stale ones included; ``live``
        when it is not stopped and its last heartbeat is younger than
        ``timeout_s`` (by this host's clock)."""

    @abstractmethod
    def unregister_server(self, server_id: int, *, forget: bool = False) -> None:
        """A clean stop: the server is no longer live from now on. Its row (id,
        drives) stays so that it rejoins under the same id; ``forget`` removes
        the row for good (a server taken out of the cluster), its drive states
        with it. Idempotent."""

    @abstractmethod
    def forget_server(self, server_id: int, timeout_s: float = SERVER_TIMEOUT_S) -> int:
        """Take a server that is not live (``timeout_s``) out for good, in bounded
        transactions (meta/engine/servers.py): its replicas leave every slice record
        (as acknowledged deletions for TO_DELETE ones), then its drive states and its
        registration go. Returns the records changed. EBUSY while live; ENOENT for an
        id never registered. Idempotent: a rerun completes an interrupted one."""

    @abstractmethod
    def server_slices(self, server_id: int, after: int = -(1 << 63),
                      limit: int = 500) -> list[SliceInfo]:
        """The records (any state, every replica) of the slices with a replica on server
        ``server_id`` and an id above ``after`` (default: any), by id, at most ``limit`` (EINVAL past
        ``SLICE_RECORDS_BATCH``). Read-only: pages of what forgetting it changes."""

    @abstractmethod
    def set_drive_state(self, server_id: int, drive_id: int, state: str | None) -> None:
        """Record the state of drive ``drive_id`` of server ``server_id``:
        ``"offline"`` (left out of placement from the clients' next membership
        read, its slices copied to other drives by the servers: drained), or
        None (online again). Durable on return. EINVAL for another state;
        ENOENT when the server is not registered or has no such drive."""

    @abstractmethod
    def drive_states(self) -> dict[tuple[int, int], str]:
        """``{(server id, drive id): state}`` of every drive not online."""

    @abstractmethod
    def slice_records(self, slice_ids: Sequence[int]) -> dict[int, SliceInfo]:
        """The records (any state, with their replicas) of those of ``slice_ids``
        that have one, in one read; at most ``SLICE_RECORDS_BATCH`` ids.
        EINVAL for more. Read-only (a storage server's orphan sweep)."""

    @abstractmethod
    def claim_orphans(self, server_id: int, drive_id: int, lengths: Mapping[int, int],
                      hold_s: float) -> list[int]:
        """Record as deleted, in one transaction, the slices of ``lengths`` (id:
        stored length) that drive ``drive_id`` of server ``server_id`` holds and
        that have no record and an id below the next one meta hands out: each
        becomes a TO_DELETE record naming that drive as its only replica, queued
        for deletion with a lease of ``hold_s`` (no consumer pops it before).
        Returns the ids claimed; their bytes may be deleted once it returns
        (durable as the backend's commits are: ``sync`` for more). From then
        on registering one fails (EEXIST) and committing a reference to one
        fails (SliceStateError, ESTALE). An id that got a record meanwhile,
        or was never handed out (meta restored from an older backup), is
        left alone. At most ``SLICE_RECORDS_BATCH`` ids; EINVAL for more."""

    @abstractmethod
    def cluster_secret(self) -> str:
        """The cluster secret every storage server and client authenticates with
        (``shinglefs format`` creates it). A file system formatted without one
        gets a random one now, stored in one transaction that writes only an
        empty secret: concurrent first callers all get the one that committed.
        NotFormatted on an empty database."""


class MetaStore(ServerRegistry):
    """The metadata engine: namespace, chunk -> slice map, slices, sessions.

    Thread-safe: each thread uses its own connection. Process-safe: several
    processes (SQLite: on one host; PostgreSQL: anywhere) may open the same URL.
    A store must not be shared across ``fork``: open one in each process.
    """

    durability: str
    """One line stating what a committed transaction survives (backend setting)."""
    url_where: str
    """Where the metadata lives, without credentials (``sqlite3:///abs/meta.db``,
    ``postgresql://host:port/db``); relative drive paths are relative to a
    SQLite file's directory."""

    # ---- format and life cycle -------------------------------------------------

    @abstractmethod
    def format(
        self,
        name: str,
        uuid: str,
        chunk_size: int = CHUNK_SIZE,
        block_size: int = BLOCK_SIZE,
        schema_version: int | None = None,
        secret: str = "",
        *,
        capacity_bytes: int = 0,
    ) -> FormatInfo:
        """Create the schema, the format record and the root directory (ino 1,
        mode 0o755, owned by root). ``schema_version`` must be None or equal to
        the code's version (SchemaVersionError otherwise). ``chunk_size`` (the
        file-offset unit of the chunk map, default ``CHUNK_SIZE``) must be a
        positive multiple of ``block_size`` no larger than the store's largest
        slice, ``shinglefs.store.api.MAX_SLICE_SIZE`` (ChunkSizeError, nothing
        written, otherwise).

        Raises AlreadyFormatted if the database already holds a file system.
        """

    @abstractmethod
    def format_info(self) -> FormatInfo:
        """The format record. Raises NotFormatted on an empty database."""

    @abstractmethod
    def close(self) -> None:
        """Close every connection of this store; further calls fail."""

    @abstractmethod
    def set_drives(self, specs: Sequence[str], uuids: Sequence[str | None] | None = None) -> None:
        """Record the file system's drives (``KIND:PATH[:SIZE]`` specs) and the
        uuid each carries in its header (None: not known, a drive recorded
        before identities existed); a drive's id is its position. Replaces any
        earlier list. EINVAL for an empty spec or a uuid list of another length."""

    @abstractmethod
    def drives(self) -> list[str]:
        """The drive specs recorded by ``set_drives`` (position = drive id; empty
        when none were recorded)."""

    @abstractmethod
    def drive_records(self) -> list[DriveRecord]:
        """The drives recorded by ``set_drives``, spec and uuid, by drive id."""

    @abstractmethod
    def sync(self) -> None:
        """Make every transaction committed so far durable against power loss.

        SQLite with ``synchronous=normal`` (the default): an fsync of the WAL
        (and of its directory); PostgreSQL with ``synchronous=normal`` (the
        default, ``synchronous_commit = off``): one transaction whose COMMIT
        waits for the server's WAL flush, which covers every earlier commit;
        with ``synchronous=full`` commits are durable already and this
        returns at once. ``VFS.fsync`` calls it so an fsynced file's metadata
        survives a power cut.
        Raises ``MetaUnavailable`` when the flush fails."""

    # ---- namespace -------------------------------------------------------------

    @abstractmethod
    def lookup(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        """The inode named ``name`` in directory ``parent``.

        ``b"."`` is the directory itself and ``b".."`` its parent (root's is root).
        Raises ENOENT (no such entry or parent), ENOTDIR (parent not a
        directory), EACCES (no search permission on parent), ENAMETOOLONG, EINVAL.
        """

    @abstractmethod
    def getattr(self, ino: int) -> InodeAttr:
        """Attributes of ``ino`` (also of an unlinked-but-open inode). ENOENT if gone."""

    @abstractmethod
    def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
        ctx: Ctx = ROOT_CTX,
        open_for_write: bool = False,
        checked: bool = False,
    ) -> InodeAttr:
        """Change attributes in one transaction; None leaves a field alone.

        ``mode``: permission bits only (the type bits are kept); owner or root,
        else EPERM; a non-root caller outside the file's group loses S_ISGID.
        ``uid``/``gid`` (-1 = keep): root, or the owner giving the file to one
        of its own groups, else EPERM; any chown of a non-directory clears
        S_ISUID (and S_ISGID if group-executable), root's too. Times:
        ``UTIME_NOW`` = now, ``UTIME_OMIT`` (or None) = leave; both now needs
        ownership or write permission (EACCES), anything else (an explicit
        time, or now for one of them) needs ownership (EPERM). ``size``:
        truncate (see ``truncate``); needs write permission (EACCES) unless
        ``open_for_write`` (the caller holds a descriptor opened for writing:
        ftruncate), EISDIR on directories, EINVAL on other non-files or
        negative sizes; set-id bits as ``truncate``. ctime is set to now when
        anything changes. Returns the new attributes.

        ``checked``: the caller's right to this change was already checked by
        Linux's rules (the kernel of a ``default_permissions`` mount), so no
        EPERM/EACCES is raised here. The kernel sends changes a caller could
        not make by itself: the mode change clearing S_ISUID/S_ISGID when a
        non-owner writes or truncates, and "now" times that pyfuse3 hands over
        as explicit times. Types, sizes and the S_IS* clearing still apply.
        """

    @abstractmethod
    def mknod(
        self, parent: int, name: bytes, mode: int, rdev: int = 0, ctx: Ctx = ROOT_CTX
    ) -> InodeAttr:
        """Create a regular file, FIFO, socket or (root only, else EPERM) device
        node. A type of 0 means a regular file; S_IFDIR gives EPERM, other types
        EINVAL. EEXIST if the name exists; EACCES without write+search on parent.
        """

    @abstractmethod
    def mkdir(self, parent: int, name: bytes, mode: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        """Create a directory (nlink 2; the parent's nlink grows by one). Inherits
        the parent's DirPolicy and its S_ISGID group. EEXIST, EACCES, ENOENT,
        ENOTDIR, EMLINK (parent at LINK_MAX)."""

    def create(
        self, parent: int, name: bytes, mode: int, ctx: Ctx = ROOT_CTX, *,
        exclusive: bool = True, session: int | None = None,
        parent_seen: tuple[int, int, int] | None = None,
    ) -> InodeAttr:
        """``create_file``'s attributes of the file."""
        return self.create_file(parent, name, mode, ctx, exclusive=exclusive, session=session,
                                parent_seen=parent_seen).attr

    @abstractmethod
    def create_file(
        self, parent: int, name: bytes, mode: int, ctx: Ctx = ROOT_CTX, *,
        exclusive: bool = True, session: int | None = None,
        parent_seen: tuple[int, int, int] | None = None,
    ) -> Created:
        """Create a regular file: its attributes, and whether this call made it.

        ``exclusive`` (O_EXCL): EEXIST if the name exists. Without it an
        existing regular file is opened as is (EISDIR for a directory;
        ``Created.made`` False: the caller checks its access to it, never to
        the file it made). When ``session`` is given, the file is also opened
        for that session in the same transaction (see ``open_file``), so it
        can never be freed between create and open. ``parent_seen``: the
        parent's (mode, uid, gid) as the caller last saw them (a hint: the
        result is the same with or without it; right, it saves reading the
        parent -- a round trip on PostgreSQL).
        """

    @abstractmethod
    def unlink(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> UnlinkResult:
        """Remove a non-directory entry. EISDIR for a directory, ENOENT,
        EACCES, EPERM (sticky parent, caller owns neither parent nor inode).
        If that was the last link and the inode is open in some session, it
        stays (readable and writable) until the last close or session expiry;
        otherwise it is freed now and its slices are dereferenced (queued for
        deletion when their refcount reaches zero)."""

    @abstractmethod
    def rmdir(self, parent: int, name: bytes, ctx: Ctx = ROOT_CTX) -> UnlinkResult:
        """Remove an empty directory. ENOTDIR, ENOTEMPTY, ENOENT, EACCES, EPERM
        (sticky); EINVAL for ``b"."``, ENOTEMPTY for ``b".."``."""

    @abstractmethod
    def rename(
        self,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int = 0,
        ctx: Ctx = ROOT_CTX,
    ) -> RenameResult:
        """Atomically move an entry, replacing what the target name held.

        Linux semantics: RENAME_NOREPLACE -> EEXIST if the target exists;
        RENAME_EXCHANGE swaps the two entries (ENOENT if the target is
        missing); both flags or unknown bits -> EINVAL. A directory onto a
        non-directory -> ENOTDIR, a non-directory onto a directory -> EISDIR,
        onto a non-empty directory (or onto an ancestor of the source) ->
        ENOTEMPTY. Moving a directory into its own subtree -> EINVAL. Checks
        run in Linux's order (ancestry, then permissions and types, then
        emptiness). ``.``/``..`` as either name -> EBUSY. Two names
        of the same inode: success, nothing changes. Permissions: write+search
        on both parents, sticky-bit rules on source and replaced target, and
        write permission on a directory moved to another parent.
        The replaced inode loses a link; if that was its last, it is freed (its
        slices dereferenced) unless it is open, in which case freeing is
        deferred to its last close. Returns what was replaced.
        """

    @abstractmethod
    def link(self, ino: int, new_parent: int, new_name: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        """Add a hard link. EPERM for a directory, EMLINK at LINK_MAX links,
        EEXIST, ENOENT (inode gone or already unlinked), EACCES."""

    @abstractmethod
    def snapshot(self, src: int, parent: int, name: bytes, ctx: Ctx = ROOT_CTX, *,
                 read_only: bool = False) -> InodeAttr:
        """Make ``name`` in ``parent`` a copy of ``src`` (a file, or a directory
        with everything below it) that shares its slices: metadata only, one
        transaction, the source as committed at that instant. Modes, owners,
        times (ctime: now), xattrs, symlinks, hard links inside the tree and
        directory policy are copied, retention rules are not; ``read_only``
        clears every write bit of the copy and makes every inode of it
        ``IMMUTABLE`` (a copy of a read-only copy is writable unless asked
        for read-only too). Writes to either side later never
        show in the other. A user's (not root's) copy is theirs, without
        set-id bits or extended attributes other than ``user.*``/``system.*``.
        EEXIST, ENOENT (also for an unlinked ``src``), ENOTDIR, EACCES (``ctx``
        may not read the tree or write ``parent``), EPERM (a user's copy of a
        device node; ``parent`` immutable), EINVAL (``parent`` inside ``src``),
        EMLINK; a refusal changes nothing. Returns the copy's attributes."""

    @abstractmethod
    def make_writable(self, ino: int, ctx: Ctx = ROOT_CTX) -> int:
        """Clear ``IMMUTABLE`` on the read-only snapshot ``ino`` and every inode
        of it below (it becomes an ordinary tree that can be changed or
        removed; its modes stay as they are), in one transaction. EINVAL when
        ``ino`` is not immutable (an ordinary tree, even one holding a
        snapshot, is refused whole), EPERM when it is inside a read-only
        snapshot (only a whole snapshot thaws) or ``ctx`` is neither root nor
        its owner, ENOENT for an inode that is gone. Returns how many inodes
        were made writable."""

    @abstractmethod
    def symlink(self, parent: int, name: bytes, target: bytes, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        """Create a symbolic link to ``target`` (1..4095 bytes: ENOENT if empty,
        ENAMETOOLONG if longer). Mode 0o777 | S_IFLNK, size = len(target)."""

    @abstractmethod
    def readlink(self, ino: int) -> bytes:
        """The target of a symlink. EINVAL if ``ino`` is not a symlink, ENOENT."""

    @abstractmethod
    def readdir(
        self, ino: int, cookie: int = 0, limit: int = 1024, ctx: Ctx = ROOT_CTX
    ) -> list[DirEntry]:
        """Up to ``limit`` entries of directory ``ino`` after ``cookie`` (0 = from
        the start), in cookie order, with attributes. ``.`` and ``..`` are not
        returned (cookies 1 and 2 are reserved for them). Each entry's cookie
        is assigned once at insertion and grows monotonically per directory,
        so resuming after a cookie never repeats or skips an entry that
        existed throughout. ENOTDIR, ENOENT, EACCES (no read permission)."""

    @abstractmethod
    def access(self, ctx: Ctx, ino: int, mask: int) -> None:
        """Raise EACCES unless ``ctx`` may access ``ino`` for ``mask``
        (R_OK|W_OK|X_OK, or F_OK for existence). Owner, then group
        (primary or supplementary), then other bits decide; root may read
        and write anything and execute if any x bit is set (or a directory)."""

    # ---- extended attributes -----------------------------------------------------

    @abstractmethod
    def getxattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> bytes:
        """The value of an extended attribute. ENODATA if absent; ERANGE for an
        empty or too long name; EOPNOTSUPP outside the user., trusted.,
        security., system. namespaces; EACCES without read permission."""

    @abstractmethod
    def setxattr(
        self, ino: int, name: bytes, value: bytes, flags: int = 0, ctx: Ctx = ROOT_CTX
    ) -> None:
        """Set an extended attribute. XATTR_CREATE -> EEXIST if present,
        XATTR_REPLACE -> ENODATA if absent; E2BIG above XATTR_SIZE_MAX; ERANGE,
        EOPNOTSUPP as for getxattr; EACCES without write permission. Sets ctime."""

    @abstractmethod
    def listxattr(self, ino: int, ctx: Ctx = ROOT_CTX) -> list[bytes]:
        """Names of all extended attributes, sorted. ENOENT."""

    @abstractmethod
    def removexattr(self, ino: int, name: bytes, ctx: Ctx = ROOT_CTX) -> None:
        """Remove an extended attribute. ENODATA if absent; EACCES. Sets ctime."""

    # ---- directory policy ------------------------------------------------------

    @abstractmethod
    def set_policy(self, ino: int, policy: DirPolicy, ctx: Ctx = ROOT_CTX) -> None:
        """Store a directory's policy (tier, retention, replication goal), replacing
        the one it had, durable on return. ENOTDIR; EPERM unless owner or root;
        EINVAL for a goal outside 1..16 or a tier not in ``TIERS``."""

    @abstractmethod
    def get_policy(self, ino: int) -> DirPolicy:
        """A directory's own policy (``replicas`` None: it inherits its goal).
        ENOTDIR, ENOENT."""

    @abstractmethod
    def placement_tiers(self, inos: Iterable[int]) -> dict[int, str]:
        """The tier new slices of each of ``inos`` go to, for those that have
        one: the ``DirPolicy.tier`` of the nearest directory at or above it (a
        file: at or above the directory it was created in), so a tier set on a
        tree applies to everything below that sets none. Others, and unknown
        inodes, are left out. A read."""

    @abstractmethod
    def replica_goals(self, inos: Iterable[int]) -> dict[int, int]:
        """The replication goal of each of ``inos`` (files or directories) that has
        one: the ``DirPolicy.replicas`` of the nearest directory at or above it
        (a file: above its ``parent``). Inodes with none set, or gone, are left
        out (the caller applies the default). A read; never raises for an
        unknown inode."""

    # ---- statfs ------------------------------------------------------------------

    @abstractmethod
    def statfs(self, capacity_bytes: int | None = None) -> StatFs:
        """Counters exact under concurrency. Capacity is ``capacity_bytes`` when
        given, else the last ``set_capacity`` value (0 if never set)."""

    @abstractmethod
    def set_capacity(self, capacity_bytes: int) -> None:
        """Record the raw capacity the storage layer offers (for statfs)."""

    # ---- sessions and open files -----------------------------------------------

    @abstractmethod
    def register_session(self, info: SessionInfo) -> int:
        """Register a mounted client; returns its session id (heartbeat = now)."""

    @abstractmethod
    def heartbeat(self, session: int) -> None:
        """Mark ``session`` alive now. ESTALE if it expired (the client must
        re-register and treat its open files as lost)."""

    @abstractmethod
    def unregister_session(self, session: int) -> list[int]:
        """Clean end of a session: close all its files (freeing unlinked ones)
        and remove it. Returns the inodes freed. Idempotent."""

    @abstractmethod
    def list_sessions(self) -> list[Session]:
        """All registered sessions with the inodes each holds open."""

    @abstractmethod
    def open_file(self, session: int, ino: int) -> None:
        """Record that ``session`` opened ``ino`` (counted: open twice, close
        twice). ENOENT if the inode is gone, ESTALE if the session is unknown."""

    @abstractmethod
    def close_file(self, session: int, ino: int) -> bool:
        """Undo one ``open_file``. If this was the last open anywhere and the
        inode has no links left, free it (slices dereferenced) and return True."""

    @abstractmethod
    def close_files(self, session: int, inos: Sequence[int]) -> list[int]:
        """``close_file`` for each of ``inos`` (an inode may repeat: one close
        each), in one transaction; returns the inodes freed."""

    @abstractmethod
    def expire_sessions(self, timeout_s: float) -> list[int]:
        """Remove sessions whose last heartbeat is older than ``timeout_s``,
        close their files (freeing unlinked inodes nobody else holds open).
        Returns the expired session ids."""

    # ---- ids ---------------------------------------------------------------------

    @abstractmethod
    def next_slice_id(self) -> int:
        """A fresh slice id, from a local batch refilled by one transaction.
        Ids are unique across processes and hosts; a crash only leaves gaps."""

    @abstractmethod
    def raise_slice_ids(self, past: int) -> bool:
        """Make every slice id handed out from now on (by any client) greater
        than ``past``: the drives hold a slice with that id, which metadata
        restored from an older dump does not know. Returns whether the
        counter had to move. Durable when it returns."""

    # ---- slices (storage side) ---------------------------------------------------

    @abstractmethod
    def add_slice(self, info: SliceInfo) -> None:
        """Register a slice (normally state WRITING, refcount 0) and its replicas.
        EEXIST if the id is known."""

    @abstractmethod
    def set_slice_replicas(self, slice_id: int, replicas: Sequence[Replica]) -> None:
        """Replace the replica set of a slice. ENOENT if unknown."""

    @abstractmethod
    def get_slice(self, slice_id: int) -> SliceInfo:
        """A slice with its replicas. ENOENT if unknown (or already acknowledged deleted)."""

    @abstractmethod
    def stored_slices(self, after: int = 0, limit: int = 1000) -> list[SliceInfo]:
        """Committed slices stored on drives (not inline) with ids above ``after``,
        in id order, at most ``limit``, each with its replicas: pages of the whole
        slice registry for re-replication and reports. Read-only."""

    @abstractmethod
    def touch_slices(self, slice_ids: Sequence[int]) -> int:
        """A live writer vouches for its slices: those of ``slice_ids`` still WRITING
        count as registered now (``abandoned_slices``), in one statement; others are
        left alone. Returns how many were touched; EINVAL past ``SLICE_RECORDS_BATCH``."""

    @abstractmethod
    def abandoned_slices(self, older_than_s: float, limit: int = 1000) -> list[SliceInfo]:
        """Slices still WRITING, never referenced, registered or last touched
        (``touch_slices``) more than ``older_than_s`` ago: left by a writer that died
        or went silent mid-slice (choose an age well above live writers' touches). Read-only."""

    @abstractmethod
    def discard_slices(self, slice_ids: Sequence[int]) -> list[int]:
        """Queue abandoned slices for deletion (see ``abandoned_slices``). Only a
        slice that is still WRITING with refcount 0 is queued, so a slice that
        got committed meanwhile is left alone. Returns the ids queued."""

    @abstractmethod
    def pop_deletions(self, limit: int = 1000, lease_s: float = 60.0) -> list[SliceInfo]:
        """Up to ``limit`` slices queued for deletion (refcount 0, state TO_DELETE),
        each leased to the caller for ``lease_s``: a slice popped but not
        acknowledged within the lease (consumer crashed) is offered again.
        Crash-safe: nothing leaves the queue before ``ack_deletions``."""

    @abstractmethod
    def ack_deletions(self, slice_ids: Sequence[int]) -> None:
        """The storage layer deleted these slices: forget them and their replicas. Idempotent."""

    @abstractmethod
    def pop_deletions_on(self, server_id: int, limit: int = 500,
                         lease_s: float = 60.0) -> list[SliceInfo]:
        """``pop_deletions`` for storage server ``server_id``: up to ``limit`` of
        the queued TO_DELETE slices whose lease is over and that have a replica
        on that server, each leased for ``lease_s`` as there. Each comes with
        only its replicas on that server (the copies it is to delete)."""

    @abstractmethod
    def ack_replica_deletions(self, server_id: int, slice_ids: Sequence[int]) -> None:
        """Server ``server_id`` deleted (flushed) its copies of these slices: drop
        their replicas on it. A slice left with no replica is forgotten with its
        queue entry (``ack_deletions``); one with replicas elsewhere stays queued
        with its lease ended, for their holders. SliceStateError (ESTALE) for a
        slice not TO_DELETE, nothing changed. Idempotent."""

    # ---- content map -------------------------------------------------------------

    @abstractmethod
    def commit_slice(
        self,
        ino: int,
        chunk_index: int,
        piece: SliceRef,
        new_size: int,
        mtime_ns: int | None = None,
        *,
        group: int = 0,
        slice_length: int | None = None,
        replicas: Sequence[Replica] = (),
    ) -> InodeAttr:
        """Append ``piece`` to chunk ``chunk_index``'s overlay and grow the file
        to at least ``new_size``, in one transaction; also sets mtime/ctime
        (now when None) and takes a reference on the slice (registering it as
        COMMITTED with ``group`` and length ``slice_length`` or
        ``slice_offset + length`` if unknown). EINVAL for a piece outside the
        chunk or empty, or a ``new_size`` short of the piece's end;
        EISDIR/EINVAL for a non-file, ENOENT, ESTALE
        (SliceStateError) if the slice is already queued for deletion.
        ``replicas`` are recorded for the slice in the same transaction (a
        writer that never called ``add_slice`` for it: one transaction per
        small file instead of two). Returns the new attributes."""

    def commit_slices(self, commits: Sequence[SliceCommit]) -> list[InodeAttr]:
        """``commit_slice`` for each of ``commits``, all in one transaction (group
        commit): all of them or none. Slices of one file keep their order (a
        later one wins where they overlap). Returns each one's new attributes,
        in the order given. Raises what ``commit_slice`` raises for the first
        that fails; the caller retries the others one by one to learn which."""
        return [
            self.commit_slice(c.ino, c.chunk_index, c.piece, c.new_size, c.mtime_ns,
                              group=c.group, slice_length=c.slice_length,
                              replicas=c.replicas)
            for c in commits
        ]

    @abstractmethod
    def truncate(self, ino: int, size: int, ctx: Ctx = ROOT_CTX) -> InodeAttr:
        """Set the file size. Down: references past ``size`` are dropped or
        trimmed, slices no longer referenced are dereferenced (and queued for
        deletion at zero); bytes later re-exposed by growing read as zeros. Up:
        size only (a hole). mtime/ctime = now; a non-root caller clears S_ISUID,
        and S_ISGID if group-executable or outside the file's group (Linux's
        rule, ``open(O_TRUNC)`` too). EISDIR, EINVAL, EACCES."""

    @abstractmethod
    def read_map(self, ino: int, offset: int, length: int) -> list[ReadPiece]:
        """Resolve ``[offset, offset + length)`` (clipped to the file size) into
        contiguous pieces in file order covering it exactly: slice pieces and
        holes (slice_id None). Empty past EOF. ENOENT, EISDIR."""

    @abstractmethod
    def get_chunk(self, ino: int, chunk_index: int) -> ChunkMap:
        """A chunk's stored overlay and version (version 0, no refs if never written)."""

    @abstractmethod
    def compaction_candidates(self, min_refs: int = 8, limit: int = 100) -> list[ChunkInfo]:
        """Chunks holding at least ``min_refs`` references, most fragmented first."""

    @abstractmethod
    def replace_chunk(
        self,
        ino: int,
        chunk_index: int,
        old_refs_version: int,
        new_piece: SliceRef | Sequence[SliceRef],
        *,
        group: int = 0,
        slice_length: int | None = None,
        registered: bool = False,
        replaced: Sequence[tuple[int, SliceRef]] | None = None,
    ) -> ChunkMap:
        """Compaction: replace a chunk's whole overlay by ``new_piece`` (one or
        several non-overlapping references), if and only if the chunk is still
        at ``old_refs_version`` (else ChunkChanged, errno EAGAIN, nothing
        changed). Old references are dereferenced; the new slice is referenced
        as in ``commit_slice``; ``registered`` (its writer called ``add_slice``):
        as a registered ``SliceCommit``, refused (SliceStateError, ESTALE) once
        its record is queued for deletion or gone. Returns the new map.

        With ``replaced`` (``(seq, ref)`` pairs of ``get_chunk``'s map at
        ``old_refs_version``: a run of consecutive references ending with its
        newest), only those are replaced, and only if each is still stored
        unchanged with no other reference between their seqs (else
        ChunkChanged): the new pieces take their place in the overlay, under
        every reference committed since ``old_refs_version`` and over the older
        ones kept, so a writer that keeps committing never makes the swap fail.
        ``new_piece`` then holds at most ``len(replaced)`` references (EINVAL)."""


__all__ = [
    "BLOCK_SIZE", "CHUNK_SIZE", "FIRST_COOKIE", "F_OK", "IMMUTABLE", "INLINE_SLICE_BIT",
    "LINK_MAX",
    "LOCAL_SERVER", "NAME_MAX", "RENAME_EXCHANGE", "RENAME_NOREPLACE", "REPAIR_AFTER_S",
    "ROOT_CTX", "ROOT_INO", "R_OK", "SERVER_HEARTBEAT_S", "SERVER_TIMEOUT_S",
    "SLICE_RECORDS_BATCH", "SYMLINK_MAX", "TIERS", "UTIME_NOW", "UTIME_OMIT", "W_OK",
    "XATTR_CREATE", "XATTR_NAME_MAX", "XATTR_REPLACE", "XATTR_SIZE_MAX", "X_OK", "ChunkInfo",
    "ChunkMap", "ChunkPiece", "Created", "Ctx", "DirEntry", "DirPolicy", "DriveRecord", "FormatInfo",
    "InodeAttr", "MetaStore", "ReadPiece", "RenameResult", "Replica", "ServerDrive",
    "ServerRecord", "ServerRegistry", "Session", "SessionInfo", "SliceCommit", "SliceInfo",
    "SliceRef", "SliceState", "StatFs", "UnlinkResult", "is_inline_slice",
]
