"""Mounting: run the pyfuse3 loop over a ``VFS`` until unmounted or signalled.

Life of a mount (details and reasons in docs/mount.md):

1. The mount point is checked (a directory, not already a mount point) and
   /dev/fuse must exist.
2. Background mode forks BEFORE the file system is opened (a fork after the
   VFS started its I/O threads would copy a process with half its threads
   missing); the parent waits on a pipe and exits 0 only once the child
   reports the mount serving, or prints the child's error and exits with its
   exit code.
3. The child (or the foreground process) opens the VFS, mounts, starts the
   trio loop and, once a ``stat`` of the mount point made by a child process
   was answered through it, raises the bdi's read-ahead, writes a state file
   ``/run/shinglefs/<hash of mount point>.json`` naming its pid and meta URL
   (``shinglefs status``/``umount`` read it) and reports ready. The daemon
   never touches its own mount point (a SIGKILL while one of its threads
   waits on its own loop would leave it stuck in the kernel): the bdi is
   found in /proc/self/mountinfo.
4. SIGINT/SIGTERM: the kernel's dirty pages are written back (``sync -f`` in
   a child process while the loop still serves), the mount is unmounted (by
   fusermount3; lazily if busy), the loop ends, and ``VFS.shutdown`` stores
   every buffered byte before the process exits. An external
   ``umount``/``fusermount3 -u`` takes the same path from the point where the
   loop ends (the kernel writes back dirty pages before it lets the unmount
   finish).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shinglefs.errors import ShingleError
from shinglefs.fuse.errors import (
    AllowOtherDeniedError,
    FuseUnavailableError,
    MountFailedError,
)
from shinglefs.fuse.mounttable import (
    DEFAULT_STATE_DIR,
    EXIT_TIMEOUT,
    FSTYPE,
    STATE_DIR_ENV,
    MountState,
    check_mountpoint,
    kernel_unmount,
    mount_device,
    mount_entry,
    mounts_of_type,
    read_state,
    remove_state,
    state_dir,
    state_path,
    unmount,
    write_state,
)
from shinglefs.meta.api import ROOT_INO

if TYPE_CHECKING:
    from shinglefs.client.vfs import VFS

# The mount table's names that callers have always imported from here.
__all__ = ["DEFAULT_STATE_DIR", "EXIT_TIMEOUT", "FSTYPE", "STATE_DIR_ENV", "MountState",
           "check_fuse", "check_mountpoint", "fuse_options", "mount", "mount_device",
           "mount_entry", "mounts_of_type", "read_state", "resolve_allow_other", "run_fuse_loop",
           "serve", "split_options", "state_dir", "state_path", "unmount",
           "user_may_allow_other"]

log = logging.getLogger(__name__)

READY_TIMEOUT = 300.0  # seconds the parent waits for a background mount to serve

# Read-ahead of the mount's backing device info (the kernel default is 128 KiB):
# 1 MiB lets one FUSE read request carry 1 MiB (libfuse negotiates max_pages=256),
# so a sequential reader pays one thread hop per MiB instead of per 128 KiB.
READ_AHEAD_KB = 1024

# fusermount3 lets a non-root user mount with allow_other only when this file
# has a line `user_allow_other`.
FUSE_CONF = Path("/etc/fuse.conf")


def check_fuse() -> None:
    """Raise FuseUnavailableError unless this process can mount a FUSE file system."""
    if not os.path.exists("/dev/fuse"):
        raise FuseUnavailableError("/dev/fuse does not exist")
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        raise FuseUnavailableError("fusermount3 is not installed (needed when not root)")
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as exc:
        if os.geteuid() == 0 or exc.errno != errno.EACCES:
            raise FuseUnavailableError(f"cannot open /dev/fuse: {exc.strerror}") from None
    else:
        os.close(fd)


def user_may_allow_other(conf: Path = FUSE_CONF) -> bool:
    """``conf`` (fuse.conf) has a ``user_allow_other`` line, as fusermount3 reads it."""
    try:
        lines = conf.read_text(errors="replace").splitlines()
    except OSError:
        return False
    return any(line.strip() == "user_allow_other" for line in lines)


def resolve_allow_other(requested: bool | None) -> bool:
    """Whether a mount serves every user: ``requested``, or by default when
    mounting as root (a shared mount, as MooseFS and JuiceFS do: jobs on a
    cluster run as many users; ``default_permissions`` keeps the modes
    enforced). Raises AllowOtherDeniedError when a non-root user asks for it
    and /etc/fuse.conf does not let them."""
    if requested is None:
        return os.geteuid() == 0
    if requested and os.geteuid() != 0 and not user_may_allow_other():
        raise AllowOtherDeniedError(str(FUSE_CONF))
    return requested


# -- state files ------------------------------------------------------------------------


# -- serving ----------------------------------------------------------------------------


# Our own -o option (not passed to libfuse): turn the kernel's writeback cache on.
WRITEBACK_OPTION = "writeback_cache"


def split_options(options: Iterable[str]) -> list[str]:
    """``-o`` values (each comma separated) as single options."""
    return [part.strip() for opt in options for part in opt.split(",") if part.strip()]


def fuse_options(allow_other: bool, options: Iterable[str], name: str) -> set[str]:
    """The libfuse options of a mount (see docs/mount.md for why each); our own
    options (``writeback_cache``) are not among them."""
    import pyfuse3

    opts = set(pyfuse3.default_options)  # default_permissions: the kernel checks modes
    opts.add(f"fsname={name}")
    opts.add("subtype=" + FSTYPE.removeprefix("fuse."))
    opts.add("noatime")  # reads record no access time: say so in /proc/mounts
    if allow_other:
        opts.add("allow_other")
    opts.update(o for o in split_options(options) if o != WRITEBACK_OPTION)
    return opts


def write_back_outside(mountpoint: str) -> bool:
    """Have the kernel write the mount's dirty pages back (``syncfs``, run by
    ``sync -f`` in a child process), for a daemon whose loop still serves them.

    Returns whether ``sync`` succeeded: then every page dirty when it started
    has been handed to the loop (not necessarily stored by the VFS yet).
    Raises nothing. A child, because a thread of the daemon waiting in the
    kernel on its own mount cannot be killed: a SIGKILL would leave the daemon
    stuck; the child instead gets ENOTCONN when the daemon dies.
    """
    try:
        proc = subprocess.run(["sync", "-f", mountpoint], capture_output=True, text=True,
                              check=False)
    except OSError as exc:
        log.warning("cannot run sync -f %s: %s", mountpoint, exc)
        return False
    if proc.returncode != 0:
        log.warning("sync -f %s failed: %s", mountpoint, proc.stderr.strip())
    return proc.returncode == 0


def _stat_outside(mountpoint: str) -> None:
    """``stat`` the mount point in a child process; returns once it was
    answered. Raises MountFailedError if the stat failed."""
    proc = subprocess.run(["stat", "--format=%d", mountpoint], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise MountFailedError(f"the mount at {mountpoint} does not answer: "
                               f"{proc.stderr.strip()}")


def _tune_bdi(mountpoint: str) -> None:
    """Raise the read-ahead of the mount's bdi (root only; a no-op elsewhere).

    The bdi is named after the mount's device, read from the mount table: a
    ``stat`` of the mount point would be a request to our own loop. The mount
    table names the mount point with its parent's symlinks resolved.
    """
    mountpoint = os.path.abspath(mountpoint)
    resolved = os.path.join(os.path.realpath(os.path.dirname(mountpoint)),
                            os.path.basename(mountpoint))
    entry = mount_entry(resolved)
    if entry is None or entry["fstype"] != FSTYPE:
        log.info("read-ahead not raised (no ShingleFS mount at %s in the mount table); "
                 "the kernel default applies", resolved)
        return
    try:
        with open(f"/sys/class/bdi/{entry['major_minor']}/read_ahead_kb", "w") as bdi:
            bdi.write(str(READ_AHEAD_KB))
    except OSError as exc:
        log.info("read-ahead not raised (%s); the kernel default applies", exc)


def run_fuse_loop(
    mountpoint: str,
    *,
    on_serving: Callable[[], None] | None = None,
    before_unmount: Callable[[], object] | None = None,
) -> None:
    """Run the pyfuse3 loop of a mount ``pyfuse3.init`` set up, until it is
    unmounted or SIGINT/SIGTERM arrives.

    Once a ``stat`` of the mount point, made by a child process, was answered
    through the loop (so the kernel's INIT is answered too: no request passes
    before it), the bdi's read-ahead is raised (INIT would lower it again) and
    ``on_serving()`` called in the loop's thread: the mount serves requests.
    On a signal, ``before_unmount()`` runs in a thread (the loop still
    serves), then the mount is unmounted by a child process, or the loop
    ended and left for a lazy detach when it is busy. The caller closes
    pyfuse3 (``pyfuse3.close``) afterwards.

    This process never sends a request to its own mount (no ``stat``,
    ``syncfs`` or unmount from a thread of ours while the loop serves): a
    thread waiting in the kernel on our own loop cannot be killed, so a
    SIGKILL then would leave the daemon stuck until its FUSE connection is
    aborted by hand. A child stuck that way gets ENOTCONN when the daemon
    dies. ``before_unmount`` must keep that rule too (``write_back_outside``).
    """
    import pyfuse3
    import trio

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("signal %s: unmounting %s", signum, mountpoint)
                if before_unmount is not None:
                    await trio.to_thread.run_sync(before_unmount)
                ok, detail = await trio.to_thread.run_sync(
                    lambda: kernel_unmount(mountpoint, False, syscall=False))
                if not ok:
                    log.info("unmount on signal failed (%s); detaching", detail)
                    pyfuse3.terminate()
                return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async def run_loop() -> None:
                await pyfuse3.main()
                nursery.cancel_scope.cancel()

            nursery.start_soon(run_loop)
            nursery.start_soon(watch_signals)
            await trio.to_thread.run_sync(_stat_outside, mountpoint)
            await trio.to_thread.run_sync(_tune_bdi, mountpoint)
            if on_serving is not None:
                on_serving()

    trio.run(main)


def serve(
    vfs: VFS,
    mountpoint: str,
    *,
    allow_other: bool | None = None,
    options: Iterable[str] = (),
    meta_url: str | None = None,
    name: str = "shinglefs",
    on_ready: Callable[[], None] | None = None,
    offload_metadata: bool | None = None,
    status: Callable[[VFS], dict[str, Any]] | None = None,
) -> None:
    """Mount ``vfs`` at ``mountpoint`` and serve until unmounted or SIGINT/SIGTERM.

    Returns after ``vfs.shutdown()`` stored every buffered byte and the mount
    is gone. ``on_ready`` is called (in the loop's thread) once the mount
    serves requests (``run_fuse_loop``'s ``on_serving``), after the state file
    is written.
    ``allow_other``: other users may use the mount (None: when root, see
    ``resolve_allow_other``).
    ``status(vfs)`` feeds the root's virtual ``user.shinglefs.status`` xattr.
    ``offload_metadata`` (default: only for PostgreSQL, where every metadata
    call is a network round trip) runs namespace requests in worker threads.
    """
    import pyfuse3

    from shinglefs.fuse.operations import ShingleOperations, fuse_device_fd

    def status_provider() -> bytes:
        report: dict[str, Any] = {"meta_url": meta_url, "mountpoint": mountpoint,
                                  "pid": os.getpid()}
        if status is not None:
            report.update(status(vfs))
        report.update(mountpoint=mountpoint, pid=os.getpid(), fuse_ops=ops.op_stats.snapshot())
        return json.dumps(report, default=str).encode()

    _answers_root(vfs)
    if offload_metadata is None:
        offload_metadata = bool(meta_url and meta_url.startswith(("postgres", "postgresql")))
    ops = ShingleOperations(vfs, offload_metadata=offload_metadata,
                            status_provider=status_provider,
                            writeback_cache=WRITEBACK_OPTION in split_options(options))
    try:
        pyfuse3.init(ops, mountpoint,
                     fuse_options(resolve_allow_other(allow_other), options, name))
    except Exception as exc:
        with contextlib.suppress(Exception):
            vfs.shutdown()
        raise MountFailedError(f"cannot mount {mountpoint}: {exc}",
                               hint="check `dmesg` and that /dev/fuse is usable") from None

    fuse_fd = fuse_device_fd()
    if fuse_fd is not None:
        ops.watch_queue(fuse_fd)

    def ready() -> None:
        write_state(MountState(mountpoint, os.getpid(), meta_url, time.time()))
        if on_ready is not None:
            on_ready()

    failed: BaseException | None = None
    try:
        # Write back the kernel's dirty pages while the loop still serves them.
        run_fuse_loop(mountpoint, on_serving=ready,
                      before_unmount=lambda: write_back_outside(mountpoint))
    except BaseException as exc:
        failed = exc
        log.exception("the FUSE loop of %s ended with an error", mountpoint)
    finally:
        try:
            vfs.shutdown()
        finally:
            # Unmounts (lazily) only if the loop ended without the kernel unmounting.
            pyfuse3.close(unmount=True)
            remove_state(mountpoint)
    while isinstance(failed, BaseExceptionGroup) and len(failed.exceptions) == 1:
        failed = failed.exceptions[0]  # the loop's nursery wraps what failed in it
    if isinstance(failed, ShingleError):
        raise failed
    if failed is not None and not isinstance(failed, KeyboardInterrupt):
        raise MountFailedError(f"the mount of {mountpoint} failed: {failed}") from failed


def _answers_root(vfs: VFS) -> None:
    """Read the root's attributes before mounting: metadata that cannot answer
    them (a damaged database, a lost PostgreSQL) fails the mount with its own
    error and hint, instead of a mount whose every request says EIO. The VFS is
    shut down first, writing no metadata backup (of metadata that fails)."""
    try:
        vfs.getattr(ROOT_INO)
    except ShingleError:
        vfs.meta_backup.interval_s = 0
        with contextlib.suppress(Exception):
            vfs.shutdown()
        raise


def mount(
    open_vfs: Callable[[], VFS],
    mountpoint: str | os.PathLike[str],
    *,
    foreground: bool = True,
    allow_other: bool | None = None,
    options: Iterable[str] = (),
    meta_url: str | None = None,
    name: str = "shinglefs",
    log_file: str | os.PathLike[str] | None = None,
    status: Callable[[VFS], dict[str, Any]] | None = None,
) -> None:
    """Mount the file system ``open_vfs()`` opens; in the foreground, return when
    it is unmounted (an open VFS is served directly by ``serve``).

    The mount opens the file system itself, after the checks: in background
    mode (``foreground=False``) the process forks first, the child opens the
    VFS and mounts, and this call returns in the parent only when the mount
    serves (raising the child's error otherwise). The child logs to
    ``log_file`` (default: ``/run/shinglefs/<hash>.log``). ``allow_other``:
    other users may use the mount; None (the default) means yes when mounting
    as root (``resolve_allow_other``).
    """
    path = check_mountpoint(mountpoint)
    check_fuse()
    allow_other = resolve_allow_other(allow_other)
    if foreground:
        serve(open_vfs(), path, allow_other=allow_other, options=options, meta_url=meta_url,
              name=name, status=status)
        return
    _daemonize_and_serve(open_vfs, path, allow_other=allow_other, options=list(options),
                         meta_url=meta_url, name=name, status=status,
                         log_file=str(log_file) if log_file else str(state_path(path).with_suffix(".log")))


def _daemonize_and_serve(open_vfs: Callable[[], VFS], mountpoint: str, *, allow_other: bool,
                         options: list[str], meta_url: str | None, name: str,
                         log_file: str, status: Callable[[VFS], dict[str, Any]] | None) -> None:
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    # Fork twice so that the daemon is adopted by init (or a subreaper) and is
    # reaped when it exits, whatever the caller does after we return.
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            code = _daemon_main(open_vfs, mountpoint, write_fd, allow_other=allow_other,
                                options=options, meta_url=meta_url, name=name,
                                log_file=log_file, status=status)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write_fd)
    os.waitpid(pid, 0)
    message = _read_report(read_fd)
    os.close(read_fd)
    if message.get("ok"):
        return
    err = MountFailedError(message.get("message", "the mount daemon failed"),
                           hint=message.get("hint"))
    err.exit_code = int(message.get("exit_code", MountFailedError.exit_code))
    raise err


def _read_report(read_fd: int) -> dict[str, Any]:
    """The daemon's JSON report (``{"pid": N}`` first, then ``{"ok": ...}``).

    An error dict on EOF or timeout (the daemon is then sent SIGTERM).
    """
    buf = b""
    daemon_pid = None
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                message = dict(json.loads(line))
            except ValueError:
                return {"ok": False, "message": line.decode(errors="replace").strip()}
            if "ok" in message:
                return message
            daemon_pid = message.get("pid", daemon_pid)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if daemon_pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(daemon_pid, signal.SIGTERM)
            return {"ok": False,
                    "message": f"the mount did not come up within {READY_TIMEOUT:.0f} s"}
        waiter = select.poll()  # not select(): descriptors past 1024 are common
        waiter.register(read_fd, select.POLLIN)
        if waiter.poll(int(min(remaining, 1.0) * 1000)):
            chunk = os.read(read_fd, 65536)
            if not chunk:
                return {"ok": False, "message": "the mount daemon exited before the mount was ready"}
            buf += chunk


def _daemon_main(open_vfs: Callable[[], VFS], mountpoint: str, report_fd: int, *,
                 allow_other: bool, options: list[str], meta_url: str | None, name: str,
                 log_file: str, status: Callable[[VFS], dict[str, Any]] | None) -> int:
    """Body of the background child; returns its exit code."""
    reported = False

    def report(message: dict[str, Any]) -> None:
        nonlocal reported
        if not reported:
            reported = True
            with contextlib.suppress(OSError):
                os.write(report_fd, json.dumps(message).encode() + b"\n")
                os.close(report_fd)

    def on_ready() -> None:
        report({"ok": True})
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(devnull, fd)
        os.close(devnull)

    with contextlib.suppress(OSError):
        os.write(report_fd, json.dumps({"pid": os.getpid()}).encode() + b"\n")
    try:
        os.chdir("/")
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        vfs = open_vfs()
        serve(vfs, mountpoint, allow_other=allow_other, options=options, meta_url=meta_url,
              name=name, on_ready=on_ready, status=status)
    except ShingleError as exc:
        log.error("mount of %s failed: %s", mountpoint, exc)
        report({"ok": False, "message": str(exc), "hint": exc.hint, "exit_code": exc.exit_code})
        return exc.exit_code
    except BaseException as exc:
        traceback.print_exc()
        report({"ok": False, "message": f"the mount daemon failed: {exc!r}",
                "hint": f"see {log_file}"})
        return 1
    report({"ok": False, "message": "the mount ended before it was ready"})
    return 0
