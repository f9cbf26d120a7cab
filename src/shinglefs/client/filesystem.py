"""Formatting and opening a file system: the metadata engine plus the drives recorded at format time.

The drives of a file system are recorded in its metadata at format time
(meta's drives table, ``MetaStore.set_drives``), so ``open_filesystem(meta_url)``
needs nothing else. A drive's id is its position in that list; slice replicas
in meta name it as ``("local", "<id>")``.
"""

from __future__ import annotations

import uuid as _uuid

from shinglefs.client.config import ClientConfig
from shinglefs.client.errors import NotAFileSystem
from shinglefs.client.groups import GroupPolicy
from shinglefs.client.vfs import VFS
from shinglefs.meta.api import CHUNK_SIZE, MetaStore, open_meta
from shinglefs.meta.errors import AlreadyFormatted, NotFormatted
from shinglefs.server.node import StorageNode


def format_filesystem(
    meta_url: str,
    drives: list[str],
    name: str = "shinglefs",
    *,
    chunk_size: int = CHUNK_SIZE,
    zone_size: int | None = None,
) -> None:
    """Format each drive (``KIND:PATH[:SIZE]``) as a slice store and create the metadata.

    ``chunk_size`` (default 64 MiB) is the file-offset unit of the chunk map;
    a slice never crosses a chunk. Smaller values are for tests only.
    ``zone_size`` applies to emulated drives created here (default 256 MiB).

    Refuses (``AlreadyFormatted``) before touching any drive when the metadata
    already holds a file system. Raises ``DriveInUse`` if a drive is locked by
    a running process, ``UsageError`` for an empty drive list.
    """
    from shinglefs.errors import UsageError

    if not drives:
        raise UsageError("format needs at least one drive", hint="e.g. emulated:/data/d0.img:64G")
    meta = open_meta(meta_url)
    try:
        try:
            info = meta.format_info()
        except NotFormatted:
            pass
        else:
            raise AlreadyFormatted(
                f"{meta_url} already holds file system {info.name!r} ({info.uuid})",
                hint="use a fresh metadata database, or open the existing file system",
            )
        node = StorageNode.open(list(enumerate(drives)), create=True, zone_size=zone_size)
        try:
            capacity = node.stats().capacity_bytes
        finally:
            node.close()
        meta.format(name, str(_uuid.uuid4()), chunk_size=chunk_size, capacity_bytes=capacity)
        meta.set_capacity(capacity)
        meta.set_drives(list(drives))
    finally:
        meta.close()


def recorded_drives(meta: MetaStore) -> list[str]:
    """The drive specs recorded at format time (position = drive id)."""
    drives = meta.drives()
    if not drives:
        raise NotAFileSystem(
            "the metadata names no drives", hint="format it with `shinglefs format`"
        )
    return drives


def open_filesystem(
    meta_url: str,
    *,
    config: ClientConfig | None = None,
    mountpoint: str = "",
    groups: GroupPolicy | None = None,
) -> VFS:
    """Open the metadata, the recorded drives as an in-process node, register a session.

    ``groups`` replaces the default lifetime-group rule (docs/client.md).
    Raises ``MetaURLError``/``MetaUnavailable`` (bad or unreachable URL),
    ``NotFormatted``, ``NotAFileSystem`` (no drive list), ``DriveInUse`` (a
    drive's lock is held by another process, named by pid), and the drives'
    own errors; nothing stays open on failure.
    """
    meta = open_meta(meta_url)
    try:
        meta.format_info()
        drives = recorded_drives(meta)
        node = StorageNode.open(list(enumerate(drives)))
        try:
            return VFS(meta, node, config, mountpoint=mountpoint, groups=groups)
        except BaseException:
            node.close()
            raise
    except BaseException:
        meta.close()
        raise
