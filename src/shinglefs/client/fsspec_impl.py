"""fsspec ``shinglefs://`` protocol over the Python API.

    import fsspec, torch
    with fsspec.open("shinglefs://ckpt/model.pt", "wb", meta="sqlite3:///data/meta.db") as f:
        torch.save(model.state_dict(), f)

URL form ``shinglefs://<path>`` (the path is absolute in the file system:
``shinglefs://ckpt/a`` and ``shinglefs:///ckpt/a`` name the same file). The
metadata URL comes from the storage option ``meta=`` or, when absent, the
environment variable ``SHINGLEFS_META``. ``auto_mkdir=True`` (as fsspec's
local file system takes it) makes a file's missing parent directories when
it is opened for writing, as object stores behave: zarr's ``FsspecStore``
writes ``array/c/0/0`` without making ``array/c/0`` first.

One process opens a given file system once (its drives are locked to the
process): every ``ShingleFileSystem`` of the same metadata URL shares one
connection, closed at interpreter exit or by :meth:`ShingleFileSystem.close`.

Registered through the ``fsspec.specs`` entry point in pyproject.toml.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import posixpath
import threading
import uuid
from typing import Any

from fsspec import AbstractFileSystem

from shinglefs.client.api import ShingleFS, connect
from shinglefs.errors import UsageError
from shinglefs.meta.api import InodeAttr

META_ENV = "SHINGLEFS_META"

_connections: dict[str, ShingleFS] = {}
_connections_lock = threading.Lock()


def shared_connection(meta_url: str) -> ShingleFS:
    """The process-wide connection to ``meta_url`` (opened on first use; in a
    forked child, such as a DataLoader worker, a new one of its own)."""
    with _connections_lock:
        fs = _connections.get(meta_url)
        if fs is None or fs.closed or fs.vfs.inherited:
            fs = _connections[meta_url] = connect(meta_url)
        return fs


def close_connections() -> None:
    """Close every shared connection (commits buffered writes, releases drives)."""
    with _connections_lock:
        conns = list(_connections.values())
        _connections.clear()
    for fs in conns:
        try:
            fs.close()
        except Exception:  # pragma: no cover - interpreter exit, best effort
            pass


atexit.register(close_connections)


def _forget_the_parents() -> None:
    """In a forked child: the parent's connections stay the parent's (kept
    referenced, never closed here: ``api._forget_the_parents``)."""
    global _connections_lock
    _inherited.extend(_connections.values())
    _connections.clear()
    _connections_lock = threading.Lock()


_inherited: list[ShingleFS] = []
os.register_at_fork(after_in_child=_forget_the_parents)


def _kind(attr: InodeAttr) -> str:
    if attr.is_dir:
        return "directory"
    if attr.is_file:
        return "file"
    return "other"


class ShingleFileSystem(AbstractFileSystem):
    """fsspec file system for ``shinglefs://`` URLs (see the module docstring)."""

    protocol = "shinglefs"
    root_marker = "/"

    def __init__(self, meta: str | None = None, auto_mkdir: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.auto_mkdir = auto_mkdir
        meta = meta or os.environ.get(META_ENV)
        if not meta:
            raise UsageError(
                f"no ShingleFS metadata URL (storage option meta= or {META_ENV})",
                hint=f"pass meta='sqlite3:///path/meta.db' as a storage option or set {META_ENV}",
            )
        self.meta_url = meta
        shared_connection(meta)  # fail now, with the typed error, if it cannot open

    @property
    def fs(self) -> ShingleFS:
        """The shared connection (re-opened if it was closed since this instance was cached)."""
        return shared_connection(self.meta_url)

    # ------------------------------------------------------------------ paths
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("shinglefs://"):
            path = path[len("shinglefs://") :]
        elif path.startswith("shinglefs::"):
            path = path[len("shinglefs::") :]
        path = "/" + path.strip("/")
        return path

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return {}

    def _details(self, path: str, attr: InodeAttr) -> dict[str, Any]:
        return {
            "name": path,
            "size": attr.size if not attr.is_dir else 0,
            "type": _kind(attr),
            "mode": attr.mode,
            "ino": attr.ino,
            "nlink": attr.nlink,
            "uid": attr.uid,
            "gid": attr.gid,
            "mtime": attr.mtime_ns / 1e9,
            "created": attr.ctime_ns / 1e9,
            "islink": attr.is_symlink,
        }

    # ------------------------------------------------------------------ listing
    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        attr = self.fs._resolve(path)
        return self._details(path, attr)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        attr = self.fs._resolve(path)
        if not attr.is_dir:
            entries = [self._details(path, attr)]
        else:
            base = path.rstrip("/")
            entries = [
                self._details(f"{base}/{name}", child)
                for name, child in self.fs.scandir_attrs(path)
            ]
        return entries if detail else [e["name"] for e in entries]

    def modified(self, path: str) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.UTC)

    def created(self, path: str) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.UTC)

    # ------------------------------------------------------------------ files
    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        path = self._strip_protocol(path)
        if not autocommit:
            raise NotImplementedError("transactions (autocommit=False) are not supported")
        if self.auto_mkdir and any(c in mode for c in "wax"):
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        return self.fs.open(path, mode, buffering=block_size or -1)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(src):
            self.makedirs(dst, exist_ok=True)
            return
        # An instant copy sharing the data (``ShingleFS.snapshot``; of what a
        # symlink points at, as a read would), made under a temporary name of
        # bounded length and renamed over ``dst``: readers of ``dst`` see the
        # old file or the whole copy, never a part.
        tmp = posixpath.join(posixpath.dirname(dst), f".cp-{uuid.uuid4().hex}")
        self.fs.snapshot(src, tmp, follow_symlinks=True)
        try:
            self.fs.rename(tmp, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.unlink(tmp)
            raise

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: Any = None, **kwargs: Any) -> None:
        """Rename (atomic, replacing the target) when given two single paths."""
        if isinstance(path1, str) and isinstance(path2, str):
            self.fs.rename(self._strip_protocol(path1), self._strip_protocol(path2))
            return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def rm_file(self, path: str) -> None:
        self.fs.unlink(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        path = self._strip_protocol(path)
        if self.fs.isdir(path):
            self.fs.rmdir(path)
        else:
            self.fs.unlink(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        for p in sorted(paths, key=len, reverse=True):
            self._rm(p)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if create_parents:
            self.fs.makedirs(path, exist_ok=False)
        else:
            self.fs.mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        self.fs.rmdir(self._strip_protocol(path))

    def symlink(self, target: str, path: str) -> None:
        self.fs.symlink(target, self._strip_protocol(path))

    def link(self, target: str, path: str) -> None:
        self.fs.link(self._strip_protocol(target), self._strip_protocol(path))

    def close(self) -> None:
        """Close the shared connection of this metadata URL (all instances share it)."""
        with _connections_lock:
            fs = _connections.pop(self.meta_url, None)
        if fs is not None:
            fs.close()
