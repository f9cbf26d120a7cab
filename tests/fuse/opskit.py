"""The operations class without a kernel: handlers called directly under trio
over a real VFS on a freshly formatted file system."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from shinglefs.client.config import ClientConfig
from shinglefs.client.filesystem import format_filesystem, open_filesystem
from shinglefs.fuse.harness import default_drives
from shinglefs.fuse.operations import ShingleOperations

GiB = 1024**3


@dataclass
class Request:
    """What the handlers read of a pyfuse3.RequestContext."""

    uid: int = 0
    gid: int = 0
    pid: int = os.getpid()
    umask: int = 0o022


@contextmanager
def handlers(tmp_path: Path, config: ClientConfig | None = None) -> Iterator[ShingleOperations]:
    """``ShingleOperations`` over a new file system in ``tmp_path`` (one SMR drive)."""
    url = f"sqlite3://{tmp_path / 'meta.db'}"
    format_filesystem(url, default_drives(tmp_path, smr_drives=1, smr_bytes=4 * GiB,
                                          conventional_bytes=0))
    vfs = open_filesystem(url, config=config)
    try:
        yield ShingleOperations(vfs)
    finally:
        vfs.shutdown()


def call(handler: Any, *args: Any) -> Any:
    """Await one handler under trio and return its result."""
    async def run() -> Any:
        return await handler(*args)

    return trio.run(run)
