"""POSIX semantics over a real ShingleFS mount: bytes, sizes, modes and errno."""

from __future__ import annotations

import errno
import mmap
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem, drop_caches
from shinglefs.meta.records import MAX_FILE_SIZE, TIME_NS_MAX, TIME_NS_MIN

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024


def errno_of(func, *args) -> int:
    try:
        func(*args)
    except OSError as exc:
        return exc.errno
    return 0


def test_write_then_read_back_large_file_survives_cache_drop(mnt: Path) -> None:
    data = os.urandom(3 * MiB + 12345)
    (mnt / "big").write_bytes(data)
    assert (mnt / "big").stat().st_size == len(data)
    drop_caches()
    assert (mnt / "big").read_bytes() == data


def test_pwrite_overlays_later_writes_win(mnt: Path) -> None:
    path = mnt / "overlay"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"a" * 10000, 0)
        os.fsync(fd)
        os.pwrite(fd, b"b" * 100, 50)
        os.pwrite(fd, b"c" * 10, 9995)  # extends past the end
        assert os.fstat(fd).st_size == 10005
    finally:
        os.close(fd)
    expected = bytearray(b"a" * 10000)
    expected[50:150] = b"b" * 100
    expected[9995:10005] = b"c" * 10
    assert path.read_bytes() == bytes(expected)
    drop_caches()
    assert path.read_bytes() == bytes(expected)


def test_sparse_write_reads_zeros_in_the_hole(mnt: Path) -> None:
    path = mnt / "sparse"
    with open(path, "wb") as f:
        f.seek(5 * MiB)
        f.write(b"end")
    data = path.read_bytes()
    assert len(data) == 5 * MiB + 3
    assert data[: 5 * MiB] == bytes(5 * MiB) and data[-3:] == b"end"


def test_truncate_shrinks_and_extends_with_zeros(mnt: Path) -> None:
    path = mnt / "trunc"
    path.write_bytes(b"x" * 100000)
    os.truncate(path, 10)
    assert path.read_bytes() == b"x" * 10
    os.truncate(path, 4096)
    assert path.read_bytes() == b"x" * 10 + bytes(4086)
    with open(path, "r+b") as f:
        f.truncate(3)
        assert os.fstat(f.fileno()).st_size == 3
    assert path.read_bytes() == b"xxx"


def test_o_append_writes_at_the_end_from_two_descriptors(mnt: Path) -> None:
    path = mnt / "log"
    a = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    b = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(a, b"one\n")
        os.write(b, b"two\n")
        os.write(a, b"three\n")
    finally:
        os.close(a)
        os.close(b)
    assert path.read_bytes() == b"one\ntwo\nthree\n"


def test_o_excl_fails_with_eexist_on_an_existing_name(mnt: Path) -> None:
    path = mnt / "excl"
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    assert errno_of(os.open, path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600) == errno.EEXIST
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_o_trunc_empties_the_file(mnt: Path) -> None:
    path = mnt / "t"
    path.write_bytes(b"hello world")
    with open(path, "wb") as f:
        f.write(b"hi")
    assert path.read_bytes() == b"hi"


def test_rename_over_an_existing_file_replaces_it_atomically(mnt: Path) -> None:
    (mnt / "old").write_bytes(b"new contents")
    (mnt / "target").write_bytes(b"old contents")
    os.rename(mnt / "old", mnt / "target")
    assert (mnt / "target").read_bytes() == b"new contents"
    assert not (mnt / "old").exists()
    assert sorted(os.listdir(mnt)) == ["target"]


def test_rename_errors_match_linux(mnt: Path) -> None:
    (mnt / "d").mkdir()
    (mnt / "d" / "f").write_bytes(b"x")
    (mnt / "e").mkdir()
    (mnt / "file").write_bytes(b"y")
    assert errno_of(os.rename, mnt / "missing", mnt / "x") == errno.ENOENT
    assert errno_of(os.rename, mnt / "e", mnt / "d") == errno.ENOTEMPTY
    assert errno_of(os.rename, mnt / "file", mnt / "e") == errno.EISDIR
    assert errno_of(os.rename, mnt / "e", mnt / "file") == errno.ENOTDIR
    assert errno_of(os.rename, mnt / "d", mnt / "d" / "sub") == errno.EINVAL


def test_rename_noreplace_refuses_an_existing_target(mnt: Path) -> None:
    """renameat2(RENAME_NOREPLACE) reaches the file system through the kernel."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    (mnt / "a").write_bytes(b"a")
    (mnt / "b").write_bytes(b"b")
    at_fdcwd, rename_noreplace = -100, 1
    rc = libc.renameat2(at_fdcwd, str(mnt / "a").encode(), at_fdcwd, str(mnt / "b").encode(),
                        rename_noreplace)
    assert rc == -1 and ctypes.get_errno() == errno.EEXIST
    assert (mnt / "b").read_bytes() == b"b"
    rc = libc.renameat2(at_fdcwd, str(mnt / "a").encode(), at_fdcwd, str(mnt / "c").encode(),
                        rename_noreplace)
    assert rc == 0
    assert (mnt / "c").read_bytes() == b"a"


def test_hard_links_share_contents_and_count(mnt: Path) -> None:
    (mnt / "f").write_bytes(b"shared")
    os.link(mnt / "f", mnt / "g")
    assert (mnt / "f").stat().st_nlink == 2
    assert (mnt / "f").stat().st_ino == (mnt / "g").stat().st_ino
    with open(mnt / "g", "ab") as f:
        f.write(b"!")
    assert (mnt / "f").read_bytes() == b"shared!"
    os.unlink(mnt / "f")
    assert (mnt / "g").stat().st_nlink == 1
    assert (mnt / "g").read_bytes() == b"shared!"
    assert errno_of(os.link, mnt / "g", mnt / "g") == errno.EEXIST
    (mnt / "dir").mkdir()
    assert errno_of(os.link, mnt / "dir", mnt / "dirlink") == errno.EPERM


def test_symlinks_resolve_and_readlink_returns_the_target(mnt: Path) -> None:
    (mnt / "real").write_bytes(b"data")
    os.symlink("real", mnt / "link")
    os.symlink("/nonexistent/elsewhere", mnt / "dangling")
    assert os.readlink(mnt / "link") == "real"
    assert (mnt / "link").read_bytes() == b"data"
    assert stat.S_ISLNK(os.lstat(mnt / "link").st_mode)
    assert os.lstat(mnt / "dangling").st_size == len("/nonexistent/elsewhere")
    assert errno_of(os.stat, mnt / "dangling") == errno.ENOENT


def test_directories_list_create_and_remove(mnt: Path) -> None:
    for i in range(300):
        (mnt / f"f{i:03d}").write_bytes(b"")
    (mnt / "sub").mkdir()
    names = os.listdir(mnt)
    assert sorted(names) == sorted([f"f{i:03d}" for i in range(300)] + ["sub"])
    assert errno_of(os.rmdir, mnt / "f000") == errno.ENOTDIR
    assert errno_of(os.mkdir, mnt / "sub") == errno.EEXIST
    (mnt / "sub" / "x").write_bytes(b"")
    assert errno_of(os.rmdir, mnt / "sub") == errno.ENOTEMPTY
    assert errno_of(os.unlink, mnt / "sub") == errno.EISDIR
    os.unlink(mnt / "sub" / "x")
    os.rmdir(mnt / "sub")
    assert (mnt).stat().st_nlink == 2


def test_xattrs_set_get_list_remove(mnt: Path) -> None:
    path = mnt / "x"
    path.write_bytes(b"")
    os.setxattr(path, "user.one", b"1")
    os.setxattr(path, "user.two", b"\x00\xff" * 100)
    assert os.getxattr(path, "user.one") == b"1"
    assert os.getxattr(path, "user.two") == b"\x00\xff" * 100
    assert sorted(os.listxattr(path)) == ["user.one", "user.two"]
    os.setxattr(path, "user.one", b"replaced")
    assert os.getxattr(path, "user.one") == b"replaced"
    os.removexattr(path, "user.one")
    assert errno_of(os.getxattr, path, "user.one") == errno.ENODATA
    assert errno_of(os.removexattr, path, "user.one") == errno.ENODATA
    assert os.listxattr(path) == ["user.two"]


def test_chmod_chown_and_utime(mnt: Path) -> None:
    path = mnt / "m"
    path.write_bytes(b"")
    os.chmod(path, 0o4751)
    assert stat.S_IMODE(path.stat().st_mode) == 0o4751
    os.chown(path, 1234, 5678)
    st = path.stat()
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.utime(path, ns=(1_000_000_123, 2_000_000_456))
    st = path.stat()
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 2_000_000_456)


def test_mmap_read_sees_file_bytes(mnt: Path) -> None:
    data = os.urandom(2 * MiB + 7)
    (mnt / "mm").write_bytes(data)
    drop_caches()
    with open(mnt / "mm", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[:] == data
        assert m[MiB : MiB + 100] == data[MiB : MiB + 100]


def test_shared_writable_mmap_reaches_the_file(mnt: Path) -> None:
    path = mnt / "mmw"
    path.write_bytes(bytes(1 * MiB))
    with open(path, "r+b") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE) as m:
            m[100:105] = b"hello"
            m[MiB - 5 :] = b"world"
            m.flush()
        os.fsync(f.fileno())
    drop_caches()
    data = path.read_bytes()
    assert data[100:105] == b"hello" and data[-5:] == b"world"
    assert data.count(b"\x00") == MiB - 10


@pytest.mark.parametrize("size", [100, 2 * MiB + 500_000])
def test_a_mapping_made_through_an_o_append_descriptor_writes_in_place(mnt: Path,
                                                                        size: int) -> None:
    """The kernel writes a shared mapping's dirty pages back through the handle
    that mapped the file: when it was opened O_APPEND those pages still go to
    their offsets (they were appended at the end: the change lost, the file a
    page longer). A write(2) through that handle still appends."""
    path = mnt / "mapped-log"
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path.write_bytes(data)
    expected = bytearray(data)
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        with mmap.mmap(fd, size) as m:
            for at in (0, size // 2, size - 3):
                m[at:at + 3] = b"MAP"
                expected[at:at + 3] = b"MAP"
            m.flush()
        os.write(fd, b"tail")
        expected += b"tail"
    finally:
        os.close(fd)
    assert os.stat(path).st_size == len(expected)
    drop_caches()
    assert path.read_bytes() == bytes(expected)


def test_statfs_reports_capacity_and_free_space(mnt: Path) -> None:
    st = os.statvfs(mnt)
    assert st.f_blocks > 0 and st.f_frsize > 0
    assert 0 < st.f_bavail <= st.f_blocks
    assert st.f_namemax == 255
    assert st.f_blocks * st.f_frsize >= 8 * 1024**3  # two emulated 8 GiB drives at least


def test_fsync_and_fdatasync_succeed_and_keep_the_bytes(mnt: Path) -> None:
    fd = os.open(mnt / "s", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"durable")
        os.fsync(fd)
        os.write(fd, b" more")
        os.fdatasync(fd)
    finally:
        os.close(fd)
    dfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    assert (mnt / "s").read_bytes() == b"durable more"


def test_unlinked_open_file_stays_usable_until_closed(mnt: Path) -> None:
    path = mnt / "ghost"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"before unlink")
        os.unlink(path)
        assert not path.exists()
        os.write(fd, b", after unlink")
        os.fsync(fd)
        assert os.pread(fd, 100, 0) == b"before unlink, after unlink"
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)
    assert os.listdir(mnt) == []


def test_fallocate_is_not_supported_and_says_so(mnt: Path) -> None:
    """pyfuse3 exposes no fallocate handler: the kernel answers EOPNOTSUPP.

    (glibc's posix_fallocate then falls back to writing zeros, which works.)
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fd = os.open(mnt / "fa", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        assert libc.fallocate(fd, 0, 0, 4096) == -1
        assert ctypes.get_errno() == errno.EOPNOTSUPP
        os.posix_fallocate(fd, 0, 8192)
        assert os.fstat(fd).st_size == 8192
    finally:
        os.close(fd)
    assert (mnt / "fa").read_bytes() == bytes(8192)


def test_second_opener_sees_the_bytes_written_by_a_closed_writer(
    mnt: Path, shinglefs_mount: MountedFileSystem
) -> None:
    """Close-to-open across processes on the same mount."""
    path = mnt / "c2o"
    code = f"open({str(path)!r}, 'wb').write(b'from child' * 1000)"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert path.read_bytes() == b"from child" * 1000


def test_readdir_while_entries_come_and_go_never_repeats_or_skips_survivors(mnt: Path) -> None:
    """Stable cookies: a listing resumed across getdents calls stays consistent."""
    for i in range(1500):
        os.mknod(mnt / f"f{i:04d}")
    seen: list[str] = []
    with os.scandir(mnt) as entries:
        for n, entry in enumerate(entries):
            seen.append(entry.name)
            if n == 50:  # mid-listing: delete half of the rest, add new names
                for i in range(0, 1500, 2):
                    if f"f{i:04d}" not in seen:
                        os.unlink(mnt / f"f{i:04d}")
                for i in range(200):
                    os.mknod(mnt / f"new{i:03d}")
    assert len(seen) == len(set(seen)), "an entry was listed twice"
    survivors = {f"f{i:04d}" for i in range(1, 1500, 2)}
    assert survivors <= set(seen), "an entry that existed throughout was skipped"


# ---------------------------------------------------------------- times, as a local disk keeps them


def _times_after_close(path: Path, set_times) -> os.stat_result:
    """Write, set the times through ``set_times(fd)``, close; the stat after the
    attribute timeout (so the kernel asks the daemon, not its cache)."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"x" * 5000)  # buffered in the daemon until close
        set_times(fd)
    finally:
        os.close(fd)
    time.sleep(1.2)
    return path.stat()


@pytest.mark.parametrize("how", ["futimens", "utime-path"])
def test_times_set_before_close_outlive_the_buffered_bytes(mnt: Path, tmp_path: Path,
                                                            how: str) -> None:
    """cp -p, tar x and rsync -t write, then set the times, then close."""
    stamps = (1_000_000_000, 978_307_200_123_456_789)  # 2001-01-01
    for root in (tmp_path, mnt):  # the local disk says what to expect
        path = root / f"stamped-{how}"
        if how == "futimens":
            st = _times_after_close(path, lambda fd: os.utime(fd, ns=stamps))
        else:
            st = _times_after_close(path, lambda fd, p=path: os.utime(p, ns=stamps))
        assert (st.st_atime_ns, st.st_mtime_ns, st.st_size) == (*stamps, 5000), root


def test_tar_extract_keeps_modification_times(mnt: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "old.txt").write_bytes(b"kept since 2001\n" * 500)
    os.utime(src / "old.txt", ns=(978_307_200_000_000_000, 978_307_200_000_000_000))
    subprocess.run(["tar", "cf", str(tmp_path / "a.tar"), "-C", str(src), "old.txt"],
                   check=True)
    subprocess.run(["tar", "xf", str(tmp_path / "a.tar"), "-C", str(mnt)], check=True)
    time.sleep(1.2)
    assert (mnt / "old.txt").stat().st_mtime_ns == 978_307_200_000_000_000
    assert (mnt / "old.txt").read_bytes() == (src / "old.txt").read_bytes()


def test_mtime_of_a_file_being_written_holds_still_between_writes(mnt: Path) -> None:
    fd = os.open(mnt / "steady", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"a" * 100)
        first = os.fstat(fd).st_mtime_ns
        time.sleep(0.05)
        assert os.fstat(fd).st_mtime_ns == first  # no write since: the same time
        assert (mnt / "steady").stat().st_mtime_ns == first
        os.write(fd, b"b" * 100)
        assert os.fstat(fd).st_mtime_ns > first  # a write moves it on
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [100, 3 * MiB])  # an inline file, a file on a drive
def test_mtime_is_the_last_writes_time_not_the_closes(mnt: Path, size: int) -> None:
    # It was the time the bytes committed (close), a moment after the last
    # write for a small file, minutes after it for a writer holding the file open.
    path = mnt / f"late-close-{size}"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"a" * size)
        written = os.fstat(fd)
        time.sleep(0.3)
    finally:
        os.close(fd)
    closed = path.stat()
    assert closed.st_mtime_ns == written.st_mtime_ns
    assert closed.st_ctime_ns == written.st_ctime_ns
    drop_caches()
    assert path.stat().st_mtime_ns == written.st_mtime_ns  # as committed, not cached


def test_truncate_to_the_same_size_updates_mtime(mnt: Path) -> None:
    path = mnt / "same-size"
    path.write_bytes(b"ab")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    os.truncate(path, 2)
    st = path.stat()
    assert st.st_size == 2 and st.st_mtime_ns > 1_000_000_000  # as Linux's truncate(2)


def test_a_bare_xattr_namespace_is_einval(mnt: Path) -> None:
    path = mnt / "x"
    path.write_bytes(b"")
    assert errno_of(os.setxattr, path, "user.", b"v") == errno.EINVAL
    assert errno_of(os.getxattr, path, "user.") == errno.EINVAL


def test_cp_p_keeps_the_mode_bits_no_acl_stands_in_for_them(mnt: Path, tmp_path: Path) -> None:
    # cp -p sets system.posix_acl_access instead of calling chmod when that
    # succeeds; stored as a plain xattr it left every copy at cp's 0600.
    src = tmp_path / "src.bin"
    src.write_bytes(b"weights" * 1000)
    src.chmod(0o644)
    (tmp_path / "tree").mkdir(mode=0o755)
    (tmp_path / "tree" / "shard").write_bytes(b"s")
    (tmp_path / "tree" / "shard").chmod(0o640)
    subprocess.run(["cp", "-p", str(src), str(mnt / "copy.bin")], check=True)
    subprocess.run(["cp", "-a", str(tmp_path / "tree"), str(mnt / "tree")], check=True)
    assert stat.S_IMODE((mnt / "copy.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((mnt / "tree").stat().st_mode) == 0o755
    assert stat.S_IMODE((mnt / "tree" / "shard").stat().st_mode) == 0o640
    assert os.listxattr(mnt / "copy.bin") == []
    assert errno_of(os.getxattr, mnt / "copy.bin", "system.posix_acl_access") \
        == errno.EOPNOTSUPP


def test_sizes_past_the_largest_file_are_efbig_and_statfs_keeps_working(mnt: Path) -> None:
    # Two 4 EiB sparse files overflowed the 64-bit used-bytes sum: statfs
    # (df, posix_fallocate's fallback) failed with EIO for good, even after
    # the files were deleted and the file system remounted.
    path = mnt / "huge"
    path.write_bytes(b"")
    assert errno_of(os.truncate, path, 4 << 60) == errno.EFBIG
    assert errno_of(os.truncate, mnt / "huge", MAX_FILE_SIZE + 1) == errno.EFBIG
    os.truncate(path, MAX_FILE_SIZE)  # the largest size itself is fine
    (mnt / "huge2").write_bytes(b"")
    os.truncate(mnt / "huge2", MAX_FILE_SIZE)
    assert os.statvfs(mnt).f_blocks > 0
    fd = os.open(mnt / "edge", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        assert errno_of(os.pwrite, fd, b"x", MAX_FILE_SIZE) == errno.EFBIG
        assert os.pwrite(fd, b"abcd", MAX_FILE_SIZE - 2) == 2  # cut at the limit
    finally:
        os.close(fd)
    assert (mnt / "edge").stat().st_size == MAX_FILE_SIZE
    for name in ("huge", "huge2", "edge"):
        (mnt / name).unlink()
    assert os.statvfs(mnt).f_bfree > 0


def test_times_outside_64_bit_nanoseconds_are_clamped_not_eio(mnt: Path) -> None:
    path = mnt / "t"
    path.write_bytes(b"x")
    os.utime(path, ns=(2**40 * 10**9, 2**33 * 10**9))  # years ~36,000 and ~2242
    st = path.stat()
    assert st.st_atime_ns == TIME_NS_MAX and st.st_mtime_ns == 2**33 * 10**9
    subprocess.run(["touch", "-d", "2300-01-01", str(path)], check=True)
    assert path.stat().st_mtime_ns == TIME_NS_MAX
    os.utime(path, ns=(-(2**62) * 4, 0))
    assert path.stat().st_atime_ns == TIME_NS_MIN


def test_a_removed_directory_still_open_behaves_as_on_linux(mnt: Path) -> None:
    # Its inode was gone at rmdir: fstat, a listing through the descriptor, and
    # a listing of a removed working directory were ENOENT.
    for how in ("rmdir", "rename-over"):
        d = mnt / f"gone-{how}"
        d.mkdir()
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if how == "rmdir":
                d.rmdir()
            else:
                (mnt / "other").mkdir()
                os.rename(mnt / "other", d)  # replaces the empty directory fd is on
            assert os.fstat(fd).st_nlink == 0
            assert stat.S_ISDIR(os.fstat(fd).st_mode)
            assert os.listdir(fd) == []
        finally:
            os.close(fd)
    cwd = mnt / "cwd"
    cwd.mkdir()
    listed = subprocess.run(
        [sys.executable, "-c", "import os; os.rmdir(os.getcwd()); print(os.listdir('.'))"],
        cwd=cwd, capture_output=True, text=True)
    assert (listed.returncode, listed.stdout.strip()) == (0, "[]"), listed.stderr


def test_the_mount_says_it_records_no_access_times(mnt: Path) -> None:
    dev = os.stat(mnt).st_dev
    with open("/proc/self/mountinfo") as f:
        [line] = [ln for ln in f
                  if ln.split()[2] == f"{os.major(dev)}:{os.minor(dev)}"]
    assert "noatime" in line.split()[5].split(",")
