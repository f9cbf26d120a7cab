"""The Python API: a path-based file system over the VFS, no FUSE needed.

    import shinglefs, torch
    with shinglefs.connect("sqlite3:///data/meta.db") as fs:
        with fs.open("/ckpt/step-100/model.pt", "wb") as f:
            torch.save(state_dict, f)
        fs.replace("/ckpt/step-100.tmp", "/ckpt/step-100")

Files are real ``io`` objects (``BufferedReader``/``BufferedWriter``/
``BufferedRandom`` over :class:`ShingleRawFile`, ``TextIOWrapper`` in text
mode) supporting seek/tell/readinto/truncate. Errors are ``OSError``
subclasses with the POSIX errno (``FileNotFoundError``, ``FileExistsError``,
``IsADirectoryError``...) chained to the typed ShingleFS error, so code written
for ``os``/``open`` handles them unchanged.

Paths are absolute or relative to the root, ``/``-separated; symlinks are
followed (40 levels at most, then ELOOP) except where ``lstat``/``unlink``/
``readlink`` say otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import logging
import os
import stat as _stat
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from typing import IO, Any

from shinglefs.client.config import ClientConfig
from shinglefs.client.errors import ClientClosed, ForkedClient, TooManySymlinks
from shinglefs.client.filesystem import absolute_meta_url, open_filesystem
from shinglefs.client.vfs import VFS, SetAttrChanges
from shinglefs.errors import ShingleError, UsageError
from shinglefs.meta.api import ROOT_CTX, ROOT_INO, X_OK, Ctx, InodeAttr, StatFs
from shinglefs.meta.records import permits

log = logging.getLogger(__name__)

MAX_SYMLINK_DEPTH = 40
OPEN_STALE_RETRIES = 16  # opens of a name replaced meanwhile (``ShingleFS.open_raw``)
WRITE_BUFFER = 4 * 1024 * 1024
READ_BUFFER = 1024 * 1024


@contextlib.contextmanager
def _as_oserror(path: str | None = None, path2: str | None = None) -> Iterator[None]:
    try:
        yield
    except ShingleError as exc:
        code = exc.errno or errno.EIO
        # The client's own state says what it is ("the ShingleFS client is shut
        # down"); ESHUTDOWN's strerror spoke of a transport endpoint.
        why = str(exc) if isinstance(exc, ClientClosed | ForkedClient) else os.strerror(code)
        err = OSError(code, why, path, None, path2) if path2 else OSError(code, why, path)
        raise err from exc


def _split(path: str) -> list[str]:
    """``path``'s components ('.' and empty ones dropped). Like ``os``'s
    functions: ``bytes`` and ``os.PathLike`` are accepted, anything else is a
    TypeError, and the empty path names nothing (ENOENT), not the root."""
    if not isinstance(path, str):
        try:
            path = os.fsdecode(os.fspath(path))
        except TypeError:
            raise TypeError(f"a path must be str, bytes or os.PathLike, not "
                            f"{type(path).__name__}") from None
    if not path:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (empty path)", path)
    return [p for p in path.split("/") if p not in ("", ".")]


def _stat_result(attr: InodeAttr) -> os.stat_result:
    return os.stat_result(
        (
            attr.mode,
            attr.ino,
            0,
            attr.nlink,
            attr.uid,
            attr.gid,
            attr.size,
            attr.atime_ns // 1_000_000_000,
            attr.mtime_ns // 1_000_000_000,
            attr.ctime_ns // 1_000_000_000,
            attr.atime_ns / 1e9,
            attr.mtime_ns / 1e9,
            attr.ctime_ns / 1e9,
            attr.atime_ns,
            attr.mtime_ns,
            attr.ctime_ns,
            4096,
            attr.blocks,
            attr.rdev,
        )
    )


class ShingleRawFile(io.RawIOBase):
    """An open ShingleFS file as a raw, seekable binary stream (one VFS handle)."""

    def __init__(self, fs: ShingleFS, fh: int, ino: int, path: str, flags: int) -> None:
        super().__init__()
        self._fs = fs
        self._vfs = fs.vfs
        self.fh = fh
        self.ino = ino
        self.name = path
        self._flags = flags
        self._pos = 0
        acc = flags & os.O_ACCMODE
        self._readable = acc in (os.O_RDONLY, os.O_RDWR)
        self._writable = acc in (os.O_WRONLY, os.O_RDWR)
        self._append = bool(flags & os.O_APPEND)
        if self._append:
            self._pos = self._size()

    @property
    def mode(self) -> str:
        if self._append:
            return "ab+" if self._readable else "ab"
        if self._readable and self._writable:
            return "rb+"
        return "wb" if self._writable else "rb"

    def _size(self) -> int:
        with _as_oserror(self.name):
            return self._vfs.getattr(self.ino).size

    def readable(self) -> bool:
        return self._readable

    def writable(self) -> bool:
        return self._writable

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        if not self._readable:
            raise io.UnsupportedOperation("not readable")
        view = memoryview(buffer).cast("B")
        with _as_oserror(self.name):
            data = self._vfs.read(self.fh, self._pos, len(view))
        n = len(data)
        view[:n] = data
        self._pos += n
        return n

    def readall(self) -> bytes:
        chunks = []
        while True:
            with _as_oserror(self.name):
                data = self._vfs.read(self.fh, self._pos, 8 * 1024 * 1024)
            if not data:
                break
            self._pos += len(data)
            chunks.append(data)
        return b"".join(chunks)

    def write(self, data: Any) -> int:
        self._checkClosed()
        if not self._writable:
            raise io.UnsupportedOperation("not writable")
        with _as_oserror(self.name):
            n = self._vfs.write(self.fh, self._pos, data)
            self._pos = self._vfs.getattr(self.ino).size if self._append else self._pos + n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size() + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(errno.EINVAL, "negative seek position", self.name)
        self._pos = pos
        return pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        self._checkClosed()
        if not self._writable:
            raise io.UnsupportedOperation("not writable")
        size = self._pos if size is None else size
        with _as_oserror(self.name):
            self._vfs.setattr(self.ino, SetAttrChanges(size=size), self.fh, self._fs.ctx)
        return size

    def flush(self) -> None:
        if not self.closed and self._writable:
            with _as_oserror(self.name):
                self._vfs.flush(self.fh)

    def fsync(self) -> None:
        """Make this file's data and metadata durable (like ``os.fsync``)."""
        self._checkClosed()
        with _as_oserror(self.name):
            self._vfs.fsync(self.fh, False)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("ShingleFS files have no OS descriptor (use a FUSE mount)")

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._writable:
                self.flush()
        finally:
            super().close()
            if not self._vfs.inherited:  # a forked child's copy: the parent's to close
                with _as_oserror(self.name):
                    self._vfs.release(self.fh)


def _lookup_dir(vfs: VFS, parent: InodeAttr | None, name: bytes, ctx: Ctx) -> InodeAttr:
    """``vfs.lookup`` for resolving a path through ``parent`` (None: the root's
    attributes): a directory resolved in the last ``DIR_NAMES_TTL`` seconds is
    answered from ``vfs.dir_names`` when ``ctx`` may search ``parent`` by its
    remembered mode (a mount's kernel trusts its names the same way); anything
    else is a ``lookup``, whose directory is remembered."""
    names = vfs.dir_names
    if parent is None:
        attr = names.get(0, b"/")
        if attr is None:
            attr = vfs.getattr(ROOT_INO)
            names.put(0, b"/", attr)
        return attr
    attr = names.get(parent.ino, name)
    if attr is not None and permits(parent.mode, parent.uid, parent.gid, ctx, X_OK):
        return attr
    attr = vfs.lookup(parent.ino, name, ctx)
    names.put(parent.ino, name, attr)
    return attr


def _parse_mode(mode: str) -> tuple[int, bool]:
    """``open()`` mode string -> (os flags, binary)."""
    chars = set(mode)
    if not chars <= set("rwxabt+") or len(mode) != len(chars):
        raise ValueError(f"invalid mode: {mode!r}")
    kinds = chars & set("rwxa")
    if len(kinds) != 1 or ("b" in chars and "t" in chars):
        raise ValueError(f"invalid mode: {mode!r}")
    kind = kinds.pop()
    plus = "+" in chars
    flags = {
        "r": os.O_RDONLY,
        "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
        "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    }[kind]
    if plus:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    return flags, "b" in chars


class _Sized:
    """``size``: the file's size in meta now (fsspec's file objects have one;
    its ``cat_file`` with a negative offset and ``read_block`` read it)."""

    @property
    def size(self) -> int:
        raw: ShingleRawFile = self.raw  # type: ignore[attr-defined]  # the io base's
        return raw._size()


class _SizedReader(_Sized, io.BufferedReader):
    pass


class _SizedWriter(_Sized, io.BufferedWriter):
    pass


class _SizedRandom(_Sized, io.BufferedRandom):
    pass


class ShingleFS:
    """A ShingleFS file system addressed by paths. Thread-safe.

    Closed by ``close()``, by ``with``, when garbage-collected, and at
    interpreter exit — whichever comes first: files the application left open
    are closed (their buffered bytes committed) and then the file system is
    released (``release``, default ``vfs.shutdown``; ``connect`` passes one
    that closes the process-wide opened file system with its last user).
    """

    def __init__(self, vfs: VFS, ctx: Ctx = ROOT_CTX,
                 release: Callable[[], None] | None = None) -> None:
        self.vfs = vfs
        self.ctx = ctx
        self._files: weakref.WeakSet[IO[Any]] = weakref.WeakSet()
        # No reference to self in the finalizer, so it can run at collection too.
        self._finalizer = weakref.finalize(self, _close_all, self._files,
                                           release or vfs.shutdown)
        _closed_before_thread_pools(self)

    # ------------------------------------------------------------------ resolution
    def _walk(self, parts: list[str], follow_last: bool, depth: int = 0, *,
              fresh_last: bool = True) -> InodeAttr:
        """The inode ``parts`` names. Directories on the way come from the VFS's
        name memo (``_lookup_dir``: at most ``DIR_NAMES_TTL`` old, like a
        mount's names); the last component, unless ``fresh_last`` is False, is
        looked up in meta (its attributes are fresh, as ``stat`` wants)."""
        vfs = self.vfs
        attr = _lookup_dir(vfs, None, b"/", self.ctx)
        stack = list(reversed(parts))
        while stack:
            name = stack.pop()
            parent = attr
            if stack or not fresh_last:
                attr = _lookup_dir(vfs, parent, os.fsencode(name), self.ctx)
            else:
                attr = vfs.lookup(parent.ino, os.fsencode(name), self.ctx)
            if attr.is_symlink and (stack or follow_last):
                depth += 1
                if depth > MAX_SYMLINK_DEPTH:
                    raise TooManySymlinks(name)
                target = os.fsdecode(vfs.readlink(attr.ino, self.ctx))
                attr = _lookup_dir(vfs, None, b"/", self.ctx) if target.startswith("/") else parent
                stack.extend(reversed(_split(target)))
        return attr

    def _resolve(self, path: str, follow: bool = True) -> InodeAttr:
        with _as_oserror(path):
            return self._walk(_split(path), follow)

    def _parent(self, path: str) -> tuple[int, bytes]:
        parts = _split(path)
        if not parts:
            raise OSError(errno.EBUSY, "the root has no parent", path)
        with _as_oserror(path):
            parent = self._walk(parts[:-1], True, fresh_last=False)
        if not parent.is_dir:
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        return parent.ino, os.fsencode(parts[-1])

    # ------------------------------------------------------------------ files
    def open(
        self,
        path: str,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        *,
        perm: int = 0o644,
    ) -> IO[Any]:
        """Open a file like the builtin ``open`` (modes r w x a, + b t)."""
        flags, binary = _parse_mode(mode)
        raw = self.open_raw(path, flags, perm)
        if buffering == 0:
            if not binary:
                raw.close()
                raise ValueError("can't have unbuffered text I/O")
            return raw  # type: ignore[return-value]
        file: Any
        if raw.readable() and raw.writable():
            file = _SizedRandom(raw, buffering if buffering > 1 else WRITE_BUFFER)
        elif raw.writable():
            file = _SizedWriter(raw, buffering if buffering > 1 else WRITE_BUFFER)
        else:
            file = _SizedReader(raw, buffering if buffering > 1 else READ_BUFFER)
        if not binary:
            file = io.TextIOWrapper(
                file, encoding=encoding or "utf-8", errors=errors, newline=newline,
                line_buffering=buffering == 1,
            )
        self._files.add(file)
        return file

    def open_raw(self, path: str, flags: int, perm: int = 0o644) -> ShingleRawFile:
        """Open with ``os.open``-style flags; returns the unbuffered raw file.
        The inode a name led to may be gone by the time it is opened (another
        client unlinked it or renamed a file over it: ESTALE): the path is
        resolved again and opened once more, up to ``OPEN_STALE_RETRIES``
        times. (The kernel retries once; so did this, and a name replaced
        back to back by another writer gave the reader ESTALE.)"""
        for _ in range(OPEN_STALE_RETRIES - 1):
            try:
                return self._open_raw_once(path, flags, perm)
            except OSError as exc:
                if exc.errno != errno.ESTALE:
                    raise
        return self._open_raw_once(path, flags, perm)

    def _open_raw_once(self, path: str, flags: int, perm: int) -> ShingleRawFile:
        if flags & os.O_CREAT and not flags & os.O_EXCL:
            # Create or open in one transaction; a symbolic link there (EEXIST)
            # is followed below.
            parent, name = self._parent(path)
            try:
                with _as_oserror(path):
                    fh, attr = self.vfs.create(parent, name, _stat.S_IFREG | (perm & 0o7777),
                                               flags, self.ctx)
                return ShingleRawFile(self, fh, attr.ino, path, flags)
            except FileExistsError:
                pass
        if flags & os.O_CREAT:
            # The name was absent when looked up: create it exclusively (no second
            # lookup inside the transaction); if another client made it meanwhile,
            # look again and open what is there.
            for _ in range(MAX_SYMLINK_DEPTH):
                parent, name, existing = self._find_for_create(path, flags)
                if existing is not None:
                    attr = existing
                    break
                try:
                    with _as_oserror(path):
                        fh, attr = self.vfs.create(parent, name, _stat.S_IFREG | (perm & 0o7777),
                                                   flags | os.O_EXCL, self.ctx)
                except FileExistsError:
                    if flags & os.O_EXCL:
                        raise
                    continue
                return ShingleRawFile(self, fh, attr.ino, path, flags)
            else:
                raise OSError(errno.EAGAIN, "the name kept changing while being created", path)
        else:
            attr = self._resolve(path)
        if attr.is_dir:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        with _as_oserror(path):
            fh = self.vfs.open(attr.ino, flags & ~(os.O_CREAT | os.O_EXCL), self.ctx)
        return ShingleRawFile(self, fh, attr.ino, path, flags)

    def _find_for_create(self, path: str, flags: int) -> tuple[int, bytes, InodeAttr | None]:
        """Where ``open(path, flags | O_CREAT)`` creates: (parent, name, the inode
        already there or None). Like Linux: without O_EXCL a (dangling) symlink
        is followed and its target created; with O_EXCL the name is not looked
        up (``create`` says EEXIST for any existing name, symlink included)."""
        for _ in range(MAX_SYMLINK_DEPTH):
            parent, name = self._parent(path)
            if flags & os.O_EXCL:
                return parent, name, None
            try:
                with _as_oserror(path):
                    attr = self.vfs.lookup(parent, name, self.ctx)
            except FileNotFoundError:
                return parent, name, None
            if not attr.is_symlink:
                return parent, name, attr
            with _as_oserror(path):
                link = self.vfs.readlink(attr.ino, self.ctx).decode(errors="surrogateescape")
            where = "/".join(_split(path)[:-1])
            path = link if link.startswith("/") else f"/{where}/{link}"
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    def read_bytes(self, path: str) -> bytes:
        with self.open(path, "rb") as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> int:
        with self.open(path, "wb") as f:
            return f.write(data)

    # ------------------------------------------------------------------ namespace
    def stat(self, path: str) -> os.stat_result:
        return _stat_result(self._resolve(path))

    def lstat(self, path: str) -> os.stat_result:
        return _stat_result(self._resolve(path, follow=False))

    def exists(self, path: str) -> bool:
        try:
            self._resolve(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def isdir(self, path: str) -> bool:
        try:
            return self._resolve(path).is_dir
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path: str) -> bool:
        try:
            return self._resolve(path).is_file
        except (FileNotFoundError, NotADirectoryError):
            return False

    def listdir(self, path: str = "/") -> list[str]:
        return [name for name, _attr in self.scandir_attrs(path)]

    def scandir_attrs(self, path: str = "/") -> list[tuple[str, InodeAttr]]:
        """Entries of a directory with their attributes (one listing, no per-entry stat)."""
        attr = self._resolve(path)
        with _as_oserror(path):
            fh = self.vfs.opendir(attr.ino, self.ctx)
            try:
                return [
                    (e.name.decode(errors="surrogateescape"), e.attr)
                    for e in self.vfs.readdir(fh, 0)
                ]
            finally:
                self.vfs.releasedir(fh)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        parent, name = self._parent(path)
        with _as_oserror(path):
            self.vfs.mkdir(parent, name, mode & 0o7777, self.ctx)

    def makedirs(self, path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        parts = _split(path)
        for i in range(1, len(parts) + 1):
            sub = "/" + "/".join(parts[:i])
            try:
                self.mkdir(sub, mode)
            except FileExistsError:
                if i == len(parts) and not exist_ok:
                    raise
                if not self.isdir(sub):
                    raise

    def rename(self, src: str, dst: str) -> None:
        """Atomically rename ``src`` to ``dst``, replacing ``dst`` (POSIX rename)."""
        p_old, n_old = self._parent(src)
        p_new, n_new = self._parent(dst)
        with _as_oserror(src, dst):
            self.vfs.rename(p_old, n_old, p_new, n_new, 0, self.ctx)

    replace = rename

    def unlink(self, path: str) -> None:
        parent, name = self._parent(path)
        with _as_oserror(path):
            self.vfs.unlink(parent, name, self.ctx)

    remove = unlink

    def rmdir(self, path: str) -> None:
        parent, name = self._parent(path)
        with _as_oserror(path):
            self.vfs.rmdir(parent, name, self.ctx)

    def symlink(self, target: str, path: str) -> None:
        """Create ``path`` as a symlink to ``target`` (argument order of ``os.symlink``)."""
        parent, name = self._parent(path)
        with _as_oserror(path):
            self.vfs.symlink(parent, name, os.fsencode(target), self.ctx)

    def readlink(self, path: str) -> str:
        attr = self._resolve(path, follow=False)
        with _as_oserror(path):
            return self.vfs.readlink(attr.ino, self.ctx).decode(errors="surrogateescape")

    def link(self, src: str, dst: str) -> None:
        """Hard link: ``dst`` becomes another name of ``src`` (``os.link`` order)."""
        attr = self._resolve(src, follow=False)
        parent, name = self._parent(dst)
        with _as_oserror(src, dst):
            self.vfs.link(attr.ino, parent, name, self.ctx)

    def snapshot(self, src: str, dst: str, *, read_only: bool = False,
                 follow_symlinks: bool = False) -> None:
        """Make ``dst`` an instant copy of the file or tree ``src`` that shares its
        data (``MetaStore.snapshot``): what is committed now (closed or fsynced
        files); later writes to either never show in the other. A symlink
        ``src`` is copied as a link unless ``follow_symlinks``. A ``read_only``
        copy is immutable: every change is refused (PermissionError), root's
        too, until ``make_writable``."""
        attr = self._resolve(src, follow=follow_symlinks)
        parent, name = self._parent(dst)
        with _as_oserror(src, dst):
            self.vfs.snapshot(attr.ino, parent, name, self.ctx, read_only=read_only)

    def make_writable(self, path: str) -> int:
        """Make the read-only snapshot at ``path`` (not followed if a symlink) an
        ordinary tree that can be changed or removed (``MetaStore.make_writable``;
        root or its owner); returns how many of its inodes were read-only."""
        attr = self._resolve(path, follow=False)
        with _as_oserror(path):
            return self.vfs.make_writable(attr.ino, self.ctx)

    def truncate(self, path: str, size: int) -> None:
        attr = self._resolve(path)
        with _as_oserror(path):
            self.vfs.setattr(attr.ino, SetAttrChanges(size=size), None, self.ctx)

    def chmod(self, path: str, mode: int) -> None:
        """Like ``os.chmod``: the permission bits of ``mode``; ``OverflowError`` for a
        mode no C int holds (as ``os.chmod``; its low bits were taken silently)."""
        if not -(1 << 31) <= mode < (1 << 31):
            raise OverflowError(f"mode {mode} does not fit a C int")
        attr = self._resolve(path)
        with _as_oserror(path):
            self.vfs.setattr(attr.ino, SetAttrChanges(mode=mode & 0o7777), None, self.ctx)

    def getxattr(self, path: str, name: str) -> bytes:
        attr = self._resolve(path)
        with _as_oserror(path):
            return self.vfs.getxattr(attr.ino, name.encode(), self.ctx)

    def setxattr(self, path: str, name: str, value: bytes, flags: int = 0) -> None:
        attr = self._resolve(path)
        with _as_oserror(path):
            self.vfs.setxattr(attr.ino, name.encode(), value, flags, self.ctx)

    def listxattr(self, path: str) -> list[str]:
        attr = self._resolve(path)
        with _as_oserror(path):
            return [n.decode() for n in self.vfs.listxattr(attr.ino, self.ctx)]

    def removexattr(self, path: str, name: str) -> None:
        """Like ``os.removexattr``: ENODATA when ``path`` has no such attribute."""
        attr = self._resolve(path)
        with _as_oserror(path):
            self.vfs.removexattr(attr.ino, name.encode(), self.ctx)

    def walk(self, top: str = "/", topdown: bool = True) -> Iterator[tuple[str, list[str], list[str]]]:
        """Like ``os.walk`` (symlinks to directories are not followed)."""
        try:
            entries = self.scandir_attrs(top)
        except (FileNotFoundError, NotADirectoryError):
            return
        dirs = [n for n, a in entries if a.is_dir]
        files = [n for n, a in entries if not a.is_dir]
        if topdown:
            yield top, dirs, files
        for d in dirs:
            yield from self.walk(top.rstrip("/") + "/" + d, topdown)
        if not topdown:
            yield top, dirs, files

    def statvfs(self) -> StatFs:
        """Capacity and free bytes of the drives (what can still be written), the
        files' bytes (``used_bytes``: their logical sizes), inode counts."""
        with _as_oserror("/"):
            return self.vfs.statfs(self.ctx)

    # ------------------------------------------------------------------ life cycle
    @property
    def closed(self) -> bool:
        return not self._finalizer.alive or self.vfs.closed

    def close(self) -> None:
        """Close files the application left open (their buffered bytes are
        committed), then release the file system (the drives and the metadata
        once no other handle of this process uses them). Idempotent."""
        self._finalizer()

    def __enter__(self) -> ShingleFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Every handle not closed yet, closed at interpreter exit *before* Python shuts
# its thread pools down (``threading._register_atexit``, which
# concurrent.futures itself uses; run in reverse order of registration, so
# ours, registered after that module's import, goes first). An ``atexit``
# hook runs after that: a joined client's last pieces, sent through the
# pools to the servers, would be refused ("cannot schedule new futures after
# shutdown") and its files left empty. ``weakref.finalize``'s own exit hook
# stays as the fallback.
_live: weakref.WeakSet[ShingleFS] = weakref.WeakSet()
_live_lock = threading.Lock()
_exit_hook: list[bool] = []


def _closed_before_thread_pools(fs: ShingleFS) -> None:
    with _live_lock:
        _live.add(fs)
        if _exit_hook:
            return
        with contextlib.suppress(RuntimeError, AttributeError):  # shutting down already
            threading._register_atexit(_close_live)  # type: ignore[attr-defined]
            _exit_hook.append(True)


def _forget_the_parents() -> None:
    """In a forked child (``os.register_at_fork``): what the parent opened stays
    the parent's. Its handles' finalizers are detached (closing them here would
    end the parent's session), ``connect`` opens the child's own file system,
    and the locks, which another thread of the parent may have held at the
    fork, are new. The parent's objects are kept referenced, never collected."""
    global _live_lock, _opened_lock
    _inherited.extend(_live)
    for fs in list(_live):
        fs._finalizer.detach()
    _live.clear()
    _inherited.extend(_opened.values())
    _opened.clear()
    _live_lock = threading.Lock()
    _opened_lock = threading.Lock()


_inherited: list[Any] = []


def _close_live() -> None:
    """Close every handle still open (interpreter exit); never raises: a
    failure is logged and the other handles are closed regardless."""
    with _live_lock:
        handles = list(_live)
    for fs in handles:
        try:
            fs.close()
        except Exception:
            log.exception("closing a ShingleFS file system at interpreter exit failed")


def _close_all(files: weakref.WeakSet[IO[Any]], release: Callable[[], None]) -> None:
    """``ShingleFS``'s finalizer: close the files left open, then release."""
    first: BaseException | None = None
    for file in list(files):
        try:
            file.close()
        except BaseException as exc:
            first = first or exc
    with _as_oserror():
        release()
    if first is not None:
        raise first


class _Opened:
    """One file system opened in this process, shared by its ``connect`` handles."""

    def __init__(self, vfs: VFS) -> None:
        self.vfs = vfs
        self.users = 0


_opened: dict[str, _Opened] = {}
_opened_lock = threading.Lock()
os.register_at_fork(after_in_child=_forget_the_parents)


def _share_key(meta_url: str) -> str:
    """One key per file system, whatever the spelling of its URL (sqlite:// or
    sqlite3://, a relative or linked path)."""
    parts = urllib.parse.urlsplit(meta_url)
    if parts.scheme.lower() in ("sqlite", "sqlite3"):
        return "sqlite:" + os.path.realpath(parts.path)
    return meta_url


def connect(meta_url: str, *, config: ClientConfig | None = None, ctx: Ctx = ROOT_CTX) -> ShingleFS:
    """Open the file system whose metadata is at ``meta_url`` (drives as recorded at format).

    In one process every ``connect`` of the same file system — and fsspec's
    ``shinglefs://`` — shares one opened file system (the drives' locks
    belong to the process; another process gets ``DriveInUse``). Each handle
    is closed by ``close()``, ``with``, garbage collection or interpreter exit;
    the drives and the metadata are released with the last one. Files written
    through any handle are committed on their close, as on the mount.
    ``config`` applies when this call opens the file system; a different one
    for a file system already open here is a ``UsageError``. A relative SQLite
    URL (``sqlite3:data/meta.db``) is the working directory's, as in the CLI.
    """
    meta_url = absolute_meta_url(meta_url)
    key = _share_key(meta_url)
    with _opened_lock:
        entry = _opened.get(key)
        if entry is None or entry.vfs.closed or entry.vfs.inherited:
            entry = _opened[key] = _Opened(open_filesystem(meta_url, config=config, serve=True,
                                                           join=True))
        elif config is not None and config != entry.vfs.config:
            raise UsageError(
                f"{meta_url} is already open in this process with another client configuration",
                hint="pass the same config, or none, to every connect() of one file system")
        entry.users += 1
    return ShingleFS(entry.vfs, ctx, functools.partial(_release, key, entry))


def _release(key: str, entry: _Opened) -> None:
    with _opened_lock:
        entry.users -= 1
        if entry.users > 0:
            return
        if _opened.get(key) is entry:
            del _opened[key]
    entry.vfs.shutdown()
