"""Typed errors of the slice store, each carrying the context a user needs.

``SliceNotFound`` maps to ENOENT, ``StoreFull`` to ENOSPC, ``SliceOrderError``
to EINVAL; data corruption (``ChecksumMismatch``) and drive failures
(``StoreIOError``) map to EIO. Every error names the drive; those about a
place on it also name the zone and the byte offset.
"""

from __future__ import annotations

import errno as _errno

from shinglefs.errors import ShingleError


class StoreError(ShingleError):
    """Base of every slice-store error; ``drive`` names the drive (its path or name)."""

    errno = _errno.EIO
    exit_code = 3

    def __init__(self, message: str, *, drive: str, hint: str | None = None) -> None:
        super().__init__(f"{drive}: {message}", hint=hint)
        self.drive = drive


class SliceNotFound(StoreError):
    """The slice is unknown or was deleted."""

    errno = _errno.ENOENT
    exit_code = 4

    def __init__(self, slice_id: int, *, drive: str) -> None:
        super().__init__(f"slice {slice_id:#x} not found", drive=drive)
        self.slice_id = slice_id


class SliceOrderError(StoreError):
    """A piece not at the slice's current length, or past ``MAX_SLICE_SIZE``."""

    errno = _errno.EINVAL
    exit_code = 2

    def __init__(self, slice_id: int, offset: int, expected: int, *, drive: str,
                 detail: str = "") -> None:
        super().__init__(
            f"slice {slice_id:#x}: piece at offset {offset}, expected {expected}"
            + (f" ({detail})" if detail else ""),
            drive=drive,
            hint="slices are written once, in order, at most 64 MiB each",
        )
        self.slice_id = slice_id
        self.offset = offset
        self.expected = expected


class ChecksumMismatch(StoreError):
    """A record's crc32c does not match: the bytes were not returned."""

    def __init__(self, *, drive: str, zone: int, offset: int, detail: str,
                 slice_id: int | None = None) -> None:
        what = f" (slice {slice_id:#x})" if slice_id is not None else ""
        super().__init__(f"checksum mismatch in zone {zone} at byte {offset}{what}: {detail}",
                         drive=drive, hint="`shinglefs scrub META_URL` lists every damaged file")
        self.zone = zone
        self.offset = offset
        self.slice_id = slice_id


class StoreFull(StoreError):
    """No zone can take the bytes, even after reclaiming dead zones and GC."""

    errno = _errno.ENOSPC
    exit_code = 5

    def __init__(self, needed: int, *, drive: str, free_zones: int, live_bytes: int) -> None:
        super().__init__(
            f"store full: {needed} bytes do not fit ({free_zones} free zones, "
            f"{live_bytes} live bytes)",
            drive=drive, hint="free space in the file system (files no longer needed) or add drives",
        )
        self.needed = needed
        self.free_zones = free_zones
        self.live_bytes = live_bytes


class StoreIOError(StoreError):
    """A drive error (``shinglefs.zoned.errors``) met by the store; ``cause`` is the original."""

    def __init__(self, message: str, *, drive: str, zone: int | None = None,
                 offset: int | None = None, cause: BaseException | None = None) -> None:
        where = ""
        if zone is not None:
            where += f" (zone {zone}"
            where += f", byte {offset})" if offset is not None else ")"
        super().__init__(f"{message}{where}", drive=drive)
        self.zone = zone
        self.offset = offset
        self.cause = cause
        # What the application is told: a drive full on the host (its image's
        # file system) is ENOSPC; any other failure of the drive is EIO (EPERM
        # of an image made immutable, say, named the application's own rights).
        code = getattr(cause, "errno", None)
        if code in (_errno.ENOSPC, _errno.EDQUOT):
            self.errno = _errno.ENOSPC
        elif code:
            self.errno = _errno.EIO


class StoreFormatError(StoreError):
    """The drive holds no store, a store of another version, or no usable checkpoint area."""

    exit_code = 3


class DriveTooSmall(StoreError):
    """``format`` was given a drive with too few zones for a useful slice store
    (checked before anything is created)."""

    errno = _errno.ENOSPC
    exit_code = 19


class StoreClosed(StoreError):
    """The store was closed; reopen it to continue."""
