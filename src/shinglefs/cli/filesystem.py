"""File-system commands: ``format``, ``mount``, ``umount``, ``up``, ``status``.

Every failure is a typed ``ShingleError`` (one line + hint + exit code, printed
by the boundary in ``cli.main``); the exit codes are listed in docs/cli.md.
The format/open logic lives in ``shinglefs.client.filesystem``; mounting in
``shinglefs.fuse.mount``.

Safety rules every command here keeps: every path argument (and a relative
path in a SQLite URL) is made absolute against the working directory before
anything forks; ``umount`` and ``status`` act only on ``fuse.shinglefs``
mounts; ``-o`` takes only the options in ``MOUNT_OPTIONS``; nothing is
deleted, and a file is created only where the command says it creates one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from shinglefs.errors import PathError, UsageError
from shinglefs.fuse.errors import MountError, MountFailedError, NoSpaceError, NotMountedError

if TYPE_CHECKING:
    from shinglefs.client.vfs import VFS

GiB = 1024**3
MiB = 1024**2

# `up` defaults: two emulated SMR drives of min(64 GiB, 25% of free space) each
# (rounded down to whole zones) and a conventional drive for indexes.
UP_SMR_DRIVES = 2
UP_MAX_DRIVE_BYTES = 64 * GiB
UP_FREE_FRACTION = 0.25
UP_ZONE_BYTES = 256 * MiB
UP_CONVENTIONAL_BYTES = 4 * GiB
# The smallest drive format accepts (store.log.check_drive_size): the data zones
# a slice store needs plus one zone for index checkpoints.
UP_MIN_DRIVE_BYTES = 6 * UP_ZONE_BYTES
SMR_KIND = "emulated"
CONVENTIONAL_KIND = "conventional"
STATUS_XATTR = "user.shinglefs.status"
SHINGLEFS_FSTYPE = "fuse.shinglefs"

# The -o options a mount takes: libfuse's generic mount options that make sense
# for us, and our own writeback_cache (docs/mount.md). Anything else is refused
# before mounting (libfuse would only say "fuse_session_new() failed").
MOUNT_OPTIONS = frozenset({
    "ro", "rw", "allow_other", "allow_root", "auto_unmount", "default_permissions",
    "nosuid", "suid", "nodev", "dev", "noexec", "exec",
    "noatime", "atime", "relatime", "norelatime", "strictatime", "nodiratime", "diratime",
    "sync", "async", "dirsync", "writeback_cache",
})
MOUNT_VALUE_OPTIONS = frozenset({"fsname", "max_read"})


class NotShingleMountError(MountError):
    """``umount``/``status`` of a mount point that holds another file system:
    refused without touching it."""

    exit_code = 17

    def __init__(self, mountpoint: str, fstype: str) -> None:
        super().__init__(
            f"{mountpoint} is a {fstype} mount, not ShingleFS; left alone",
            hint="pass a ShingleFS mount point (`shinglefs status` lists them)",
        )
        self.mountpoint = mountpoint


def check_mount_options(options: list[str]) -> list[str]:
    """The ``-o`` values split into single options; UsageError for one we do not take."""
    from shinglefs.fuse.mount import split_options

    single = split_options(options)
    for opt in single:
        key, has_value, value = opt.partition("=")
        known = (key in MOUNT_VALUE_OPTIONS and has_value and value) or (
            not has_value and key in MOUNT_OPTIONS)
        if not known:
            raise UsageError(
                f"unknown mount option {opt!r}",
                hint=f"-o takes {', '.join(sorted(MOUNT_OPTIONS))}, "
                f"{', '.join(k + '=VALUE' for k in sorted(MOUNT_VALUE_OPTIONS))}",
            )
    return single


def absolute(path: Path) -> Path:
    """``path`` made absolute against the working directory (symlinks kept)."""
    return Path(os.path.abspath(os.path.expanduser(path)))


# -- status -----------------------------------------------------------------------------


def collect_status(vfs: VFS, *, meta_url: str | None = None) -> dict[str, Any]:
    """Capacity, drives, zones by condition and write amplification of an open file system."""
    from shinglefs.meta.api import ROOT_CTX

    statfs = vfs.statfs(ROOT_CTX)
    node = vfs.node.stats()
    user = node.user_bytes_written
    drives: list[dict[str, Any]] = []
    for drive in node.drives:
        store = drive.store
        drives.append({
            "id": drive.drive_id,
            "spec": drive.spec,
            "capacity_bytes": drive.capacity_bytes,
            "free_bytes": drive.free_bytes,
            "live_bytes": store.live_bytes,
            "slices": store.slices,
            "write_amplification": round(store.write_amplification, 4),
            "gc_bytes_copied": store.gc_bytes_copied,
            "zone_resets": store.zone_resets,
            "zones": dict(store.zones_by_condition),
        })
    zones: dict[str, int] = {}
    for one in node.drives:
        for condition, count in one.store.zones_by_condition.items():
            zones[condition] = zones.get(condition, 0) + count
    return {
        "meta_url": meta_url,
        "capacity_bytes": statfs.capacity_bytes,
        "used_bytes": statfs.used_bytes,
        "free_bytes": statfs.free_bytes,
        "inodes": statfs.inodes,
        "live_bytes": node.live_bytes,
        "user_bytes_written": user,
        "device_bytes_written": node.device_bytes_written,
        "write_amplification": round(node.device_bytes_written / user, 4) if user else 1.0,
        "zones": zones,
        "drives": drives,
    }


def _status_of_mount(mountpoint: str) -> dict[str, Any]:
    from shinglefs.fuse.mount import mount_entry

    entry = mount_entry(mountpoint)
    if entry is None:
        raise NotMountedError(mountpoint)
    if entry["fstype"] != SHINGLEFS_FSTYPE:
        raise NotShingleMountError(mountpoint, entry["fstype"])
    try:
        raw = os.getxattr(mountpoint, STATUS_XATTR)
    except OSError as exc:
        raise MountFailedError(f"the mount at {mountpoint} does not answer: {exc.strerror}",
                               hint=f"if its daemon died, `shinglefs umount --force {mountpoint}`"
                               ) from exc
    return dict(json.loads(raw))


def _status_of_url(meta_url: str) -> dict[str, Any]:
    from shinglefs.client.filesystem import absolute_meta_url, open_filesystem

    meta_url = absolute_meta_url(meta_url)
    vfs = open_filesystem(meta_url)
    try:
        return collect_status(vfs, meta_url=meta_url)
    finally:
        vfs.shutdown()


def _shinglefs_mounts() -> list[str]:
    mounts = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == SHINGLEFS_FSTYPE:
                from shinglefs.fuse.mount import _unescape_mountinfo

                mounts.append(_unescape_mountinfo(fields[4]))
    return mounts


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print_status(status: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(title=title, show_header=False)
    summary.add_column("field")
    summary.add_column("value")
    for key in ("mountpoint", "meta_url", "pid"):
        if status.get(key) is not None:
            summary.add_row(key, str(status[key]))
    summary.add_row("capacity", _human(status["capacity_bytes"]))
    summary.add_row("used (files)", _human(status["used_bytes"]))
    summary.add_row("free", _human(status["free_bytes"]))
    summary.add_row("live slice bytes", _human(status["live_bytes"]))
    summary.add_row("inodes", str(status["inodes"]))
    summary.add_row("write amplification", f"{status['write_amplification']:.3f}")
    summary.add_row("zones", ", ".join(f"{k} {v}" for k, v in sorted(status["zones"].items())))
    console.print(summary)
    drives = Table(title="drives")
    for column in ("id", "spec", "capacity", "free", "live", "WA", "zones by condition"):
        drives.add_column(column)
    for drive in status["drives"]:
        drives.add_row(
            str(drive["id"]), drive["spec"], _human(drive["capacity_bytes"]),
            _human(drive["free_bytes"]), _human(drive["live_bytes"]),
            f"{drive['write_amplification']:.3f}",
            ", ".join(f"{k} {v}" for k, v in sorted(drive["zones"].items())),
        )
    console.print(drives)


# -- up ---------------------------------------------------------------------------------


def up_drive_specs(data_dir: Path) -> list[str]:
    """The drives ``up`` creates in ``data_dir`` on first use (sizes fit the free disk)."""
    free = shutil.disk_usage(data_dir).free
    per_drive = min(UP_MAX_DRIVE_BYTES, int(free * UP_FREE_FRACTION))
    per_drive -= per_drive % UP_ZONE_BYTES
    if per_drive < UP_MIN_DRIVE_BYTES:
        raise NoSpaceError(
            f"{data_dir} has {_human(free)} free; ShingleFS needs at least "
            f"{_human(UP_MIN_DRIVE_BYTES / UP_FREE_FRACTION)} for its emulated drives",
            hint="free some space or choose a DATA_DIR on a larger disk",
        )
    specs = [f"{SMR_KIND}:{data_dir / f'smr{i}.img'}:{per_drive}" for i in range(UP_SMR_DRIVES)]
    conventional = min(UP_CONVENTIONAL_BYTES, per_drive)
    specs.append(f"{CONVENTIONAL_KIND}:{data_dir / 'conventional.img'}:{conventional}")
    return specs


def meta_url_of(data_dir: Path) -> str:
    return f"sqlite:///{data_dir.resolve() / 'meta.db'}"


def _prepare_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` if need be; PathError when it cannot be used."""
    if data_dir.exists() and not data_dir.is_dir():
        raise PathError(f"{data_dir} is not a directory", hint="choose a directory for DATA_DIR")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PathError(f"cannot create {data_dir}: {exc.strerror}",
                        hint="choose a DATA_DIR in a directory you can write to") from None
    if not os.access(data_dir, os.W_OK | os.X_OK):
        raise PathError(f"{data_dir} is not writable",
                        hint="choose a DATA_DIR you can write to, or fix its permissions")


def _is_url(target: str) -> bool:
    from shinglefs.meta.backend import PG_SCHEMES, SQLITE_SCHEMES

    return "://" in target or target.split(":", 1)[0].lower() in SQLITE_SCHEMES + PG_SCHEMES


# -- commands ---------------------------------------------------------------------------


def _mount(meta_url: str, mountpoint: Path, *, foreground: bool, allow_other: bool | None,
           options: list[str], log_file: Path | None = None,
           format_first: tuple[list[str], str] | None = None) -> None:
    """Mount ``meta_url``; ``format_first=(drives, name)`` formats it first, in the
    process that then opens it (SQLite state must not cross the background fork).

    Paths are made absolute here, before the background daemon forks and leaves
    the working directory; ``-o`` options and a missing SQLite file are refused
    before anything is started.
    """
    from shinglefs.client.filesystem import (
        absolute_meta_url,
        format_filesystem,
        open_filesystem,
        require_metadata_file,
    )
    from shinglefs.fuse.mount import mount

    meta_url = absolute_meta_url(meta_url)
    mountpoint = absolute(mountpoint)
    log_file = absolute(log_file) if log_file is not None else None
    options = check_mount_options(options)
    if format_first is None:
        require_metadata_file(meta_url)

    def open_vfs() -> VFS:
        if format_first is not None:
            format_filesystem(meta_url, format_first[0], name=format_first[1])
        return open_filesystem(meta_url, mountpoint=str(mountpoint.resolve()))

    mount(open_vfs, mountpoint, foreground=foreground, allow_other=allow_other,
          options=options, meta_url=meta_url, log_file=log_file,
          status=lambda vfs: collect_status(vfs, meta_url=meta_url))


def register(app: typer.Typer) -> None:
    @app.command("format")
    def format_(
        meta_url: str = typer.Argument(..., help="metadata URL: sqlite:///PATH or postgresql://..."),
        drive: list[str] = typer.Option(
            ..., "--drive", "-d", help="KIND:PATH[:SIZE], repeat for each drive"
        ),
        name: str = typer.Option("shinglefs", "--name", help="file system name"),
    ) -> None:
        """Create a file system: the metadata format record and a slice store on each drive."""
        from shinglefs.client.filesystem import absolute_meta_url, format_filesystem

        meta_url = absolute_meta_url(meta_url)
        format_filesystem(meta_url, list(drive), name=name)
        typer.echo(f"formatted {name} at {meta_url} with {len(drive)} drive(s)")

    @app.command("mount")
    def mount_(
        meta_url: str = typer.Argument(..., help="metadata URL of a formatted file system"),
        mountpoint: Path = typer.Argument(..., help="an existing empty directory"),
        foreground: bool = typer.Option(False, "--foreground", "-f",
                                        help="stay in the foreground until unmounted"),
        allow_other: bool | None = typer.Option(
            None, "--allow-other/--no-allow-other",
            help="let other users use the mount (default: yes when run as root)"),
        option: list[str] = typer.Option([], "-o", help="extra FUSE mount options, comma separated"),
        log_file: Path | None = typer.Option(None, "--log-file",
                                             help="log of a background mount"),
    ) -> None:
        """Mount a file system (in the background unless --foreground)."""
        _mount(meta_url, mountpoint, foreground=foreground, allow_other=allow_other,
               options=list(option), log_file=log_file)
        if not foreground:
            typer.echo(f"mounted {meta_url} at {mountpoint}")

    @app.command("umount")
    def umount_(
        mountpoint: Path = typer.Argument(..., help="a ShingleFS mount point"),
        force: bool = typer.Option(False, "--force",
                                   help="lazy unmount; cleans a dead mount or a busy one"),
    ) -> None:
        """Unmount a ShingleFS mount (nothing else); returns once every buffered byte is stored."""
        from shinglefs.fuse.mount import mount_entry, unmount

        path = absolute(mountpoint)
        entry = mount_entry(path)
        if entry is None:
            raise NotMountedError(str(path))
        if entry["fstype"] != SHINGLEFS_FSTYPE:
            raise NotShingleMountError(str(path), entry["fstype"])
        unmount(path, force=force)

    @app.command("up")
    def up_(
        data_dir: Path = typer.Argument(..., help="directory holding metadata and drive files"),
        mountpoint: Path = typer.Argument(..., help="an existing empty directory"),
        foreground: bool = typer.Option(False, "--foreground", "-f",
                                        help="stay in the foreground until unmounted"),
        allow_other: bool | None = typer.Option(
            None, "--allow-other/--no-allow-other",
            help="let other users use the mount (default: yes when run as root)"),
    ) -> None:
        """Format on first use (SQLite + emulated SMR drives in DATA_DIR), then mount."""
        from shinglefs.fuse.mount import check_fuse, check_mountpoint, resolve_allow_other

        data_dir, mountpoint = absolute(data_dir), absolute(mountpoint)
        check_mountpoint(mountpoint)
        check_fuse()
        allow_other = resolve_allow_other(allow_other)
        _prepare_data_dir(data_dir)
        meta_url = meta_url_of(data_dir)
        format_first = None
        if not (data_dir / "meta.db").exists():
            specs = up_drive_specs(data_dir)
            format_first = (specs, data_dir.resolve().name or "shinglefs")
        _mount(meta_url, mountpoint, foreground=foreground, allow_other=allow_other, options=[],
               log_file=data_dir / "mount.log", format_first=format_first)
        if format_first is not None and not foreground:
            typer.echo(f"formatted {data_dir}: "
                       f"{', '.join(s.split(':', 1)[1] for s in format_first[0])}")
        if not foreground:
            typer.echo(f"mounted {data_dir} at {mountpoint} (log: {data_dir / 'mount.log'})")

    @app.command("status")
    def status_(
        target: str | None = typer.Argument(None, help="a mount point or a metadata URL "
                                            "(default: every ShingleFS mount)"),
        as_json: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
        """Capacity, drives, zones by condition and write amplification."""
        if target is None:
            results = {mp: _status_of_mount(mp) for mp in _shinglefs_mounts()}
            if not results:
                raise NotMountedError("(no ShingleFS mount)")
        elif _is_url(target):
            results = {target: _status_of_url(target)}
        else:
            mountpoint = os.path.abspath(target)
            if not os.path.isdir(mountpoint):
                raise UsageError(f"{target} is neither a directory nor a metadata URL",
                                 hint="pass a mount point or sqlite:///PATH / postgresql://...")
            results = {mountpoint: _status_of_mount(mountpoint)}
        if as_json:
            typer.echo(json.dumps(results if target is None else next(iter(results.values()))))
            return
        for title, status in results.items():
            _print_status(status, title)
