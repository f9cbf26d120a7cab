"""``SqlMetaStore``: the metadata engine, composed of one class per concern.

Each concern lives in its own module and implements its part of ``MetaStore``
on the shared ``SqlCore`` (one backend, one way to run a transaction, id
allocation, freeing):

| concern | module | methods |
|---|---|---|
| namespace | ``namespace`` | lookup, mknod, mkdir, create, symlink, link, unlink, rmdir, readlink, readdir |
| rename | ``rename`` | rename (its checks, then its moves) |
| attributes and permissions | ``attrs``, ``permissions`` | getattr, setattr, truncate, access, set/get_policy |
| extended attributes | ``xattrs`` | get/set/list/removexattr |
| chunk map and slices | ``chunks`` | commit_slice(s), read_map, get_chunk, compaction, add/get_slice, replicas, ids |
| sessions and the deletion queue | ``sessions`` | sessions, open files, abandoned/discard, pop/ack deletions |
| storage servers | ``servers`` | register/heartbeat/list/unregister_server, server_slices, forget_server, cluster_secret |
| format and statfs | ``format`` | format, format_info, sync, close, drives, statfs, capacity, migrations |
| snapshots | ``snapshot`` | snapshot (a copy-on-write copy of a file or a tree) |
"""

from __future__ import annotations

from shinglefs.meta.backend import Backend
from shinglefs.meta.engine.attrs import AttributeOps
from shinglefs.meta.engine.chunks import ChunkOps
from shinglefs.meta.engine.format import FormatOps
from shinglefs.meta.engine.namespace import NamespaceOps
from shinglefs.meta.engine.rename import RenameOps
from shinglefs.meta.engine.servers import ServerOps
from shinglefs.meta.engine.sessions import SessionOps
from shinglefs.meta.engine.snapshot import SnapshotOps
from shinglefs.meta.engine.xattrs import XattrOps


class SqlMetaStore(
    NamespaceOps, RenameOps, AttributeOps, XattrOps, ChunkOps, SessionOps, ServerOps, FormatOps,
    SnapshotOps,
):
    """The metadata engine on SQLite or PostgreSQL (see ``backend``).

    Opening checks the schema: an empty database opens (``format`` it); an
    older schema is migrated in place; another version raises
    ``SchemaVersionError`` (and closes ``backend``).
    """

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self._open_existing()
