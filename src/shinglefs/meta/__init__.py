"""The metadata engine: namespace, chunk map, slices, sessions, on SQL.

Owns: every namespace operation as one transaction with Linux errno
semantics, the chunk -> slice overlay, slice reference counts and the deletion
queue, client sessions, id allocation, statfs counters. Backends: SQLite
(embedded default) and PostgreSQL (psycopg 3), selected by URL.

Rooms: ``records`` (the values of the contract) and ``api`` (the abstract
``MetaStore``, re-exporting the records); ``engine/`` (``SqlMetaStore``, one
module per concern); ``backend`` (connections, transactions, retries, URL
parsing); ``schema`` (every SQL statement); ``connect`` (``open_meta``: URL ->
store); ``overlay``; ``check``/``fsck``/``dump`` (maintenance); ``errors``.

May call: ``shinglefs.errors``; ``shinglefs.zoned.fileio`` (the durability
calls: the backend's WAL and directory syncs); ``shinglefs.store.api`` only for
``MAX_SLICE_SIZE``, which ``format`` checks the chunk size against.
"""

from shinglefs.meta.api import (
    ROOT_CTX,
    ROOT_INO,
    Ctx,
    DirEntry,
    InodeAttr,
    MetaStore,
    ReadPiece,
    SliceInfo,
    SliceRef,
)
from shinglefs.meta.connect import open_meta
from shinglefs.meta.engine.format import check_chunk_size
from shinglefs.meta.errors import FsError, MetaError

__all__ = [
    "ROOT_CTX",
    "ROOT_INO",
    "Ctx",
    "DirEntry",
    "FsError",
    "InodeAttr",
    "MetaError",
    "MetaStore",
    "ReadPiece",
    "SliceInfo",
    "SliceRef",
    "check_chunk_size",
    "open_meta",
]
