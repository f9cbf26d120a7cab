"""The SQL metadata engine: ``SqlMetaStore``, one ``MetaStore`` over any backend.

Owns: every operation of ``shinglefs.meta.api.MetaStore`` as one transaction
on a ``shinglefs.meta.backend.Backend``, split by concern (``store.py`` has
the map): the namespace, rename, attributes and permissions, xattrs, the chunk
map and slices, sessions and the deletion queue, storage-server membership
and the cluster secret, format and statfs; all on
``core.SqlCore`` (transactions, ids, row locks, freeing an inode).

May call: ``shinglefs.meta.api``/``records`` (the contract), ``backend``
(transactions), ``schema`` (every SQL statement), ``overlay`` (resolving a
chunk), ``errors``. Never opens a URL: ``shinglefs.meta.connect`` does.
"""

from shinglefs.meta.engine.store import SqlMetaStore

__all__ = ["SqlMetaStore"]
