"""The mount daemon never sends a request to its own mount.

A thread of the daemon waiting in the kernel for an answer from its own FUSE
loop cannot be killed: a SIGKILL that lands while the request is being
served leaves the process stuck (uninterruptible, its /dev/fuse descriptor
held open by the stuck thread, so the connection never aborts) until someone
aborts the connection by hand. Here: the mount table parsing the daemon uses
instead of ``stat`` of its mount point; a probe file system that records
which process sent each request (run as ``python THIS_FILE MOUNTPOINT
RECORD``); and real mounts SIGKILLed at random moments of their startup.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyfuse3
import pytest

from shinglefs.bench.fuse_floor import FloorOperations
from shinglefs.fuse.harness import MountedFileSystem, default_drives, shinglefs_command
from shinglefs.fuse.mount import (
    READ_AHEAD_KB,
    fuse_options,
    mount_device,
    mount_entry,
    run_fuse_loop,
    write_back_outside,
)
from shinglefs.fuse.mounttable import mount_owner

GiB = 1024**3
ROOT = Path(__file__).resolve().parents[2]

# -- /proc/self/mountinfo ---------------------------------------------------------------

MOUNTINFO = [
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n",
    # A mount point with a space, a tab, a backslash and a newline in its name.
    "40 22 0:40 / /tmp/a\\040b\\011c\\134d\\012e rw,nosuid shared:7 - fuse.shinglefs shinglefs rw\n",
    # Two mounts stacked on /mnt/x: the newest (the last line) is the one in use.
    "41 22 0:41 / /mnt/x rw - fuse.shinglefs old rw,user_id=0\n",
    "42 41 0:42 / /mnt/x rw master:3 - fuse.shinglefs new\\040one rw,user_id=0\n",
    # A name that is the escaped text itself is another mount point.
    "43 22 0:43 / /tmp/a\\134040b rw - tmpfs tmpfs rw\n",
]


def test_mountinfo_entries_decode_octal_escapes_and_the_newest_stacked_mount_wins() -> None:
    odd = "/tmp/a b\tc\\d\ne"
    entry = mount_entry(odd, mountinfo=MOUNTINFO)
    assert entry == {"mountpoint": odd, "major_minor": "0:40", "fstype": "fuse.shinglefs",
                     "source": "shinglefs", "super_options": "rw"}
    assert mount_owner(entry) is None  # no user_id= shown
    assert mount_device(odd, mountinfo=MOUNTINFO) == (0, 40)
    stacked = mount_entry("/mnt/x", mountinfo=MOUNTINFO)
    assert stacked is not None and stacked["source"] == "new one"
    assert mount_owner(stacked) == 0
    assert mount_device("/mnt/x", mountinfo=MOUNTINFO) == (0, 42)
    assert mount_device("/tmp/a\\040b", mountinfo=MOUNTINFO) == (0, 43)
    assert mount_device("/tmp/a b", mountinfo=MOUNTINFO) is None
    assert mount_device("/", mountinfo=MOUNTINFO) == (8, 1)


# -- a probe file system: who sends the requests ---------------------------------------


class SelfAccessProbe(FloorOperations):
    """The floor file system, appending ``OP TID own|other`` to ``record`` for
    every request that names its sender (``own``: a thread of this process)."""

    def __init__(self, record: str) -> None:
        super().__init__()
        self.record = record

    def _note(self, op: str, ctx: pyfuse3.RequestContext) -> None:
        # /proc/self/task lists this process's threads only; FUSE names the
        # sending thread (not its process) in ctx.pid.
        own = os.path.exists(f"/proc/self/task/{ctx.pid}")
        with open(self.record, "a") as out:
            out.write(f"{op} {ctx.pid} {'own' if own else 'other'}\n")

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._note("getattr", ctx)
        return await super().getattr(inode, ctx)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._note("lookup", ctx)
        return await super().lookup(parent_inode, name, ctx)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        self._note("opendir", ctx)
        return await super().opendir(inode, ctx)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        self._note("statfs", ctx)
        return await super().statfs(ctx)


def probe_main(mountpoint: str, record: str) -> int:
    """Serve the probe at ``mountpoint`` with the real loop until unmounted or signalled."""

    def serving() -> None:
        with open(record, "a") as out:
            out.write("serving\n")

    pyfuse3.init(SelfAccessProbe(record), mountpoint, fuse_options(False, (), "selfprobe"))
    try:
        run_fuse_loop(mountpoint, on_serving=serving,
                      before_unmount=lambda: write_back_outside(mountpoint))
    finally:
        pyfuse3.close(unmount=True)
    return 0


class ProbeMount(MountedFileSystem):
    """``python THIS_FILE MOUNTPOINT RECORD`` as a child process."""

    def __init__(self, workdir: Path, name: str = "mnt") -> None:
        super().__init__(workdir, workdir / name)
        self.record = workdir / "requests.txt"
        self.log_path = workdir / "probe.log"

    def command(self) -> list[str]:
        return [sys.executable, __file__, str(self.mountpoint), str(self.record)]

    def lines(self) -> list[str]:
        return self.record.read_text().splitlines() if self.record.exists() else []

    def start(self, timeout: float = 60.0) -> None:
        """Return once the daemon called ``on_serving`` (without touching the mount)."""
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while "serving" not in self.lines():
            assert self.process.poll() is None, f"the probe exited:\n{self.log_text()}"
            assert time.monotonic() < deadline, f"the probe never served:\n{self.log_text()}"
            time.sleep(0.01)


@pytest.mark.fuse
def test_the_daemon_sends_no_request_to_its_own_mount(tmp_path: Path) -> None:
    probe = ProbeMount(tmp_path)
    try:
        probe.start()
        os.stat(probe.mountpoint)  # requests from another process are recorded
        assert os.listdir(probe.mountpoint) == []
        assert probe.process is not None
        probe.process.send_signal(signal.SIGTERM)  # write back, unmount, end the loop
        assert probe.process.wait(timeout=60) == 0, probe.log_text()
        probe.process = None
        assert mount_entry(probe.mountpoint) is None
    finally:
        probe.kill()
    requests = [line.split() for line in probe.lines() if line != "serving"]
    assert any(who == "other" for _, _, who in requests), requests
    assert [r for r in requests if r[2] == "own"] == []


@pytest.mark.fuse
@pytest.mark.skipif(os.geteuid() != 0, reason="only root may raise a bdi's read-ahead")
def test_read_ahead_is_raised_on_a_mount_point_with_escaped_characters(tmp_path: Path) -> None:
    probe = ProbeMount(tmp_path, "a mount\\point")
    try:
        probe.start()  # on_serving: after the read-ahead was raised
        device = mount_device(probe.mountpoint)
        assert device is not None
        dev = os.stat(probe.mountpoint).st_dev
        assert device == (os.major(dev), os.minor(dev))
        bdi = Path(f"/sys/class/bdi/{device[0]}:{device[1]}/read_ahead_kb")
        assert bdi.read_text().strip() == str(READ_AHEAD_KB)
    finally:
        probe.stop()


# -- SIGKILL during startup ---------------------------------------------------------------

KILLS = 10


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shinglefs_command(), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def kill_once(fs: MountedFileSystem, delay: float) -> str | None:
    """Spawn a foreground mount, SIGKILL it ``delay`` s after its mount appears in
    the mount table (read from /proc, never through the mount); returns what went
    wrong, or None."""
    env = dict(os.environ, SHINGLEFS_LOG="WARNING")
    with open(fs.log_path, "ab") as log:
        process = subprocess.Popen(fs.command(), stdout=log, stderr=log, env=env,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while mount_entry(fs.mountpoint) is None:
            if process.poll() is not None:
                return f"the mount exited with {process.returncode} before mounting"
            if time.monotonic() > deadline:
                return "the mount never appeared in the mount table"
            time.sleep(0.001)
        time.sleep(delay)
        process.kill()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            fs.abort_connection()
            process.wait(timeout=30)
            return f"SIGKILL {delay * 1000:.1f} ms after mounting: stuck until its connection was aborted"
        result = cli("umount", "--force", str(fs.mountpoint))
        if result.returncode != 0 or mount_entry(fs.mountpoint) is not None:
            return f"umount --force failed: {result.stderr}"
        return None
    finally:
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
        fs._detach_if_mounted()


@pytest.mark.fuse
def test_a_daemon_killed_at_any_moment_of_its_startup_dies_and_umount_force_cleans_up(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    fs = MountedFileSystem(data, tmp_path / "mnt",
                           drives=default_drives(data, smr_drives=1, smr_bytes=4 * GiB,
                                                 conventional_bytes=0))
    fs.format()
    rng = random.Random(20261203)
    # The first kill lands as soon as the mount exists; the others spread over
    # the daemon's first 30 ms of serving, where it used to stat its mount point.
    delays = [0.0] + [rng.uniform(0, 0.03) for _ in range(KILLS - 1)]
    failures = [f for f in (kill_once(fs, d) for d in delays) if f is not None]
    assert failures == [], f"{failures}\n{fs.log_text()}"
    # And once it has served: killed after the harness saw it ready.
    fs.start()
    assert fs.process is not None
    fs.process.kill()
    fs.process.wait(timeout=20)
    fs.process = None
    assert cli("umount", "--force", str(fs.mountpoint)).returncode == 0
    assert mount_entry(fs.mountpoint) is None


if __name__ == "__main__":
    sys.exit(probe_main(sys.argv[1], sys.argv[2]))
