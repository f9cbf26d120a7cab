"""The ``snapshot`` command: an instant copy-on-write copy of a file or a
directory tree (``MetaStore.snapshot``: metadata only, the slices shared).

``shinglefs snapshot SRC DST`` with both paths on one ShingleFS mount of
this host asks that mount's daemon to make the copy (fuse/requests.py): it
runs as the caller, with the caller's permissions, after the mount has
committed what it still buffers, and needs no access to the metadata
database, so any user of a shared mount can version their own data.
``shinglefs snapshot URL SRC DST``, with absolute paths inside the file
system, makes it in the metadata database from this process, as root (like
``policy``: whoever can open the metadata URL administers the file system),
mounted or not; a mount shows the new name at its next lookup.
``shinglefs snapshot --delete PATH`` removes a read-only snapshot on a mount:
the daemon makes it writable (``MetaStore.make_writable``: root or its
owner), then the tree is removed through the mount like ``rm -r``; a path
that is no read-only snapshot is refused and kept.
Errors are typed and printed by the boundary in ``cli.main``: a path that does
not exist, a name that does, a tree copied into itself are exit 1; a
malformed argument exit 2.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import stat
import time
from collections.abc import Callable
from typing import TypeVar

import typer

from shinglefs.errors import UsageError

T = TypeVar("T")


USAGE = ("shinglefs snapshot ./mnt/corpus ./mnt/corpus@v1 (paths on a mount), or "
         "shinglefs snapshot META_URL /corpus /corpus@v1; "
         "shinglefs snapshot --delete ./mnt/corpus@v1")


def _split(path: str) -> tuple[str, str]:
    """(parent path, last name) of absolute ``path``; UsageError for the root.
    The parent is kept as written (``resolve_path`` walks its ``..``)."""
    parent, name = posixpath.split(path.rstrip("/") or "/")
    if not name or name in (".", ".."):
        raise UsageError(f"{path!r} names no new entry", hint="e.g. /corpus@v1")
    return parent, name


def _as_written(path: str) -> str:
    """``path`` made absolute but not normalized, so that the kernel walks each
    of its names: ``x/../d`` needs a directory ``x``, and ``link/..`` is the
    parent of the link's target (``os.path.abspath`` drops ``x/..`` unread)."""
    return os.path.join(os.getcwd(), path).rstrip("/") or "/"


def _entry_on_mount(path: str) -> tuple[str, str]:
    """(metadata URL, absolute path inside the file system) of the entry
    ``path`` names on a mount: its directory resolved (as the kernel walks
    it), its last name kept, so a symlink is the link itself (as with a URL)
    and a new name need not exist."""
    from shinglefs.cli.policy import path_on_mount

    absolute = os.path.abspath(path)
    shown = repr(path) if path == absolute else f"{path!r} ({absolute})"
    written = _as_written(path)
    head, tail = os.path.split(written)
    if tail in ("", ".", "..") or os.path.ismount(written):
        return path_on_mount(written, USAGE, shown=shown)
    meta_url, inside = path_on_mount(head, USAGE, shown=shown)
    return meta_url, posixpath.join(inside, tail)


def _why(code: int, path: str, dst: str) -> str | None:
    """What an errno of a snapshot of ``path`` to ``dst`` means, in their names."""
    return {errno.ENOENT: f"{path} does not exist",
            errno.ENOTDIR: f"a part of {path} is not a directory",
            errno.EEXIST: f"{dst} exists",
            errno.EINVAL: f"{dst} is inside {path}: a tree cannot be copied into itself",
            errno.EACCES: f"{path} or {posixpath.dirname(dst)}: permission denied",
            errno.EPERM: f"{posixpath.dirname(dst)} is a read-only snapshot (or inside "
                         f"one), {path} holds a device node (only root copies one), or "
                         f"{posixpath.dirname(dst)} is another user's sticky directory",
            errno.EROFS: f"{dst}: the mount is read-only",
            errno.EMLINK: f"{posixpath.dirname(dst)} has too many subdirectories"}.get(code)


def _named(call: Callable[[], T], path: str, dst: str | None = None) -> T:
    """``call()``, its ``FsError`` retold with the paths the user gave, not inodes."""
    from shinglefs.meta.errors import FsError

    try:
        return call()
    except FsError as exc:
        why = _why(exc.errno, path, dst or path)
        if why is None:
            raise
        raise FsError(exc.errno, why) from exc


def _ask_mount(directory: str, request: bytes, value: bytes, why: Callable[[int], str],
               older: str) -> None:
    """Send ``request`` (fuse/requests.py) to the mount daemon through
    ``directory``; an errno it answers becomes ``FsError(errno, why(errno))``.
    A daemon that knows the request never stores it; an older one did: that
    is taken back and refused (ENOTSUP, ``older``)."""
    from shinglefs.meta.errors import FsError

    try:
        os.setxattr(directory, request, value)
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise FsError(code, why(code)) from exc
    try:
        os.getxattr(directory, request)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.removexattr(directory, request)
    raise FsError(errno.ENOTSUP, f"{older}: unmount and mount it again")


def _through_mount(first: str, second: str, read_only: bool) -> tuple[str, str, int | None]:
    """Ask the mount holding ``first`` and ``second`` to make the copy
    (fuse/requests.py): as the caller, after the mount's buffered writes.
    Returns (source, copy) inside the file system and the copy's inode (None
    when it was renamed away before this looked)."""
    from shinglefs.cli.policy import walked
    from shinglefs.fuse.requests import SNAPSHOT_XATTR, snapshot_request
    from shinglefs.meta.errors import FsError

    meta_url, src = _entry_on_mount(first)
    dst_url, dst = _entry_on_mount(second)
    if dst_url != meta_url:
        raise UsageError(f"{first!r} and {second!r} are not on the same file system",
                         hint="a snapshot stays in its file system; copy across with cp")
    walked(first)
    _split(dst)
    here, name = os.path.split(_as_written(second))  # the kernel walks its '..'
    try:  # the request goes to the copy's directory: it must be one
        code = 0 if stat.S_ISDIR(os.stat(here).st_mode) else errno.ENOTDIR
    except OSError as exc:
        code = errno.ENOTDIR if exc.errno == errno.ENOTDIR else errno.ENOENT
    if code:
        where = (posixpath.dirname(dst) if ".." not in second.split("/")
                 else f"the directory of {second}")
        raise FsError(code, f"{where} " + (
            "is not a directory" if code == errno.ENOTDIR else "does not exist"))
    _ask_mount(here, SNAPSHOT_XATTR,
               snapshot_request(os.fsencode(src), os.fsencode(name), read_only),
               lambda code: _why(code, src, dst) or f"{dst}: {os.strerror(code)}",
               f"the mount of {first} runs an older ShingleFS that cannot make snapshots")
    try:
        return src, dst, os.lstat(second).st_ino
    except FileNotFoundError:  # made, and already renamed or removed by someone else
        return src, dst, None


def _delete_through_mount(path: str) -> tuple[str, int]:
    """Remove the read-only snapshot at ``path`` on a mount: the mount makes it
    writable as the caller (fuse/requests.py), then it is removed like ``rm -r``.
    Returns its path inside the file system and the entries removed."""
    from shinglefs.cli.policy import walked
    from shinglefs.fuse.requests import WRITABLE_XATTR
    from shinglefs.meta.errors import FsError

    _, inside = _entry_on_mount(path)
    if inside == "/":
        raise UsageError(f"{path} is the root of its file system, not a snapshot",
                         hint="name the read-only snapshot, e.g. ./mnt/corpus@v1")
    absolute = _as_written(path)  # walked by the kernel: x/../s is not s when x is missing
    here, name = os.path.split(absolute)
    if name in (".", ".."):
        raise UsageError(f"{path!r} does not name the snapshot itself",
                         hint="name the read-only snapshot, e.g. ./mnt/corpus@v1")
    walked(path)
    why = {errno.ENOENT: f"{inside} does not exist",
           errno.EINVAL: f"{inside} is not a read-only snapshot (nothing was removed; "
                         "remove an ordinary tree with rm -r)",
           errno.EPERM: f"{inside}: not deleted: only root or its owner may delete a "
                        "read-only snapshot, and only a whole one",
           errno.EACCES: f"{posixpath.dirname(inside)}: permission denied"}
    stuck = _not_removable(absolute)
    if stuck is not None:  # refused while it is still read-only and whole
        raise FsError(errno.EPERM, f"{inside}: {stuck}, which only root may remove")
    _ask_mount(here, WRITABLE_XATTR, os.fsencode(name),
               lambda code: why.get(code, f"{inside}: {os.strerror(code)}"),
               f"the mount of {path} runs an older ShingleFS that cannot delete snapshots")
    try:
        return inside, _remove_tree(absolute)
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise FsError(code, f"{inside}: removing it failed ({os.strerror(code)}: "
                            f"{exc.filename}); it is writable now: remove the rest with "
                            "rm -r") from exc


def _not_removable(path: str) -> str | None:
    """Why the caller could not remove the tree at ``path`` once writable (a
    user gives a directory back its write bit, which only its owner may),
    or None. Root removes anything."""
    if os.geteuid() == 0 or not os.path.isdir(path) or os.path.islink(path):
        return None
    failed: list[OSError] = []
    for top, _dirs, _files in os.walk(path, onerror=failed.append):
        if os.lstat(top).st_uid != os.geteuid():
            return f"it holds {top}, another user's directory"
    if failed:
        return f"it holds {failed[0].filename}, a directory you cannot list"
    return None


def _remove_tree(path: str) -> int:
    """``rm -r path``; a read-only copy's directories lack write permission,
    which their owner gives back first. Returns the entries removed."""
    import shutil

    if not os.path.isdir(path) or os.path.islink(path):
        os.unlink(path)
        return 1
    count = 1
    for top, dirs, files in os.walk(path):
        mode = os.lstat(top).st_mode
        if os.geteuid() != 0 and mode & (stat.S_IWUSR | stat.S_IXUSR) != (stat.S_IWUSR
                                                                          | stat.S_IXUSR):
            os.chmod(top, stat.S_IMODE(mode) | stat.S_IWUSR | stat.S_IXUSR)
        count += len(dirs) + len(files)
    shutil.rmtree(path)
    return count


def snapshot_command(
    first: str = typer.Argument(
        ..., metavar="URL|SRC", help="metadata URL, or the source on a mount (with --delete: "
                                     "the read-only snapshot to remove)"),
    second: str | None = typer.Argument(
        None, metavar="SRC|DST", help="with a URL: the source, an absolute path in the file "
                                      "system; else the new copy on the same mount"),
    third: str | None = typer.Argument(
        None, metavar="[DST]", help="with a URL: the new copy, an absolute path"),
    read_only: bool = typer.Option(
        False, "--read-only", help="an immutable copy: no one, root included, may change it "
                                   "until it is deleted with --delete"),
    delete: bool = typer.Option(
        False, "--delete", help="remove the read-only snapshot FIRST (a path on a mount)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Copy a file or a directory tree instantly, sharing its data (copy on write)."""
    from shinglefs.cli.policy import opened_meta, resolve_path

    started = time.perf_counter()
    if delete:
        if second is not None or read_only:
            raise UsageError("--delete takes one path on a mount, and no other option",
                             hint="name only the read-only snapshot, by its path on a mount")
        from shinglefs.cli.status import _is_url

        if _is_url(first):
            raise UsageError(f"{first!r} is a metadata URL: --delete takes the read-only "
                             "snapshot's path on a mount", hint=USAGE)
        gone, count = _delete_through_mount(first)
        took = time.perf_counter() - started
        if as_json:
            typer.echo(json.dumps({"deleted": gone, "entries": count,
                                   "seconds": round(took, 3)}))
        else:
            typer.echo(f"{gone}: deleted ({count} entries, {took:.2f} s)")
        return
    if second is None:
        raise UsageError("a snapshot needs a source and a new name", hint=USAGE)
    if third is None:
        src, dst, ino = _through_mount(first, second, read_only)
    else:
        src, dst = second, third
        if not dst.startswith("/"):  # its parent was '' in the message
            raise UsageError(f"{dst!r} is not an absolute path inside the file system",
                             hint=f"e.g. /{dst.lstrip('./') or 'snap'} (the path as the mount "
                                  "shows it below its root)")
        parent_path, name = _split(dst)
        with opened_meta(first) as meta:
            src_ino = _named(lambda: resolve_path(meta, src), src)
            parent = _named(lambda: resolve_path(meta, parent_path), parent_path)
            ino = _named(lambda: meta.snapshot(src_ino, parent, os.fsencode(name),
                                               read_only=read_only).ino, src, dst)
    took = time.perf_counter() - started
    out = {"source": src, "copy": dst, "ino": ino, "read_only": read_only,
           "seconds": round(took, 3)}
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"{dst}: a copy of {src}{' (read-only)' if read_only else ''}, sharing its data "
               f"({took:.2f} s)")


def register(app: typer.Typer) -> None:
    app.command("snapshot")(snapshot_command)
