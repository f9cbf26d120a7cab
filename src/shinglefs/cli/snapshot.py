"""The ``snapshot`` command: an instant copy-on-write copy of a file or a
directory tree (``MetaStore.snapshot``: metadata only, the slices shared).

``shinglefs snapshot URL SRC DST`` with absolute paths inside the file
system, or ``shinglefs snapshot SRC DST`` with both paths on one ShingleFS
mount of this host (the mount names its metadata URL). The copy is made in
the metadata database by this process, as root (like ``policy``: whoever can
open the metadata URL administers the file system), so it works with the
file system mounted or not; a mount shows the new name at its next lookup.
Errors are typed and printed by the boundary in ``cli.main``: a path that does
not exist, a name that does, a tree copied into itself are exit 1; a
malformed argument exit 2.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import time
from collections.abc import Callable
from typing import TypeVar

import typer

from shinglefs.errors import UsageError

T = TypeVar("T")


USAGE = ("shinglefs snapshot ./mnt/corpus ./mnt/corpus@v1 (paths on a mount), or "
         "shinglefs snapshot META_URL /corpus /corpus@v1")


def _split(path: str) -> tuple[str, str]:
    """(parent path, last name) of absolute ``path``; UsageError for the root."""
    parent, name = posixpath.split(posixpath.normpath(path))
    if not name or name in (".", ".."):
        raise UsageError(f"{path!r} names no new entry", hint="e.g. /corpus@v1")
    return parent, name


def _entry_on_mount(path: str) -> tuple[str, str]:
    """(metadata URL, absolute path inside the file system) of the entry
    ``path`` names on a mount: its directory resolved, its last name kept, so
    a symlink is the link itself (as with a URL) and a new name need not exist."""
    from shinglefs.cli.policy import path_on_mount

    absolute = os.path.abspath(path)
    head, tail = os.path.split(absolute)
    if not tail or os.path.ismount(absolute):
        return path_on_mount(absolute, USAGE)
    meta_url, inside = path_on_mount(head, USAGE)
    return meta_url, posixpath.join(inside, tail)


def _named(call: Callable[[], T], path: str, dst: str | None = None) -> T:
    """``call()``, its ``FsError`` retold with the paths the user gave, not inodes."""
    from shinglefs.meta.errors import FsError

    try:
        return call()
    except FsError as exc:
        why = {errno.ENOENT: f"{path} does not exist",
               errno.ENOTDIR: f"a part of {path} is not a directory",
               errno.EEXIST: f"{dst} exists",
               errno.EINVAL: f"{dst} is inside {path}: a tree cannot be copied into itself",
               errno.EACCES: f"{path}: permission denied"}.get(exc.errno)
        if why is None:
            raise
        raise FsError(exc.errno, why) from exc


def snapshot_command(
    first: str = typer.Argument(
        ..., metavar="URL|SRC", help="metadata URL, or the source on a mount"),
    second: str = typer.Argument(
        ..., metavar="SRC|DST", help="with a URL: the source, an absolute path in the file "
                                     "system; else the new copy on the same mount"),
    third: str | None = typer.Argument(
        None, metavar="[DST]", help="with a URL: the new copy, an absolute path"),
    read_only: bool = typer.Option(
        False, "--read-only", help="clear every write permission bit in the copy"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Copy a file or a directory tree instantly, sharing its data (copy on write)."""
    from shinglefs.cli.policy import opened_meta, resolve_path

    if third is None:
        meta_url, src = _entry_on_mount(first)
        dst_url, dst = _entry_on_mount(second)
        if dst_url != meta_url:
            raise UsageError(f"{first!r} and {second!r} are not on the same file system",
                             hint="a snapshot stays in its file system; copy across with cp")
    else:
        meta_url, src, dst = first, second, third
    parent_path, name = _split(dst)
    started = time.perf_counter()
    with opened_meta(meta_url) as meta:
        src_ino = _named(lambda: resolve_path(meta, src), src)
        parent = _named(lambda: resolve_path(meta, parent_path), parent_path)
        attr = _named(lambda: meta.snapshot(src_ino, parent, os.fsencode(name),
                                            read_only=read_only),
                      src, dst)
    took = time.perf_counter() - started
    out = {"source": src, "copy": dst, "ino": attr.ino, "read_only": read_only,
           "seconds": round(took, 3)}
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"{dst}: a copy of {src}{' (read-only)' if read_only else ''}, sharing its data "
               f"({took:.2f} s)")


def register(app: typer.Typer) -> None:
    app.command("snapshot")(snapshot_command)
