"""Formatting and opening a file system: metadata + the drives recorded at format time.

SKELETON: lands with the metadata engine.
"""

from __future__ import annotations

from shinglefs.client.config import ClientConfig
from shinglefs.client.vfs import VFS


def format_filesystem(meta_url: str, drives: list[str], name: str = "shinglefs") -> None:
    """Create the metadata format record and format each drive as a slice store."""
    raise NotImplementedError


def open_filesystem(meta_url: str, *, config: ClientConfig | None = None) -> VFS:
    """Open metadata and the recorded drives as an in-process node; register a session."""
    raise NotImplementedError
