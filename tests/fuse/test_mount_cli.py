"""The file-system commands end to end: format, mount, status, umount, up, and their errors.

Every command runs as the real ``shinglefs`` console script in a subprocess;
every mount made here is unmounted in a ``finally`` (lazily if need be).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.polling import wait_until

from shinglefs.fuse.errors import (
    AlreadyMountedError,
    MountPointError,
    NotMountedError,
)
from shinglefs.fuse.harness import MountedFileSystem, default_drives, shinglefs_command
from shinglefs.fuse.mount import mount_entry

pytestmark = pytest.mark.fuse

GiB = 1024**3


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shinglefs_command(), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def force_unmount(path: Path) -> None:
    if mount_entry(path) is not None:
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True, check=False)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "mnt").mkdir()
    try:
        yield tmp_path
    finally:
        force_unmount(tmp_path / "mnt")


def format_in(workdir: Path) -> str:
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    url = f"sqlite3://{data / 'meta.db'}"
    drives = default_drives(data, smr_drives=1, smr_bytes=4 * GiB, conventional_bytes=0)
    args = ["format", url, "--name", "clitest"]
    for spec in drives:
        args += ["--drive", spec]
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    return url


def test_background_mount_status_and_umount_keep_the_data(workdir: Path) -> None:
    url = format_in(workdir)
    mnt = workdir / "mnt"
    result = cli("mount", url, str(mnt))
    assert result.returncode == 0, result.stderr
    assert os.path.ismount(mnt)  # ready when the command returns
    try:
        (mnt / "kept").write_bytes(b"k" * 100_000)
        status = cli("status", str(mnt), "--json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["meta_url"] == url
        assert report["capacity_bytes"] >= 4 * GiB - 256 * 1024**2
        assert len(report["drives"]) == 1 and report["zones"]
        assert report["write_amplification"] >= 1.0
        table = cli("status", str(mnt))
        assert table.returncode == 0 and "write amplification" in table.stdout
    finally:
        result = cli("umount", str(mnt))
    assert result.returncode == 0, result.stderr
    assert not os.path.ismount(mnt)
    # The daemon has exited: the drives are free to be opened again, bytes intact.
    fs2 = MountedFileSystem(workdir / "data", mnt)
    fs2.start()
    try:
        assert (mnt / "kept").read_bytes() == b"k" * 100_000
    finally:
        fs2.stop()


def test_a_mount_over_files_says_they_are_hidden(workdir: Path) -> None:
    """FUSE mounts over a non-empty directory without a word, and a user looking
    for the files there finds the file system instead."""
    url = format_in(workdir)
    mnt = workdir / "mnt"
    (mnt / "mine.txt").write_text("still here")
    result = cli("mount", url, str(mnt))
    assert result.returncode == 0, result.stderr
    try:
        assert f"{mnt} is not empty: its 1 entry is hidden" in result.stderr
        assert not (mnt / "mine.txt").exists()
    finally:
        assert cli("umount", str(mnt)).returncode == 0
    assert (mnt / "mine.txt").read_text() == "still here"


def test_sigterm_writes_back_dirty_mmap_pages_before_exit(workdir: Path) -> None:
    fs = MountedFileSystem(workdir / "data", workdir / "mnt")
    fs.format()
    fs.start()
    try:
        path = fs.mountpoint / "dirty"
        path.write_bytes(bytes(1024 * 1024))
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            m[:11] = b"dirty pages"  # no msync: only in the kernel page cache
        assert fs.process is not None
        fs.process.send_signal(signal.SIGTERM)
        assert fs.process.wait(timeout=60) == 0, fs.log_text()
        fs.process = None
        assert mount_entry(fs.mountpoint) is None
        fs.start()
        assert path.read_bytes()[:11] == b"dirty pages"
    finally:
        fs.stop()


def test_umount_force_cleans_a_dead_mount(workdir: Path) -> None:
    fs = MountedFileSystem(workdir / "data", workdir / "mnt")
    fs.format()
    fs.start()
    assert fs.process is not None
    os.kill(fs.process.pid, signal.SIGKILL)
    try:
        fs.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        fs.abort_connection()
        fs.process.wait(timeout=30)
        pytest.fail("the killed daemon stayed stuck in the kernel until its connection was aborted")
    fs.process = None
    assert mount_entry(fs.mountpoint) is not None  # dead, still in the mount table
    with pytest.raises(OSError):
        os.listdir(fs.mountpoint)
    result = cli("umount", "--force", str(fs.mountpoint))
    assert result.returncode == 0, result.stderr
    assert mount_entry(fs.mountpoint) is None



def test_umount_force_of_a_mount_in_use_returns_at_once_and_loses_nothing(
        workdir: Path) -> None:
    """``--force`` detaches a mount with files open on it: it says the daemon
    stays for them (not a failure after 120 s), the open file is still written
    and closed through its descriptor, and the daemon then stores it and exits."""
    fs = MountedFileSystem(workdir / "data", workdir / "mnt")
    fs.format()
    fs.start()
    assert fs.process is not None
    fd = os.open(fs.mountpoint / "open.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"a" * (1 << 20))
        busy = cli("umount", str(fs.mountpoint))
        assert busy.returncode != 0 and "busy" in busy.stderr.lower(), busy.stderr
        result = cli("umount", "--force", str(fs.mountpoint), timeout=60)
        assert result.returncode == 0, result.stderr
        assert "is detached" in result.stdout and "still open" in result.stdout, result.stdout
        assert mount_entry(fs.mountpoint) is None
        assert fs.process.poll() is None  # serving the open file
        os.write(fd, b"b" * (1 << 20))
    finally:
        os.close(fd)
    fs.process.wait(timeout=60)  # the last file closed: stored, and gone
    fs.process = None
    fs.start()
    try:
        assert (fs.mountpoint / "open.bin").read_bytes() == b"a" * (1 << 20) + b"b" * (1 << 20)
    finally:
        fs.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_user_cannot_unmount_roots_mount_and_is_told_why(workdir: Path) -> None:
    from shinglefs.fuse.errors import MountFailedError
    from shinglefs.fuse.mounttable import unmount

    fs = MountedFileSystem(workdir / "data", workdir / "mnt")
    fs.format()
    fs.start()
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, as nobody
            code = 1
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                unmount(fs.mountpoint, force=True)
            except MountFailedError as exc:
                os.write(write, f"{exc}\n{exc.hint}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read, "rb") as f:
            said = f.read().decode()
        assert os.waitstatus_to_exitcode(status) == 0, said
        assert "was mounted by uid 0: only that user or root may unmount it" in said
        assert "--force" not in said  # no hint that leads back here
        assert mount_entry(fs.mountpoint) is not None
        assert (fs.mountpoint / "still").write_bytes(b"served") == 6
    finally:
        fs.stop()


def test_status_of_every_mount_is_not_stopped_by_one_that_does_not_answer(
        workdir: Path) -> None:
    live = MountedFileSystem(workdir / "live", workdir / "mnt-live")
    dead = MountedFileSystem(workdir / "dead", workdir / "mnt-dead")
    for fs in (live, dead):
        fs.format()
        fs.start()
    try:
        assert dead.process is not None
        os.kill(dead.process.pid, signal.SIGKILL)
        dead.process.wait(timeout=30)
        dead.process = None
        result = cli("status")
        assert result.returncode == 0, result.stderr
        assert str(live.mountpoint) in result.stdout
        assert f"{dead.mountpoint}: the mount at {dead.mountpoint} does not answer" \
            in result.stderr, result.stderr
        as_json = json.loads(cli("status", "--json").stdout)
        assert "error" in as_json[str(dead.mountpoint)]
        assert "drives" in json.dumps(as_json[str(live.mountpoint)])
        # Asked by its path: it does not answer (was: "is neither a directory
        # nor a metadata URL", exit 2, for a mount point that is one).
        one = cli("status", str(dead.mountpoint))
        assert one.returncode != 0 and "does not answer" in one.stderr, one.stderr
        assert "neither a directory" not in one.stderr
    finally:
        force_unmount(dead.mountpoint)
        live.stop()


def test_status_is_not_held_by_a_mount_whose_daemon_does_not_answer(workdir: Path) -> None:
    """A daemon that is alive but does not answer (stopped; or waiting on a
    metadata database that is down, 30 s a request) held `status` -- every
    mount's status with it -- for as long: with this one stopped, forever."""
    live = MountedFileSystem(workdir / "live", workdir / "mnt-live")
    stuck = MountedFileSystem(workdir / "stuck", workdir / "mnt-stuck")
    for fs in (live, stuck):
        fs.format()
        fs.start()
    assert stuck.process is not None
    os.kill(stuck.process.pid, signal.SIGSTOP)
    try:
        # 5 s: the live mounts answer within it on a loaded machine too.
        every = cli("status", "--mount-timeout", "5", timeout=60)
        assert every.returncode == 0, every.stderr
        assert str(live.mountpoint) in every.stdout
        assert f"the mount at {stuck.mountpoint} does not answer within 5 s" in every.stderr
        one = cli("status", str(stuck.mountpoint), "--mount-timeout", "2", timeout=60)
        assert one.returncode != 0 and "does not answer within 2 s" in one.stderr, one.stderr
        assert "Traceback" not in one.stderr
    finally:
        stuck.kill()  # SIGKILL ends it stopped as it is; its mount is detached
        live.stop()


def test_up_again_after_its_daemon_was_killed_mounts_over_the_dead_mount(workdir: Path) -> None:
    """A SIGKILLed ``up`` leaves its mount point dead (every request ENOTCONN);
    running ``up`` again, as a user does after a crash, detaches it and
    mounts: the file closed before the kill is there. Before, ``up`` refused
    with "already a mount point" (exit 11) until ``shinglefs umount``."""
    data, mnt = workdir / "up", workdir / "mnt"
    first = cli("up", str(data), str(mnt))
    assert first.returncode == 0, first.stderr
    (mnt / "closed.bin").write_bytes(b"kept" * 1000)
    pid = json.loads(os.getxattr(mnt, "user.shinglefs.status"))["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "the killed daemon is gone")
    assert mount_entry(mnt) is not None  # dead, still in the mount table
    with pytest.raises(OSError):
        os.listdir(mnt)
    again = cli("up", str(data), str(mnt))
    assert again.returncode == 0, again.stderr
    try:
        assert (mnt / "closed.bin").read_bytes() == b"kept" * 1000
    finally:
        assert cli("umount", str(mnt)).returncode == 0
    other = cli("up", str(data), str(mnt))  # a live mount is still refused
    try:
        assert other.returncode == 0, other.stderr
        refused = cli("up", str(data), str(mnt))
        assert refused.returncode == AlreadyMountedError.exit_code
        assert "already a mount point" in refused.stderr
    finally:
        assert cli("umount", str(mnt)).returncode == 0

def test_mount_errors_have_one_line_and_documented_exit_codes(workdir: Path) -> None:
    url = format_in(workdir)
    missing = cli("mount", url, str(workdir / "nope"))
    assert missing.returncode == MountPointError.exit_code
    assert "no such directory" in missing.stderr and "hint:" in missing.stderr
    assert "Traceback" not in missing.stderr
    (workdir / "file").write_text("")
    not_dir = cli("mount", url, str(workdir / "file"))
    assert not_dir.returncode == MountPointError.exit_code
    not_mounted = cli("umount", str(workdir / "mnt"))
    assert not_mounted.returncode == NotMountedError.exit_code
    bad_url = cli("mount", "nosuchdb://x", str(workdir / "mnt"))
    assert bad_url.returncode not in (0, 1) and "Traceback" not in bad_url.stderr
    unformatted = cli("mount", f"sqlite3://{workdir / 'empty.db'}", str(workdir / "mnt"))
    assert unformatted.returncode not in (0, 1), unformatted.stderr
    assert "Traceback" not in unformatted.stderr and "hint:" in unformatted.stderr
    assert mount_entry(workdir / "mnt") is None
    again = cli("format", url, "--drive", f"emulated:{workdir / 'x.img'}:1073741824")
    assert again.returncode not in (0, 1) and "Traceback" not in again.stderr


def test_mount_on_a_mounted_directory_is_refused(workdir: Path) -> None:
    fs = MountedFileSystem(workdir / "data", workdir / "mnt")
    fs.format()
    fs.start()
    try:
        result = cli("mount", fs.meta_url, str(fs.mountpoint))
        assert result.returncode == AlreadyMountedError.exit_code
        assert "already a mount point" in result.stderr
    finally:
        fs.stop()


def test_up_formats_once_then_mounts_the_existing_file_system(workdir: Path) -> None:
    data, mnt = workdir / "up", workdir / "mnt"
    first = cli("up", str(data), str(mnt))
    assert first.returncode == 0, first.stderr
    try:
        assert (data / "meta.db").exists()
        images = sorted(p.name for p in data.iterdir() if p.suffix == ".img")
        assert images == ["conventional.img", "smr0.img", "smr1.img"]
        (mnt / "hello").write_text("world")
    finally:
        assert cli("umount", str(mnt)).returncode == 0
    second = cli("up", str(data), str(mnt))
    assert second.returncode == 0, second.stderr
    try:
        assert "formatted" not in second.stdout
        assert (mnt / "hello").read_text() == "world"
    finally:
        assert cli("umount", str(mnt)).returncode == 0
    wait_until(lambda: mount_entry(mnt) is None, "the mount entry is gone", limit=5.0)
    assert mount_entry(mnt) is None


def test_status_of_an_unmounted_file_system_by_url(workdir: Path) -> None:
    url = format_in(workdir)
    result = cli("status", url, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["meta_url"] == url
    assert report["inodes"] >= 1
    assert [d["spec"].split(":")[0] for d in report["drives"]] == ["emulated"]
    assert sum(report["zones"].values()) == 16  # 4 GiB in 256 MiB zones
    # status only looks: the formatted file system has no metadata backup yet,
    # and looking wrote none (status says how to get one)
    assert report["metadata_backup"] == {"number": 0, "created_ns": 0, "bytes": 0, "drives": 0}
    assert cli("status", url, "--json").returncode == 0
    shown = cli("status", url)
    assert "none on the drives yet" in shown.stdout, shown.stdout


def test_status_by_url_of_an_up_file_system_asks_its_server(workdir: Path) -> None:
    """While ``up`` holds the drives, ``status META_URL`` joins its storage
    server: the drives' own figures (live bytes, slices, zones, write
    amplification), as the mount point's status shows them, not the
    heartbeat's capacity and free bytes alone."""
    data, mnt = workdir / "data", workdir / "mnt"
    started = cli("up", str(data), str(mnt))
    assert started.returncode == 0, started.stderr
    try:
        (mnt / "f").write_bytes(os.urandom(20 * 1000 * 1000))
        by_mount = json.loads(cli("status", str(mnt), "--json").stdout)
        result = cli("status", f"sqlite3://{data / 'meta.db'}", "--json")
        assert result.returncode == 0, result.stderr
        by_url = json.loads(result.stdout)
        assert by_url["drives_not_asked"] == {}
        assert by_url["live_bytes"] == by_mount["live_bytes"] == 20 * 1000 * 1000
        assert [(d["live_bytes"], d["slices"], d["zones"]) for d in by_url["drives"]] == \
            [(d["live_bytes"], d["slices"], d["zones"]) for d in by_mount["drives"]]
        assert by_url["write_amplification"] == by_mount["write_amplification"]
    finally:
        assert cli("umount", str(mnt)).returncode == 0
