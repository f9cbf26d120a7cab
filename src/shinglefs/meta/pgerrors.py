"""What a PostgreSQL error means for a caller: a lost connection (the
transaction may be retried) or an unreachable server, database or user (a
``MetaUnavailable`` with the cause and a next step). psycopg is imported
only when a PostgreSQL error is examined."""

from __future__ import annotations

from urllib.parse import urlsplit

from shinglefs.meta.errors import MetaUnavailable


def connection_lost(exc: BaseException) -> bool:
    """The connection broke (as opposed to e.g. a statement timeout)."""
    import psycopg

    conn_closed = isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.CrashShutdown)
    text = str(exc)
    return (
        conn_closed
        or "server closed the connection" in text
        or "terminating connection" in text
        or "connection is closed" in text
        or "connection is lost" in text
        or "consuming input failed" in text
    )


def pg_unavailable(url: str, exc: BaseException) -> MetaUnavailable:
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or 5432
    db = parts.path.lstrip("/") or "(default)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "does not exist" in text and "database" in text:
        return MetaUnavailable(
            f'PostgreSQL database "{db}" does not exist on {host}:{port}',
            hint=f'create it: psql -h {host} -p {port} -c "CREATE DATABASE {db}"',
        )
    if "role" in text and "does not exist" in text:
        user = parts.username or "(your login name)"
        return MetaUnavailable(
            f"PostgreSQL at {host}:{port} has no user {user}: {text}",
            hint="fix the user in the URL (postgresql://user@host:port/db), or create it: "
                 f'psql -h {host} -p {port} -c "CREATE ROLE {user} LOGIN"',
        )
    if "bad value" in text or ("invalid" in text and ("option" in text or "parameter" in text)):
        return MetaUnavailable(
            f"the PostgreSQL URL has a bad parameter: {text}",
            hint="fix the ?key=value part of the URL (postgresql://user@host:port/db?...)",
        )
    if "password" in text or "authentication" in text:
        return MetaUnavailable(
            f"PostgreSQL at {host}:{port} refused the credentials: {text}",
            hint="fix user/password in the URL (postgresql://user:pass@host:port/db)",
        )
    return MetaUnavailable(
        f"cannot reach PostgreSQL at {host}:{port}: {text}",
        hint="start the server, or fix host/port in the URL (postgresql://user@host:port/db)",
    )
