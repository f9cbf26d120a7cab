"""The FUSE floor (bench/fuse_floor.py) as a real mount: a child process, polled
with ``os.path.ismount``, driven through the kernel like any file system.

The floor stores sizes, not bytes, so reads are checked for their length
(and, once the page cache is dropped, for the zeros the floor serves).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.bench.fuse_floor import FloorMount
from shinglefs.errors import ShingleError
from shinglefs.fuse.errors import AlreadyMountedError
from shinglefs.fuse.harness import drop_caches
from shinglefs.fuse.mount import check_fuse, mount_entry

MiB = 1024**2


def _require_fuse() -> None:
    # As tests/conftest.py: without FUSE the mount tests fail unless told to skip.
    try:
        check_fuse()
    except ShingleError as exc:
        if os.environ.get("SHINGLEFS_ALLOW_NO_FUSE") == "1":
            pytest.skip(str(exc))
        pytest.fail(f"{exc}; set SHINGLEFS_ALLOW_NO_FUSE=1 to skip the mount tests")


@pytest.fixture(scope="module")
def floor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FloorMount]:
    _require_fuse()
    mounted = FloorMount(tmp_path_factory.mktemp("floor") / "mnt")
    mounted.start()
    try:
        yield mounted
    finally:
        code = mounted.stop()
        assert code == 0, f"the floor exited with {code}:\n{mounted.log_text()}"
        assert mount_entry(mounted.mountpoint) is None


@pytest.fixture
def fdir(floor: FloorMount, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory on the floor mount for each test."""
    path = floor.mountpoint / re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:80]
    path.mkdir()
    yield path
    assert os.path.ismount(floor.mountpoint), f"the floor died:\n{floor.log_text()}"


def _errno_of(func, *args) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(OSError) as info:
        func(*args)
    return info.value.errno


def test_write_sets_the_size_and_a_read_returns_that_many_bytes(fdir: Path) -> None:
    path = fdir / "seq"
    size = 3 * MiB + 123
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        for _ in range(3):
            assert os.write(fd, b"w" * MiB) == MiB
        assert os.write(fd, b"w" * 123) == 123
        os.fsync(fd)
    finally:
        os.close(fd)
    assert os.stat(path).st_size == size
    cold = drop_caches()
    data = path.read_bytes()
    assert len(data) == size
    if cold:  # from the floor itself, not the page cache: it serves zeros
        assert data == bytes(size)
    with open(path, "rb", buffering=0) as f:
        assert f.read(10) == data[:10]
        f.seek(size)
        assert f.read(10) == b""


def test_truncate_and_open_with_o_trunc_change_the_size(fdir: Path) -> None:
    path = fdir / "t"
    path.write_bytes(b"x" * 10_000)
    os.truncate(path, 100)
    assert os.stat(path).st_size == 100
    assert len(path.read_bytes()) == 100
    os.truncate(path, 5 * MiB)
    assert os.stat(path).st_size == 5 * MiB
    os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
    assert os.stat(path).st_size == 0


def test_setattr_changes_mode_and_times(fdir: Path) -> None:
    path = fdir / "m"
    path.write_bytes(b"")
    os.chmod(path, 0o600)
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    st = os.stat(path)
    assert st.st_mode & 0o7777 == 0o600
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 2_000_000_000)


def test_namespace_create_unlink_mkdir_rmdir_readdir(fdir: Path) -> None:
    (fdir / "a").write_bytes(b"1")
    (fdir / "b").write_bytes(b"22")
    os.mkdir(fdir / "d")
    (fdir / "d" / "inner").write_bytes(b"333")
    assert sorted(os.listdir(fdir)) == ["a", "b", "d"]
    assert os.listdir(fdir / "d") == ["inner"]
    assert {e.name: e.is_dir() for e in os.scandir(fdir)} == {"a": False, "b": False, "d": True}
    assert os.stat(fdir / "b").st_size == 2

    assert _errno_of(os.stat, fdir / "missing") == errno.ENOENT
    assert _errno_of(os.mkdir, fdir / "d") == errno.EEXIST
    assert _errno_of(os.open, fdir / "a", os.O_CREAT | os.O_EXCL | os.O_WRONLY) == errno.EEXIST
    assert _errno_of(os.rmdir, fdir / "d") == errno.ENOTEMPTY
    assert _errno_of(os.rmdir, fdir / "a") == errno.ENOTDIR
    assert _errno_of(os.unlink, fdir / "d") == errno.EISDIR

    os.unlink(fdir / "a")
    os.unlink(fdir / "d" / "inner")
    os.rmdir(fdir / "d")
    assert os.listdir(fdir) == ["b"]
    assert _errno_of(os.stat, fdir / "a") == errno.ENOENT


def test_an_unlinked_open_file_stays_usable_until_closed(fdir: Path) -> None:
    path = fdir / "gone"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"z" * 8192)
        os.unlink(path)
        assert not path.exists()
        os.fsync(fd)
        assert os.fstat(fd).st_size == 8192
        assert len(os.pread(fd, 8192, 0)) == 8192
    finally:
        os.close(fd)


def test_xattrs_are_empty_and_statfs_answers(fdir: Path) -> None:
    path = fdir / "x"
    path.write_bytes(b"")
    assert _errno_of(os.getxattr, path, "user.nothing") == errno.ENODATA
    assert os.listxattr(path) == []
    st = os.statvfs(fdir)
    assert st.f_bsize > 0 and st.f_bavail > 0 and st.f_namemax == 255


def test_small_files_loop_creates_and_removes_every_file(fdir: Path) -> None:
    directory = fdir / "small"
    directory.mkdir()
    payload = b"s" * 4096
    for i in range(200):
        fd = os.open(directory / f"f{i:06d}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        assert os.write(fd, payload) == 4096
        os.close(fd)
    names = sorted(os.listdir(directory))
    assert names == [f"f{i:06d}" for i in range(200)]
    assert {os.stat(directory / n).st_size for n in names} == {4096}
    shutil.rmtree(directory)
    assert not directory.exists()
    assert os.listdir(fdir) == []


def test_the_floor_is_mounted_with_the_real_mounts_options(floor: FloorMount) -> None:
    with open("/proc/self/mounts") as mounts:
        line = next(m for m in mounts if m.split()[1] == str(floor.mountpoint))
    fstype, options = line.split()[2], line.split()[3].split(",")
    assert fstype == "fuse.shinglefs"
    assert "default_permissions" in options
    if os.geteuid() == 0:  # read-ahead raised as fuse.mount._tune_bdi does
        dev = os.stat(floor.mountpoint).st_dev
        bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        assert bdi.read_text().strip() == "1024"


# -- life cycle -------------------------------------------------------------------------


def test_stop_unmounts_and_the_process_exits_zero(tmp_path: Path) -> None:
    _require_fuse()
    with FloorMount(tmp_path / "mnt") as mounted:
        assert os.path.ismount(mounted.mountpoint)
        (mounted.mountpoint / "f").write_bytes(b"x")
        process = mounted.process
        assert process is not None
    assert process.returncode == 0
    assert mount_entry(tmp_path / "mnt") is None
    assert mounted.process is None


def test_the_context_manager_unmounts_when_the_body_raises(tmp_path: Path) -> None:
    _require_fuse()
    mounted = FloorMount(tmp_path / "mnt")
    with pytest.raises(RuntimeError, match="boom"), mounted:
        fd = os.open(mounted.mountpoint / "open-file", os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        raise RuntimeError("boom")
    assert mount_entry(tmp_path / "mnt") is None
    assert mounted.process is None


def test_sigterm_unmounts_and_exits_zero(tmp_path: Path) -> None:
    _require_fuse()
    with FloorMount(tmp_path / "mnt") as mounted:
        process = mounted.process
        assert process is not None
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert mount_entry(tmp_path / "mnt") is None
    assert mount_entry(tmp_path / "mnt") is None


def test_mounting_twice_on_one_point_fails_and_leaves_the_first(tmp_path: Path) -> None:
    _require_fuse()
    with FloorMount(tmp_path / "mnt") as first:
        second = FloorMount(tmp_path / "mnt")
        with pytest.raises(AlreadyMountedError):
            second.start()
        assert second.process is None
        (first.mountpoint / "still-served").write_bytes(b"x")
        assert os.listdir(first.mountpoint) == ["still-served"]
    assert mount_entry(tmp_path / "mnt") is None


@pytest.mark.slow
def test_bench_mount_reports_the_floor_beside_every_existing_field(tmp_path: Path) -> None:
    _require_fuse()
    from shinglefs.bench.mount import CEILINGS, OF_FLOOR_TARGETS, TARGETS, run

    result = run(quick=True, workdir=tmp_path, rounds=1)
    for key in ("write_mib_s", "read_mib_s", "local_write_mib_s", "local_read_mib_s",
                "write_ratio", "read_ratio", "small_files_per_s", "local_small_files_per_s",
                "loader_samples_per_s", "local_loader_samples_per_s", "loader_ratio",
                "floor_write_mib_s", "floor_read_mib_s", "floor_small_files_per_s",
                "write_of_floor", "read_of_floor", "small_files_of_floor",
                "floor_write_ratio", "floor_read_ratio", "daemon_rss_peak_mib",
                "vfs_small_files_per_s", "small_files_ceiling_of_floor"):
        assert result[key] > 0, key
    vfs, floor = result["samples"]["vfs_small"][0], result["samples"]["floor_small"][0]
    assert result["small_files_ceiling_of_floor"] == pytest.approx(vfs / (vfs + floor), rel=0.01)
    assert set(result["targets_met"]) == set(TARGETS) | set(CEILINGS) | set(OF_FLOOR_TARGETS)
    assert set(result["floor_targets_met"]) == set(TARGETS) - {"loader_ratio"}
    assert result["samples"]["floor_small"] and len(result["samples"]["floor_write"]) == 1
    assert result["write_of_floor"] == pytest.approx(
        result["samples"]["write"][0] / result["samples"]["floor_write"][0], rel=0.01)
    assert mount_entry(tmp_path / "floor") is None
    assert mount_entry(tmp_path / "mnt") is None


def test_the_library_loop_of_bench_mount_makes_files_that_read_back(tmp_path: Path) -> None:
    """``vfs_small_files_per_s`` times real creates and closes: the files exist,
    hold their 4 KiB, and a second round in another directory adds to them."""
    from shinglefs.bench.mount import Plan, _formatted_library, _vfs_small_files
    from shinglefs.client.filesystem import open_filesystem
    from shinglefs.meta.api import ROOT_INO

    url = _formatted_library(tmp_path, Plan.of(True, 1))
    assert _vfs_small_files(url, b"small0", 25) > 0
    assert _vfs_small_files(url, b"small1", 5) > 0
    vfs = open_filesystem(url)
    try:
        for directory, count in ((b"small0", 25), (b"small1", 5)):
            parent = vfs.lookup(ROOT_INO, directory).ino
            dh = vfs.opendir(parent)
            try:
                names = sorted(e.name for e in vfs.readdir(dh))
            finally:
                vfs.releasedir(dh)
            assert names == [f"f{i:06d}".encode() for i in range(count)]
            attr = vfs.lookup(parent, names[-1])
            fh = vfs.open(attr.ino, os.O_RDONLY)
            try:
                assert vfs.read(fh, 0, 8192) == b"s" * 4096
            finally:
                vfs.release(fh)
    finally:
        vfs.shutdown()
