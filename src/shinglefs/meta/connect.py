"""Open a ``MetaStore`` from a metadata URL: the one place that knows both the
contract (``api``) and its implementation (``engine``), so neither imports
the other.

URLs: ``sqlite3:///abs/path/meta.db`` (``sqlite:///...`` is accepted as an
alias) and ``postgresql://user@host:port/db`` (alias ``postgres://``);
``backend.backend_from_url`` parses them.
"""

from __future__ import annotations

from shinglefs.meta.api import MetaStore
from shinglefs.meta.backend import backend_from_url
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import MetaUnavailable


def open_meta(url: str, **options: object) -> MetaStore:
    """Open the metadata engine named by ``url``.

    ``sqlite3:///abs/path/meta.db`` (embedded, several processes on one host)
    or ``postgresql://user@host:port/db`` (psycopg 3 + a connection pool).
    Query options: ``?synchronous=normal|full`` (both backends; default
    ``normal``: a commit survives any client's crash at once and power loss
    once ``MetaStore.sync()`` returns — on PostgreSQL, ``synchronous_commit =
    off``, so a server crash or power cut may lose the un-synced commits of
    the last ~3 x ``wal_writer_delay``; ``full``: every commit flushed before
    it returns), ``?pool_max=N`` (PostgreSQL); other PostgreSQL query
    parameters go to libpq.
    Raises MetaURLError (bad or unknown URL), MetaUnavailable (server
    unreachable, database or directory missing) or SchemaVersionError, each
    with a hint. An unformatted database opens fine; ``format`` it first.
    """
    backend = backend_from_url(url, **options)
    try:
        return SqlMetaStore(backend)
    except MetaUnavailable:
        backend.close()
        raise


__all__ = ["open_meta"]
