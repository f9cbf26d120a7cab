"""A real mount in a subprocess, for tests and benchmarks.

``MountedFileSystem`` formats a fresh file system (SQLite metadata and
emulated SMR drives as sparse files in a directory), mounts it by running
``shinglefs mount --foreground`` as a child process, polls
``os.path.ismount`` until it serves, and always unmounts (``fusermount3 -u``,
then SIGTERM/SIGKILL, then a lazy unmount) when stopped, so a failing test
never leaves a mount behind.

``UpMount`` does the same for ``shinglefs up DATA_DIR MOUNTPOINT
--foreground``, the one-command daemon users run: it formats on first use
and serves its drives to the host's other processes (server/share.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

GiB = 1024**3


def shinglefs_command() -> list[str]:
    """The ``shinglefs`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("shinglefs")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from shinglefs.cli.main import main; main()"]


def default_drives(data_dir: Path, *, smr_drives: int = 2, smr_bytes: int = 8 * GiB,
                   conventional_bytes: int = 2 * GiB) -> list[str]:
    """Drive specs for a test file system: sparse files, so their size costs nothing."""
    specs = [f"emulated:{data_dir / f'smr{i}.img'}:{smr_bytes}" for i in range(smr_drives)]
    if conventional_bytes:
        specs.append(f"conventional:{data_dir / 'conventional.img'}:{conventional_bytes}")
    return specs


class MountedFileSystem:
    """A formatted file system in ``data_dir`` mounted at ``mountpoint`` by a child process.

    Metadata: SQLite in ``data_dir`` unless ``meta_url`` names another database.
    """

    def __init__(self, data_dir: Path, mountpoint: Path, *, drives: list[str] | None = None,
                 env: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 meta_url: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.mountpoint = Path(mountpoint)
        self.meta_url = meta_url or f"sqlite3://{self.data_dir.resolve() / 'meta.db'}"
        self.drives = drives
        self.env = env
        self.extra_args = extra_args or []
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "mount.log"

    @classmethod
    def with_read_cache(cls, root: Path, cache_mib: int) -> MountedFileSystem:
        """A file system under ``root`` (16 GiB of SMR, 2 GiB conventional) whose
        mount has a ``cache_mib`` read cache (memory and read-ahead tests)."""
        return cls(root / "data", root / "mnt",
                   drives=default_drives(root / "data", smr_bytes=16 * GiB,
                                         conventional_bytes=2 * GiB),
                   env={"SHINGLEFS_READ_CACHE_MIB": str(cache_mib)})

    # -- life cycle -------------------------------------------------------------------------

    def format(self) -> None:
        from shinglefs.client.filesystem import format_filesystem

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        drives = self.drives or default_drives(self.data_dir)
        format_filesystem(self.meta_url, drives, name="test")

    def command(self) -> list[str]:
        """The child's command line: a foreground mount."""
        return [*shinglefs_command(), "mount", self.meta_url, str(self.mountpoint),
                "--foreground", *self.extra_args]

    def start(self, timeout: float = 60.0) -> None:
        """Mount in a child process; return when the mount serves (raises on failure)."""
        env = dict(os.environ)
        env.setdefault("SHINGLEFS_LOG", "WARNING")
        env.update(self.env or {})
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=log, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise RuntimeError(f"the mount process exited with {code}:\n"
                                   f"{self.log_text()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the mount did not come up within {timeout} s:\n"
                                   f"{self.log_text()}")
            time.sleep(0.02)

    def stop(self, timeout: float = 60.0) -> int | None:
        """Unmount and wait for the child; escalates to signals and a lazy unmount."""
        process = self.process
        if process is None:
            return None
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True,
                           check=False)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.abort_connection()  # a daemon stuck in a request to its own mount
                    process.wait(timeout=30)
        self._detach_if_mounted()
        self.process = None
        return process.returncode

    def kill(self) -> None:
        """SIGKILL the mount process (a crash); the dead mount is detached lazily."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.abort_connection()
                self.process.wait(timeout=30)
            self.process = None
        self._detach_if_mounted()

    def abort_connection(self) -> bool:
        """Abort the mount's FUSE connection (``/sys/fs/fuse/connections/N/abort``).

        Every pending request fails at once; the way to free a daemon (or an
        application) stuck in a request that will never be answered.
        """
        from shinglefs.fuse.mount import mount_entry

        entry = mount_entry(self.mountpoint)
        if entry is None:
            return False
        minor = entry["major_minor"].split(":")[1]
        connections = Path("/sys/fs/fuse/connections")
        if not (connections / minor).exists() and os.geteuid() == 0:
            # The fusectl file system is usually mounted by systemd; not in containers.
            subprocess.run(["mount", "-t", "fusectl", "fusectl", str(connections)],
                           capture_output=True, check=False, timeout=30)
        try:
            with open(f"/sys/fs/fuse/connections/{minor}/abort", "w") as abort:
                abort.write("1")
        except OSError:
            return False
        return True

    def _detach_if_mounted(self) -> None:
        from shinglefs.fuse.mount import mount_entry

        if mount_entry(self.mountpoint) is not None:
            tool = shutil.which("fusermount3")
            cmd = [tool, "-u", "-z", str(self.mountpoint)] if tool else \
                ["umount", "-l", str(self.mountpoint)]
            subprocess.run(cmd, capture_output=True, check=False, timeout=60)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def __enter__(self) -> MountedFileSystem:
        self.format()
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class UpMount(MountedFileSystem):
    """``shinglefs up DATA_DIR MOUNTPOINT --foreground`` in a child process.

    The child is the daemon: its pid (``daemon_pid``) is the one SIGKILL
    (``kill``) must reach, and its stderr goes to ``DATA_DIR/mount.log`` as
    ``up``'s own log would. ``format`` only creates the directories: the
    first ``start`` formats (``up``'s drives and sizes), as it does for a user.
    Metadata: ``sqlite3://DATA_DIR/meta.db`` (``up``'s). Stopping and cleaning
    are ``MountedFileSystem``'s.
    """

    def __init__(self, data_dir: Path, mountpoint: Path, *, env: dict[str, str] | None = None,
                 extra_args: list[str] | None = None) -> None:
        super().__init__(data_dir, mountpoint, env=env, extra_args=extra_args)

    @property
    def daemon_pid(self) -> int | None:
        """The pid of the running daemon (None when not started or stopped)."""
        return self.process.pid if self.process is not None else None

    def format(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        """The child's command line: ``up`` in the foreground."""
        return [*shinglefs_command(), "up", str(self.data_dir), str(self.mountpoint),
                "--foreground", *self.extra_args]

    def __enter__(self) -> UpMount:
        self.format()
        self.start()
        return self


def drop_caches() -> bool:
    """Drop the kernel's clean page cache (root only); returns whether it happened."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("3\n")
        return True
    except OSError:
        return False
