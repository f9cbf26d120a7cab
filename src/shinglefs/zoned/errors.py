"""Typed drive errors, each carrying drive, zone, offset and a Linux errno.

Every error a drive backend raises is a ``ZoneError``. The errno is the one a
Linux kernel returns to user space for the same condition on a real zoned
block device, so the FUSE boundary can pass it through unchanged:

==========================  ==============  ===========================================
error                       errno           where Linux returns it
==========================  ==============  ===========================================
UnalignedIOError            EINVAL          direct I/O whose offset or length is not a
                                            multiple of the logical block size
                                            (``blkdev_direct_IO`` checks before issuing)
WritePointerViolation       EIO             an HM-SMR drive aborts a write off the write
                                            pointer (UNALIGNED WRITE COMMAND sense), and
                                            zone write plugging (Linux 6.10+) fails the
                                            bio with BLK_STS_IOERR; null_blk does the same
ZoneBoundaryError           EIO             a write crossing the end of a zone: the drive
                                            aborts (WRITE BOUNDARY ERROR); null_blk fails
                                            it with BLK_STS_IOERR. (A zone *append*
                                            crossing it is EINVAL in the block layer; we
                                            have no zone append, so EIO.)
ZoneFullError               EIO             write to a FULL zone (BLK_STS_IOERR)
ZoneReadOnlyError           EIO             write to a READ ONLY zone: the drive returns
                                            DATA PROTECT / ZONE IS READ ONLY, which the
                                            SCSI layer maps to BLK_STS_IOERR (not EROFS;
                                            EROFS is only for a read-only *block device*)
ZoneOfflineError            EIO             any read or write of an OFFLINE zone
TooManyOpenZones            ETOOMANYREFS    opening a zone past the limit when every open
                                            zone is explicitly open: the drive returns
                                            INSUFFICIENT ZONE RESOURCES, mapped to
                                            BLK_STS_ZONE_OPEN_RESOURCE = -ETOOMANYREFS
                                            (SCSI since 5.10, NVMe, null_blk). Older
                                            kernels turned it into EIO. A ZNS device's
                                            active-zone limit (EOVERFLOW) is reported
                                            as this error with errno EOVERFLOW.
ZoneTypeError               EINVAL          a zone operation (append, reset, open, close,
                                            finish) aimed at a conventional zone; the
                                            caller's mistake, rejected before any I/O
OutOfRangeError             EINVAL          a position or zone index past the end of the
                                            drive (BLKRESETZONE past capacity is EINVAL)
DriveClosedError            EIO             any call after ``close_drive``: to a file
                                            system above us the device is gone
DriveFormatError            EIO             a drive's zone table is missing, corrupt or of
                                            an unknown version; nothing is guessed
==========================  ==============  ===========================================

``errno`` is a class attribute; an instance may override it (``errno=``) when
a backend learns the real value from the kernel (``LinuxZonedDrive`` passes
the ``OSError.errno`` through).
"""

from __future__ import annotations

import errno as _errno
from typing import Any

from shinglefs.errors import ShingleError


class ZoneError(ShingleError):
    """Base of every drive error: names the drive, the zone and the byte offset.

    ``zone`` and ``offset`` are None when the failure is not about one place
    (a closed drive, a corrupt zone table).
    """

    errno = _errno.EIO
    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        drive: str,
        zone: int | None = None,
        offset: int | None = None,
        errno: int | None = None,
        hint: str | None = None,
    ) -> None:
        where = drive
        if zone is not None:
            where += f" zone {zone}"
        if offset is not None:
            where += f" at byte {offset}"
        super().__init__(f"{where}: {message}", hint=hint)
        self.drive = drive
        self.zone = zone
        self.offset = offset
        if errno is not None:
            self.errno = errno

    def __reduce__(self) -> tuple[Any, ...]:  # keep drive/zone/offset across pickling
        return (_rebuild, (type(self), self.args[0], self.drive, self.zone, self.offset,
                           self.errno, self.hint))


def _rebuild(
    cls: type[ZoneError], message: str, drive: str, zone: int | None, offset: int | None,
    errno: int, hint: str | None,
) -> ZoneError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.drive, err.zone, err.offset, err.errno = drive, zone, offset, errno
    if hint is not None:
        err.hint = hint
    return err


class UnalignedIOError(ZoneError):
    """Offset or length not a multiple of the drive's block size (4 KiB)."""

    errno = _errno.EINVAL


class WritePointerViolation(ZoneError):
    """A write to a sequential zone that does not start at its write pointer."""

    errno = _errno.EIO


class ZoneBoundaryError(ZoneError):
    """A write that would cross the end of its zone (or of the zone's capacity)."""

    errno = _errno.EIO


class ZoneFullError(ZoneError):
    """A write (or open) aimed at a FULL zone; reset it first."""

    errno = _errno.EIO


class ZoneReadOnlyError(ZoneError):
    """A write or zone operation on a READ_ONLY zone (a failing head); reads still work."""

    errno = _errno.EIO


class ZoneOfflineError(ZoneError):
    """Any I/O or zone operation on an OFFLINE zone (a failed head); its data is gone."""

    errno = _errno.EIO


class TooManyOpenZones(ZoneError):
    """Opening a zone would exceed max_open_zones and no implicitly open zone can be closed."""

    errno = _errno.ETOOMANYREFS


class ZoneTypeError(ZoneError):
    """A sequential-zone operation (append, reset, open, close, finish) on a conventional zone."""

    errno = _errno.EINVAL


class OutOfRangeError(ZoneError):
    """A zone index or byte range outside the drive."""

    errno = _errno.EINVAL


class DriveClosedError(ZoneError):
    """The drive was closed (or lost power in a test); reopen it to continue."""

    errno = _errno.EIO


class DriveFormatError(ZoneError):
    """The drive's persisted zone table or header is missing, corrupt or of another version."""

    errno = _errno.EIO
