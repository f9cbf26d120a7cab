"""Drive specs: ``KIND:PATH[:SIZE]`` strings naming a drive, and opening/creating from them.

=====================  =============================================  =====================
kind (aliases)         backend                                        SIZE
=====================  =============================================  =====================
``smr``, ``emulated``  EmulatedZonedDrive on a sparse file            required to create
``zoned``, ``linux``   LinuxZonedDrive on a zoned block device        not allowed (fixed)
``flash``,             ConventionalDrive on a file (or ``<dir>/``     required to create
``conventional``,      ``drive.img`` when PATH is a directory)
``cmr``
=====================  =============================================  =====================

SIZE is a byte count with an optional binary suffix: ``4096``, ``512M``,
``64G``, ``1T``, ``16GiB`` (K/M/G/T/P all mean powers of 1024). Example:
``shinglefs format --drive smr:/data/d0.img:16G``.

Bad input raises ``DriveSpecError`` (a ``UsageError``: errno EINVAL, CLI exit
code 2) with a hint showing the expected form; nothing is created.

Identity: emulated and conventional drives carry a ``DriveIdentity`` (file
system uuid + drive uuid) in their own header, the zone table
(``read_identity``/``write_identity``); ``shinglefs format`` writes it and
opening a file system checks it against the metadata, raising
``DriveIdentityError`` (CLI exit code 18) for a drive of another file system
or another position. A zoned block device has no header of ours yet: it reads
as carrying no identity and is known by its path alone.
"""

from __future__ import annotations

import errno as _errno
import os
import re
from dataclasses import dataclass

from shinglefs.errors import ShingleError, UsageError
from shinglefs.zoned.model import DEFAULT_ZONE_SIZE, ZonedDrive
from shinglefs.zoned.zonetable import DriveIdentity, ZoneTable

KINDS = {
    "smr": "emulated",
    "emulated": "emulated",
    "zoned": "linux",
    "linux": "linux",
    "flash": "conventional",
    "conventional": "conventional",
    "cmr": "conventional",
}

_EXAMPLES = "e.g. smr:/data/d0.img:16G, flash:/ssd/hot:64G, zoned:/dev/sdb"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"^(\d+)\s*([KMGTP]?)(?:I?B)?$", re.IGNORECASE)


class DriveSpecError(UsageError):
    """A drive spec that cannot be parsed or does not fit the drive it names."""


class DriveIdentityError(ShingleError):
    """The drive at a recorded path is not the drive the metadata recorded there:
    it belongs to another file system, is another drive of this one, or carries
    no identity where one was written. Nothing was opened or written."""

    errno = _errno.EMEDIUMTYPE
    exit_code = 18


@dataclass(frozen=True, slots=True)
class DriveSpec:
    """A parsed spec: canonical ``kind`` ("emulated", "linux", "conventional"), path, size."""

    kind: str
    path: str
    size: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.path}" + ("" if self.size is None else f":{self.size}")


def parse_size(text: str) -> int:
    """``"64G"`` -> 68719476736. Raises DriveSpecError for anything but digits and a unit."""
    m = _SIZE.match(text.strip())
    if not m:
        raise DriveSpecError(
            f"{text!r} is not a size", hint="write a byte count with an optional unit: 512M, 64G, 2T"
        )
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value <= 0:
        raise DriveSpecError(f"size {text!r} must be positive", hint="e.g. 16G")
    return value


def missing_size(spec: DriveSpec) -> DriveSpecError:
    """The error for a drive to create that names no size. A path whose
    ``:``-separated part parses as a size had a field after its size
    (``smr:/d/a.img:2G:extra``): said so, not "needs a size" with a hint of
    ``...:2G:extra:16G``."""
    parts = spec.path.split(":")
    sized = [i for i, p in enumerate(parts[1:], 1) if _SIZE.match(p.strip())]
    if sized:
        cut = sized[-1]
        return DriveSpecError(
            f"drive spec {spec.kind}:{spec.path} has {':'.join(parts[cut + 1:])!r} after its "
            f"size {parts[cut]}",
            hint=f"write KIND:PATH[:SIZE], e.g. {spec.kind}:{':'.join(parts[:cut + 1])}")
    return DriveSpecError(f"creating {spec.kind} drive {spec.path} needs a size",
                          hint=f"append one: {spec.kind}:{spec.path}:16G")


def parse_drive_spec(spec: str) -> DriveSpec:
    """Parse ``KIND:PATH[:SIZE]``; the last ``:`` part is a SIZE only when it parses as one."""
    if not isinstance(spec, str) or ":" not in spec:
        raise DriveSpecError(
            f"drive spec {spec!r} has no kind",
            hint=f"write KIND:PATH[:SIZE] with KIND one of {', '.join(KINDS)} ({_EXAMPLES})",
        )
    kind_text, rest = spec.split(":", 1)
    kind = KINDS.get(kind_text.strip().lower())
    if kind is None:
        raise DriveSpecError(
            f"unknown drive kind {kind_text!r} in {spec!r}",
            hint=f"KIND is one of {', '.join(KINDS)} ({_EXAMPLES})",
        )
    path, size = rest, None
    if ":" in rest:
        head, tail = rest.rsplit(":", 1)
        if _SIZE.match(tail.strip()):
            path, size = head, parse_size(tail)
        elif re.match(r"^\s*[-+.\d]", tail):  # meant as a size, but malformed
            parse_size(tail)
    if not path:
        raise DriveSpecError(f"drive spec {spec!r} has no path", hint=_EXAMPLES)
    if kind == "linux" and size is not None:
        raise DriveSpecError(
            f"{spec!r}: a zoned block device has a fixed size",
            hint=f"name it without a size: {kind_text}:{path}",
        )
    return DriveSpec(kind, path, size)


def _as_spec(spec: str | DriveSpec) -> DriveSpec:
    return spec if isinstance(spec, DriveSpec) else parse_drive_spec(spec)


def open_drive(spec: str | DriveSpec) -> ZonedDrive:
    """Open the existing drive ``spec`` names; a SIZE, when given, must match its capacity."""
    s = _as_spec(spec)
    drive: ZonedDrive
    if s.kind == "emulated":
        from shinglefs.zoned.emulated import EmulatedZonedDrive

        drive = EmulatedZonedDrive.open(s.path)
    elif s.kind == "conventional":
        from shinglefs.zoned.conventional import ConventionalDrive

        drive = ConventionalDrive.open(s.path)
    else:
        from shinglefs.zoned.linux import LinuxZonedDrive

        drive = LinuxZonedDrive.open(s.path)
    if s.size is not None and s.size // drive.zone_size * drive.zone_size != drive.capacity:
        capacity = drive.capacity
        drive.close_drive()
        raise DriveSpecError(
            f"{s.path} holds {capacity} bytes, but the spec says {s.size}",
            hint=f"write the drive as {s.kind}:{s.path} (no size: the drive's own) or "
                 f"{s.kind}:{s.path}:{capacity}",
        )
    return drive


def create_drive(
    spec: str | DriveSpec,
    *,
    zone_size: int = DEFAULT_ZONE_SIZE,
    conventional_zones: int | None = None,
    max_open_zones: int | None = None,
) -> ZonedDrive:
    """Create the drive ``spec`` names (SIZE required for files) and return it open.

    For a zoned block device nothing is created: the device is opened as it
    is (formatting its zones is the slice store's job). ``conventional_zones``
    (default ~1%) and ``max_open_zones`` (default 128) apply to emulated drives.
    """
    s = _as_spec(spec)
    if s.kind == "linux":
        return open_drive(s)
    if s.size is None:
        raise missing_size(s)
    if s.kind == "emulated":
        from shinglefs.zoned.emulated import DEFAULT_MAX_OPEN_ZONES, EmulatedZonedDrive

        return EmulatedZonedDrive.create(
            s.path, size=s.size, zone_size=zone_size, conventional_zones=conventional_zones,
            max_open_zones=DEFAULT_MAX_OPEN_ZONES if max_open_zones is None else max_open_zones,
        )
    from shinglefs.zoned.conventional import ConventionalDrive

    return ConventionalDrive.create(s.path, size=s.size, zone_size=zone_size)


def header_path(spec: str | DriveSpec) -> str | None:
    """The file holding the drive's header (its zone table), None for a zoned block device."""
    s = _as_spec(spec)
    if s.kind == "linux":
        return None
    if s.kind == "conventional":
        from shinglefs.zoned.conventional import DIRECTORY_DATA_FILE

        data = os.path.join(s.path, DIRECTORY_DATA_FILE) if os.path.isdir(s.path) else s.path
        return data + ".zones"
    return s.path + ".zones"


def read_identity(spec: str | DriveSpec) -> DriveIdentity | None:
    """The identity in the drive's header; None when it has none (or no header of ours).

    Only reads, without opening the drive: safe on a drive another process
    uses. Raises DriveFormatError when the header is missing or torn.
    """
    path = header_path(spec)
    if path is None:
        return None
    return ZoneTable.read_identity(path, drive=_as_spec(spec).path)


def write_identity(spec: str | DriveSpec, identity: DriveIdentity) -> bool:
    """Durably write ``identity`` into the drive's header; False for a drive without one."""
    path = header_path(spec)
    if path is None:
        return False
    ZoneTable.write_identity(path, identity, drive=_as_spec(spec).path)
    return True
