"""Drives: the zone model and its backends.

Owns: zone types and conditions with the ZBC transitions, the rules a
host-managed drive enforces (writes only at the write pointer, 4 KiB aligned,
never across a zone), and I/O tracing for the SMR timing model. Backends: an
emulated host-managed SMR drive on a file, Linux zoned block devices through
the kernel ioctls, and conventional drives (flash or CMR). Optional calls a
backend implements natively are declared in ``ZonedDrive.abilities``
(``DriveAbilities``); durability calls (fsync, fdatasync) live in ``fileio``.

May call: nothing of ShingleFS but ``shinglefs.errors``.
"""

from shinglefs.zoned.conventional import ConventionalDrive
from shinglefs.zoned.drivespec import (
    DriveSpec,
    DriveSpecError,
    create_drive,
    open_drive,
    parse_drive_spec,
    parse_size,
)
from shinglefs.zoned.emulated import EmulatedZonedDrive
from shinglefs.zoned.errors import (
    DriveClosedError,
    DriveFormatError,
    OutOfRangeError,
    TooManyOpenZones,
    UnalignedIOError,
    WritePointerViolation,
    ZoneBoundaryError,
    ZoneError,
    ZoneFullError,
    ZoneOfflineError,
    ZoneReadOnlyError,
    ZoneTypeError,
)
from shinglefs.zoned.linux import LinuxZonedDrive, aligned_buffer
from shinglefs.zoned.model import (
    BLOCK_SIZE,
    DEFAULT_ZONE_SIZE,
    Buffer,
    DriveAbilities,
    TraceRecord,
    ZoneCondition,
    ZonedDrive,
    ZoneInfo,
    ZoneType,
)

__all__ = [
    "BLOCK_SIZE",
    "DEFAULT_ZONE_SIZE",
    "Buffer",
    "ConventionalDrive",
    "DriveAbilities",
    "DriveClosedError",
    "DriveFormatError",
    "DriveSpec",
    "DriveSpecError",
    "EmulatedZonedDrive",
    "LinuxZonedDrive",
    "OutOfRangeError",
    "TooManyOpenZones",
    "TraceRecord",
    "UnalignedIOError",
    "WritePointerViolation",
    "ZoneBoundaryError",
    "ZoneCondition",
    "ZoneError",
    "ZoneFullError",
    "ZoneInfo",
    "ZoneOfflineError",
    "ZoneReadOnlyError",
    "ZoneType",
    "ZoneTypeError",
    "ZonedDrive",
    "aligned_buffer",
    "create_drive",
    "open_drive",
    "parse_drive_spec",
    "parse_size",
]
