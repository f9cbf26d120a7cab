"""File-system commands: ``format``, ``mount``, ``umount``, ``up`` (``status``
lives in ``cli.status``).

Every failure is a typed ``ShingleError`` (one line + hint + exit code, printed
by the boundary in ``cli.main``); the exit codes are listed in docs/cli.md.
The format/open logic lives in ``shinglefs.client.filesystem``; mounting in
``shinglefs.fuse.mount``. ``format``, ``mount`` and ``up`` read the
configuration file (``cli.configfile``, docs/configuration.md) under their
flags: a flag given wins over the file.

Safety rules every command here keeps: every path argument (and a relative
path in a SQLite URL) is made absolute against the working directory before
anything forks; ``umount`` acts only on ``fuse.shinglefs`` mounts; ``-o``
takes only the options in ``MOUNT_OPTIONS``; nothing is deleted, and a file
is created only where the command says it creates one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from shinglefs.cli.errors import NoSpaceError
from shinglefs.cli.status import collect_status, human, require_shingle_mount
from shinglefs.errors import PathError, UsageError

if TYPE_CHECKING:
    from shinglefs.cli.configfile import Settings
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

# The -o options a mount takes: libfuse's generic mount options that make sense
# for us, and our own writeback_cache (docs/mount.md). Anything else is refused
# before mounting (libfuse would only say "fuse_session_new() failed").
MOUNT_OPTIONS = frozenset({
    "ro", "rw", "allow_other", "allow_root", "auto_unmount", "default_permissions",
    "nosuid", "suid", "nodev", "dev", "noexec", "exec",
    "noatime", "nodiratime", "sync", "async", "dirsync", "writeback_cache",
})
# Reads record no access time: every mount is noatime (fuse.mount.fuse_options),
# so an option asking for them is refused rather than shown and not kept.
ATIME_OPTIONS = frozenset({"atime", "relatime", "norelatime", "strictatime", "diratime"})
MOUNT_VALUE_OPTIONS = frozenset({"fsname", "max_read"})

# Options shared by several commands (typer reads these as metadata only).
CONFIG_OPTION = typer.Option(None, "--config", metavar="FILE",
                             help="configuration file (default: docs/configuration.md)")
FOREGROUND_OPTION = typer.Option(False, "--foreground", "-f",
                                 help="stay in the foreground until unmounted")
ALLOW_OTHER_OPTION = typer.Option(
    None, "--allow-other/--no-allow-other",
    help="let other users use the mount (default: yes when run as root)")
READ_CACHE_OPTION = typer.Option(None, "--read-cache", metavar="SIZE",
                                 help="memory for the read cache, e.g. 1G (client.read_cache_bytes)")
WRITE_BUFFER_OPTION = typer.Option(
    None, "--write-buffer", metavar="SIZE",
    help="memory for written bytes not yet stored, e.g. 512M (client.total_buffer_bytes)")
GC_FREE_ZONES_OPTION = typer.Option(
    None, "--gc-free-zones", min=1,
    help="GC copies live data when fewer zones are free (store.gc_free_zones)")


def check_mount_options(options: list[str]) -> list[str]:
    """The ``-o`` values split into single options; UsageError for one we do not take."""
    from shinglefs.fuse.mount import split_options

    single = split_options(options)
    for opt in single:
        key, has_value, value = opt.partition("=")
        if opt in ATIME_OPTIONS:
            raise UsageError(
                f"mount option {opt!r}: ShingleFS records no access times on reads",
                hint="leave it out: every mount is noatime (utimes still sets atime)")
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


def mount_settings(config: Path | None, *, allow_other: bool | None, options: list[str],
                   log_file: Path | None, read_cache: str | None, write_buffer: str | None,
                   gc_free_zones: int | None) -> Settings:
    """The configuration file under the flags of ``mount``/``up`` (a flag given wins;
    ``-o`` given replaces the file's options)."""
    from shinglefs.cli.configfile import load_settings, size_flag

    return load_settings(config, {
        "mount": {"allow_other": allow_other, "options": tuple(options) or None,
                  "log_file": str(log_file) if log_file is not None else None},
        "client": {"read_cache_bytes": size_flag("--read-cache", read_cache),
                   "total_buffer_bytes": size_flag("--write-buffer", write_buffer)},
        "store": {"gc_free_zones": gc_free_zones},
    })


# -- up ---------------------------------------------------------------------------------


def up_drive_specs(data_dir: Path) -> list[str]:
    """The drives ``up`` creates in ``data_dir`` on first use (sizes fit the free disk)."""
    free = shutil.disk_usage(data_dir).free
    per_drive = min(UP_MAX_DRIVE_BYTES, int(free * UP_FREE_FRACTION))
    per_drive -= per_drive % UP_ZONE_BYTES
    if per_drive < UP_MIN_DRIVE_BYTES:
        raise NoSpaceError(
            f"{data_dir} has {human(free)} free; ShingleFS needs at least "
            f"{human(UP_MIN_DRIVE_BYTES / UP_FREE_FRACTION)} for its emulated drives",
            hint="free some space or choose a DATA_DIR on a larger disk",
        )
    specs = [f"{SMR_KIND}:{data_dir / f'smr{i}.img'}:{per_drive}" for i in range(UP_SMR_DRIVES)]
    conventional = min(UP_CONVENTIONAL_BYTES, per_drive)
    specs.append(f"{CONVENTIONAL_KIND}:{data_dir / 'conventional.img'}:{conventional}")
    return specs


def meta_url_of(data_dir: Path) -> str:
    return f"sqlite3://{data_dir.resolve() / 'meta.db'}"


def _note_hidden_entries(mountpoint: Path) -> None:
    """Say on stderr when the mount point is not empty: its entries are hidden
    while the file system is mounted over them (FUSE mounts there silently,
    and a user looking for those files finds the file system instead)."""
    try:
        entries = len(os.listdir(mountpoint))
    except OSError:  # missing, not a directory, a dead mount: the checks say which
        return
    if entries:
        typer.echo(f"shinglefs: note: {mountpoint} is not empty: its {entries} "
                   f"entr{'y is' if entries == 1 else 'ies are'} hidden while the file "
                   "system is mounted there", err=True)


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


# -- mounting ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FirstFormat:
    """What ``up`` formats before its first mount."""

    drives: list[str]
    name: str


def _mount(meta_url: str, mountpoint: Path, settings: Settings, *, foreground: bool,
           log_file: Path | None = None, format_first: FirstFormat | None = None) -> None:
    """Mount ``meta_url`` with ``settings`` (client, store and mount sections);
    ``format_first`` formats it first, in the process that then opens it
    (SQLite state must not cross the background fork).

    Paths are made absolute here, before the background daemon forks and leaves
    the working directory; ``-o`` options and a missing SQLite file are refused
    before anything is started. ``log_file`` is the default when the settings
    name none.
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
    _note_hidden_entries(mountpoint)
    chosen_log = settings.mount.log_file or log_file
    log_path = absolute(Path(chosen_log)) if chosen_log is not None else None
    options = check_mount_options(list(settings.mount.options))
    if format_first is None:
        require_metadata_file(meta_url)

    def open_vfs() -> VFS:
        if format_first is not None:
            format_filesystem(meta_url, format_first.drives, name=format_first.name,
                              store_config=settings.store)
        return open_filesystem(meta_url, mountpoint=str(mountpoint.resolve()),
                               config=settings.client, store_config=settings.store,
                               serve=True, join=True)

    mount(open_vfs, mountpoint, foreground=foreground, allow_other=settings.mount.allow_other,
          options=options, meta_url=meta_url, log_file=log_path,
          status=lambda vfs: {**collect_status(vfs, meta_url=meta_url), **settings.report()})


# -- commands ---------------------------------------------------------------------------


def format_command(
    meta_url: str = typer.Argument(..., help="metadata URL: sqlite3:///PATH or postgresql://..."),
    drive: list[str] = typer.Option(
        [], "--drive", "-d", help="KIND:PATH[:SIZE], repeat for each drive"
    ),
    servers: bool = typer.Option(
        False, "--servers",
        help="no drives here: the data lives on storage servers (`shinglefs server`)"),
    name: str | None = typer.Option(None, "--name",
                                    help="file system name (default: shinglefs)"),
    chunk_size: str | None = typer.Option(
        None, "--chunk-size", metavar="SIZE",
        help="file-offset unit of the chunk map, at most the maximum slice size (default 64M)"),
    zone_size: str | None = typer.Option(None, "--zone-size", metavar="SIZE",
                                         help="zone size of emulated drives (default 256M)"),
    config: Path | None = CONFIG_OPTION,
) -> None:
    """Create a file system: the metadata format record and a slice store on each drive."""
    from shinglefs.cli.configfile import check_chunk_size, load_settings, size_flag
    from shinglefs.client.filesystem import absolute_meta_url, format_filesystem

    chunk = size_flag("--chunk-size", chunk_size)
    if chunk is not None:
        check_chunk_size(chunk)
    settings = load_settings(config, {"format": {
        "name": name, "chunk_size": chunk, "zone_size": size_flag("--zone-size", zone_size)}})
    meta_url = absolute_meta_url(meta_url)
    fmt = settings.format
    format_filesystem(meta_url, list(drive), name=fmt.name, chunk_size=fmt.chunk_size,
                      zone_size=fmt.zone_size, store_config=settings.store, servers=servers)
    where = "for storage servers" if servers else f"with {len(drive)} drive(s)"
    typer.echo(f"formatted {fmt.name} at {meta_url} {where}")


def mount_command(
    meta_url: str = typer.Argument(..., help="metadata URL of a formatted file system"),
    mountpoint: Path = typer.Argument(..., help="an existing empty directory"),
    foreground: bool = FOREGROUND_OPTION,
    allow_other: bool | None = ALLOW_OTHER_OPTION,
    option: list[str] = typer.Option([], "-o", help="extra FUSE mount options, comma separated"),
    log_file: Path | None = typer.Option(None, "--log-file", help="log of a background mount"),
    config: Path | None = CONFIG_OPTION,
    read_cache: str | None = READ_CACHE_OPTION,
    write_buffer: str | None = WRITE_BUFFER_OPTION,
    gc_free_zones: int | None = GC_FREE_ZONES_OPTION,
) -> None:
    """Mount a file system (in the background unless --foreground)."""
    settings = mount_settings(config, allow_other=allow_other, options=list(option),
                              log_file=log_file, read_cache=read_cache,
                              write_buffer=write_buffer, gc_free_zones=gc_free_zones)
    _mount(meta_url, mountpoint, settings, foreground=foreground)
    if not foreground:
        typer.echo(f"mounted {meta_url} at {mountpoint}")


def umount_command(
    mountpoint: Path = typer.Argument(..., help="a ShingleFS mount point"),
    force: bool = typer.Option(False, "--force",
                               help="lazy unmount; cleans a dead mount or a busy one"),
) -> None:
    """Unmount a ShingleFS mount (nothing else); returns once every buffered byte is stored."""
    from shinglefs.fuse.mount import unmount

    path = absolute(mountpoint)
    require_shingle_mount(str(path))
    note = unmount(path, force=force)
    if note:
        typer.echo(note)


def up_command(
    data_dir: Path = typer.Argument(..., help="directory holding metadata and drive files"),
    mountpoint: Path = typer.Argument(..., help="an existing empty directory"),
    foreground: bool = FOREGROUND_OPTION,
    allow_other: bool | None = ALLOW_OTHER_OPTION,
    config: Path | None = CONFIG_OPTION,
    read_cache: str | None = READ_CACHE_OPTION,
    write_buffer: str | None = WRITE_BUFFER_OPTION,
    gc_free_zones: int | None = GC_FREE_ZONES_OPTION,
) -> None:
    """Format on first use (SQLite + emulated SMR drives in DATA_DIR), then mount."""
    from shinglefs.fuse.mount import check_fuse, check_mountpoint, resolve_allow_other

    settings = mount_settings(config, allow_other=allow_other, options=[], log_file=None,
                              read_cache=read_cache, write_buffer=write_buffer,
                              gc_free_zones=gc_free_zones)
    data_dir, mountpoint = absolute(data_dir), absolute(mountpoint)
    check_mountpoint(mountpoint)
    check_fuse()
    resolve_allow_other(settings.mount.allow_other)  # refused here, before formatting
    _prepare_data_dir(data_dir)
    format_first = None
    if not (data_dir / "meta.db").exists():
        format_first = FirstFormat(up_drive_specs(data_dir), data_dir.resolve().name or "shinglefs")
    log_file = data_dir / "mount.log"
    owner = None if format_first is not None else _drives_holder(data_dir)
    _mount(meta_url_of(data_dir), mountpoint, settings, foreground=foreground,
           log_file=log_file, format_first=format_first)
    if format_first is not None and not foreground:
        typer.echo(f"formatted {data_dir}: "
                   f"{', '.join(s.split(':', 1)[1] for s in format_first.drives)}")
    if not foreground:
        shared = ("" if owner is None else f"; a client of process {owner}, which holds the "
                  "drives: this mount works while that one runs")
        typer.echo(f"mounted {data_dir} at {mountpoint} (log: "
                   f"{settings.mount.log_file or log_file}){shared}")


def _drives_holder(data_dir: Path) -> int | None:
    """The live process holding the drive locks in ``data_dir`` (another `up`
    of it), or None: a mount then joins it as a client."""
    for lock in sorted(data_dir.glob("*.img.lock")):
        try:
            pid = int(lock.read_text().strip() or 0)
        except (OSError, ValueError):
            continue
        if pid > 0 and pid != os.getpid():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass  # alive, another user's
            return pid
    return None


def register(app: typer.Typer) -> None:
    app.command("format")(format_command)
    app.command("mount")(mount_command)
    app.command("umount")(umount_command)
    app.command("up")(up_command)
