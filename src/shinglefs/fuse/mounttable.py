"""The mount table and a mount's state: which ShingleFS mounts exist, their
daemons' state files, checking a mount point, unmounting.

Nothing here sends a request to a mount: /proc/self/mountinfo names mounts
(dead FUSE mounts too, whose ``stat`` fails with ENOTCONN), and a state file
``$SHINGLEFS_STATE_DIR/<hash of mount point>.json`` (default /run/shinglefs)
names the daemon's pid and meta URL (written by ``fuse.mount.serve`` once the
mount serves, removed when it ends).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shinglefs.fuse.errors import (
    AlreadyMountedError,
    MountFailedError,
    MountPointError,
    NotMountedError,
    UnmountBusyError,
)

log = logging.getLogger(__name__)

STATE_DIR_ENV = "SHINGLEFS_STATE_DIR"
DEFAULT_STATE_DIR = "/run/shinglefs"
# What /proc/self/mountinfo calls a ShingleFS mount (``subtype=shinglefs``, fuse_options).
FSTYPE = "fuse.shinglefs"
EXIT_TIMEOUT = 120.0  # seconds `umount` waits for the daemon to store its buffers and exit
IN_USE_WAIT_S = 2.0  # a mount detached while in use: how long `umount --force` looks for its exit


@dataclass(frozen=True, slots=True)
class MountState:
    """What a running mount publishes in its state file."""

    mountpoint: str
    pid: int
    meta_url: str | None
    started: float

    @property
    def alive(self) -> bool:
        """The daemon process exists and is not a zombie."""
        try:
            with open(f"/proc/{self.pid}/stat") as proc_stat:
                return proc_stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False


# -- checks and the /proc view of mounts ----------------------------------------------


def _unescape_mountinfo(field: str) -> str:
    """Decode the octal escapes (``\\040`` = space) of /proc/self/mountinfo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mountinfo_lines(mountinfo: Iterable[str] | None) -> list[str]:
    if mountinfo is not None:
        return list(mountinfo)
    with open("/proc/self/mountinfo") as info:
        return info.readlines()


def mount_entry(mountpoint: str | os.PathLike[str], *,
                mountinfo: Iterable[str] | None = None) -> dict[str, str] | None:
    """The /proc/self/mountinfo entry mounted at ``mountpoint`` (the last one,
    the newest of mounts stacked there), if any; ``mountinfo``: those lines
    instead of this process's.

    Works for dead FUSE mounts too (whose ``stat`` fails with ENOTCONN, so
    ``os.path.ismount`` says False), and never touches the mount itself.
    """
    target = os.path.abspath(mountpoint)
    found = None
    for line in _mountinfo_lines(mountinfo):
        fields = line.split()
        sep = fields.index("-")
        if _unescape_mountinfo(fields[4]) == target:
            found = {
                "mountpoint": target,
                "major_minor": fields[2],
                "fstype": fields[sep + 1],
                "source": _unescape_mountinfo(fields[sep + 2]),
                "super_options": fields[sep + 3] if len(fields) > sep + 3 else "",
            }
    return found


def mount_owner(entry: dict[str, str]) -> int | None:
    """The uid that made a FUSE mount (its ``user_id=`` super option), if shown."""
    for opt in entry.get("super_options", "").split(","):
        key, _, value = opt.partition("=")
        if key == "user_id" and value.isdigit():
            return int(value)
    return None


def mount_device(mountpoint: str | os.PathLike[str], *,
                 mountinfo: Iterable[str] | None = None) -> tuple[int, int] | None:
    """(major, minor) of the device of the mount at ``mountpoint`` (its files'
    ``st_dev``; a FUSE mount's bdi is named after it), from the mount table,
    so without a request to the mount; None if nothing is mounted there."""
    entry = mount_entry(mountpoint, mountinfo=mountinfo)
    if entry is None:
        return None
    major, minor = entry["major_minor"].split(":")
    return int(major), int(minor)


def mounts_of_type(fstype: str = FSTYPE) -> list[str]:
    """The mount points of every ``fstype`` mount (default: ShingleFS) in
    /proc/self/mountinfo, dead FUSE mounts included."""
    mounts = []
    for line in _mountinfo_lines(None):
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == fstype:
            mounts.append(_unescape_mountinfo(fields[4]))
    return mounts


def check_mountpoint(mountpoint: str | os.PathLike[str]) -> str:
    """The absolute mount point; raises MountPointError / AlreadyMountedError.

    A ShingleFS mount left there by a daemon that is gone (killed: the kernel
    answers every request ENOTCONN, "Transport endpoint is not connected") is
    detached first (``clear_dead_mount``), so that mounting again after a
    crash just works, as it does for MooseFS and JuiceFS; a live mount, a
    hung one, or anything else mounted there is refused."""
    path = os.path.abspath(mountpoint)
    entry = mount_entry(path)
    if entry is not None and not clear_dead_mount(path, entry):
        raise AlreadyMountedError(path)
    if not os.path.exists(path):
        raise MountPointError(path, "no such directory")
    if not os.path.isdir(path):
        raise MountPointError(path, "not a directory")
    return path


def state_dir() -> Path:
    """Where mounts publish their state files: ``$SHINGLEFS_STATE_DIR``, read
    when used (not at import), else /run/shinglefs."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def state_path(mountpoint: str | os.PathLike[str]) -> Path:
    digest = hashlib.sha256(os.path.abspath(mountpoint).encode()).hexdigest()[:16]
    return state_dir() / f"{digest}.json"


def read_state(mountpoint: str | os.PathLike[str]) -> MountState | None:
    """The state a mount at ``mountpoint`` published, or None."""
    try:
        data = json.loads(state_path(mountpoint).read_text())
    except (OSError, ValueError):
        return None
    return MountState(data["mountpoint"], int(data["pid"]), data.get("meta_url"),
                      float(data.get("started", 0)))


def write_state(state: MountState) -> None:
    path = state_path(state.mountpoint)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "mountpoint": state.mountpoint, "pid": state.pid,
            "meta_url": state.meta_url, "started": state.started,
        }))
        os.replace(tmp, path)
    except OSError as exc:  # status/umount degrade; the mount itself is fine
        log.warning("cannot write mount state file %s: %s", path, exc)


def remove_state(mountpoint: str) -> None:
    state = read_state(mountpoint)
    if state is not None and state.pid == os.getpid():
        with contextlib.suppress(OSError):
            state_path(mountpoint).unlink()


# -- unmounting -------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
MNT_DETACH = 2


def _umount_syscall(mountpoint: str, flags: int) -> int:
    """umount2(2); returns 0 or the errno."""
    if _libc.umount2(mountpoint.encode(), flags) == 0:
        return 0
    return ctypes.get_errno()


def kernel_unmount(mountpoint: str, lazy: bool, *, syscall: bool = True) -> tuple[bool, str]:
    """Unmount via umount2 (root, if ``syscall``) or fusermount3 (else umount) in
    a child process; returns (ok, error text). The daemon itself passes
    ``syscall=False``: an unmount may wait on requests to the mount, which its
    own loop serves (see ``run_fuse_loop``)."""
    if syscall and os.geteuid() == 0:
        err = _umount_syscall(mountpoint, MNT_DETACH if lazy else 0)
        if err == 0:
            return True, ""
        if err != errno.EPERM:
            return False, os.strerror(err)
    tool = shutil.which("fusermount3")
    if tool is not None:
        cmd = [tool, "-u", "-z", mountpoint] if lazy else [tool, "-u", mountpoint]
    else:
        cmd = ["umount", "-l", mountpoint] if lazy else ["umount", mountpoint]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode == 0, proc.stderr.strip()


def unmount(mountpoint: str | os.PathLike[str], *, force: bool = False,
            timeout: float = EXIT_TIMEOUT) -> str | None:
    """Unmount ``mountpoint`` and wait until the daemon stored its buffers and exited.

    ``force`` detaches lazily (``fusermount3 -uz``/``umount -l``): the way to
    clean a dead mount whose process was killed, or one still in use (the
    users keep their open files until they close them). A mount detached
    while in use returns at once (after ``IN_USE_WAIT_S``) with a note saying
    its daemon stays until those files are closed; else None. Raises
    NotMountedError, UnmountBusyError, MountFailedError (daemon still
    running after ``timeout``; a mount another user made, for a non-root
    caller).
    """
    path = os.path.abspath(mountpoint)
    entry = mount_entry(path)
    if entry is None:
        raise NotMountedError(path)
    owner = mount_owner(entry)
    if os.geteuid() != 0 and owner is not None and owner != os.geteuid():
        raise MountFailedError(
            f"{path} was mounted by uid {owner}: only that user or root may unmount it",
            hint=f"ask uid {owner} (or root) to run `shinglefs umount {path}`")
    state = read_state(path)
    ok, detail = kernel_unmount(path, lazy=False)
    detached_in_use = False
    if not ok and force:
        ok, detail = kernel_unmount(path, lazy=True)
        detached_in_use = ok
    if not ok:
        if "busy" in detail.lower():
            raise UnmountBusyError(path, detail)
        raise MountFailedError(f"cannot unmount {path}: {detail}",
                               hint="try `shinglefs umount --force " + path + "`")
    if state is None:
        return None
    # Detached while files were open on it: the daemon serves them until they
    # are closed, then stores what they wrote and exits. Not an error, and not
    # something to wait for: a short look, then say so.
    deadline = time.monotonic() + (min(timeout, IN_USE_WAIT_S) if detached_in_use else timeout)
    while state.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    if state.alive and detached_in_use:
        return (f"{path} is detached; its daemon (pid {state.pid}) serves the files still "
                "open on it until they are closed, then stores their data and exits")
    if state.alive:
        raise MountFailedError(
            f"{path} is unmounted but its daemon (pid {state.pid}) is still storing buffered "
            f"data after {timeout:.0f} s",
            hint=f"wait for pid {state.pid} to exit before mounting again",
        )
    with contextlib.suppress(OSError):
        state_path(path).unlink()
    return None


def clear_dead_mount(path: str, entry: dict[str, str]) -> bool:
    """Detach ``entry``, the mount at ``path``, if it is a ShingleFS mount whose
    daemon is gone: its state file names a process that no longer exists. The
    mount itself is never touched (a request to a hung mount would block).
    True when nothing is mounted at ``path`` any more."""
    if entry["fstype"] != FSTYPE:
        return False
    state = read_state(path)
    if state is None or state.alive:
        return False  # no state to judge by (another state dir?), or its daemon runs
    ok, detail = kernel_unmount(path, lazy=True)
    if not ok:
        log.warning("%s: cannot detach the mount of daemon %d, which is gone: %s",
                    path, state.pid, detail)
        return False
    log.warning("%s: the mount of daemon %d, which is gone (killed?), was detached",
                path, state.pid)
    with contextlib.suppress(OSError):
        state_path(path).unlink()
    return mount_entry(path) is None
