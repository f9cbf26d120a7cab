"""POSIX for many users: a root mount serves every user, with Linux's rules.

Every operation runs in a forked child that drops to an unprivileged user
(uid 65534, gid 65534, no supplementary groups) and is done twice: on a real
ShingleFS mount made by root and on a local directory (ext4 or whatever /tmp
is) set up with the same owners and modes. The errno, and the resulting mode,
owner, size and mtime, must be the same in both. The trees live in a fresh
directory under /tmp that the unprivileged user may traverse (pytest's own
tmp directories are 0700).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.fuse.opskit import (
    NOBODY,
    NOGROUP,
    UTIME_NOW,
    UTIME_OMIT,
    as_user,
    root_mount_and_local,
    utimensat,
)

from shinglefs.fuse.errors import AllowOtherDeniedError
from shinglefs.fuse.harness import MountedFileSystem, shinglefs_command
from shinglefs.fuse.mount import FUSE_CONF, mount, mount_entry, user_may_allow_other

pytestmark = pytest.mark.fuse

OLD_NS = 1_000_000_000  # the mtime every file starts with (2001-09-09)
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="switches users: needs root")

@pytest.fixture(scope="module")
def trees() -> Iterator[tuple[Path, Path]]:
    """(mount, local): two directories with a world-writable ``w`` each; the
    mount is a default one made by root (so it serves every user)."""
    if os.geteuid() != 0:
        pytest.skip("switches users: needs root")
    with root_mount_and_local("shinglefs-multiuser-") as pair:
        yield pair


@dataclass(frozen=True)
class Case:
    """A file made by root with ``mode``/``owner``, then ``op(path)`` run as ``user``."""

    name: str
    mode: int
    owner: tuple[int, int]
    op: Callable[[Path], object]
    expect: int  # the errno (0: success) Linux gives; checked on both trees
    user: int = NOBODY
    in_dir: bool = False  # op gets the world-writable directory instead of a file


def write_byte(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, b"X")
    finally:
        os.close(fd)


def create_mode0_then_ftruncate(directory: Path) -> None:
    fd = os.open(directory / "made", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0)
    try:
        os.ftruncate(fd, 100)
        os.pwrite(fd, b"Y", 10)
    finally:
        os.close(fd)


def ftruncate_read_only(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.ftruncate(fd, 1)
    finally:
        os.close(fd)


ROOT_FILE = (0, 0)
OWN_FILE = (NOBODY, NOGROUP)
OWN_FILE_ROOT_GROUP = (NOBODY, 0)

CASES = [
    # a write clears setuid/setgid (the kernel sends a mode change as the writer)
    Case("write_by_other_clears_setuid_setgid", 0o6777, ROOT_FILE, write_byte, 0),
    Case("write_by_other_clears_setuid_and_setgid_without_group_exec", 0o6766, ROOT_FILE,
         write_byte, 0),
    Case("write_by_other_clears_setgid_without_group_exec", 0o2766, ROOT_FILE, write_byte, 0),
    Case("write_by_group_member_keeps_setgid_without_group_exec", 0o2766, (0, NOGROUP),
         write_byte, 0),
    Case("write_by_owner_clears_setuid_setgid", 0o6755, OWN_FILE, write_byte, 0),
    Case("chown_unchanged_by_owner_clears_setgid_without_group_exec", 0o2745,
         OWN_FILE_ROOT_GROUP, lambda p: os.chown(p, -1, -1), 0),
    Case("write_by_root_keeps_setuid_setgid", 0o6777, OWN_FILE, write_byte, 0, user=0),
    Case("write_without_permission", 0o6755, ROOT_FILE, write_byte, errno.EACCES),
    # truncation: the open descriptor grants ftruncate; a path needs write permission
    Case("ftruncate_of_descriptor_created_with_mode_0", 0, ROOT_FILE,
         create_mode0_then_ftruncate, 0, in_dir=True),
    Case("ftruncate_of_read_only_descriptor", 0o666, ROOT_FILE, ftruncate_read_only,
         errno.EINVAL),
    Case("truncate_by_other_clears_setuid_setgid", 0o6777, ROOT_FILE,
         lambda p: os.truncate(p, 1), 0),
    Case("truncate_without_write_permission", 0o644, ROOT_FILE,
         lambda p: os.truncate(p, 1), errno.EACCES),
    # times: now needs write permission or ownership; explicit times need ownership
    Case("utime_now_by_other_with_write_permission", 0o666, ROOT_FILE,
         lambda p: os.utime(p, None), 0),
    Case("utimensat_both_now_by_other_with_write_permission", 0o666, ROOT_FILE,
         lambda p: utimensat(p, UTIME_NOW, UTIME_NOW), 0),
    Case("utime_now_without_write_permission", 0o644, ROOT_FILE,
         lambda p: os.utime(p, None), errno.EACCES),
    Case("utime_explicit_by_other_with_write_permission", 0o666, ROOT_FILE,
         lambda p: os.utime(p, (1, 2)), errno.EPERM),
    Case("utimensat_now_and_omit_by_other", 0o666, ROOT_FILE,
         lambda p: utimensat(p, UTIME_OMIT, UTIME_NOW), errno.EPERM),
    Case("utime_explicit_by_owner", 0o444, OWN_FILE, lambda p: os.utime(p, (1, 2)), 0),
    Case("utime_now_by_owner_without_write_permission", 0o444, OWN_FILE,
         lambda p: os.utime(p, None), 0),
    # owner and group: only root gives a file away; the owner picks one of its groups
    Case("chown_to_another_user_by_owner", 0o644, OWN_FILE,
         lambda p: os.chown(p, 0, -1), errno.EPERM),
    Case("chgrp_by_owner_to_own_group_clears_setuid_setgid", 0o6755, OWN_FILE_ROOT_GROUP,
         lambda p: os.chown(p, -1, NOGROUP), 0),
    Case("chgrp_by_owner_to_foreign_group", 0o644, OWN_FILE,
         lambda p: os.chown(p, -1, 0), errno.EPERM),
    Case("chown_unchanged_by_owner_clears_setuid_setgid", 0o6755, OWN_FILE,
         lambda p: os.chown(p, NOBODY, NOGROUP), 0),
    Case("chgrp_by_other", 0o666, ROOT_FILE, lambda p: os.chown(p, -1, NOGROUP),
         errno.EPERM),
    Case("chown_by_root_clears_setuid_setgid", 0o6755, OWN_FILE,
         lambda p: os.chown(p, 0, 0), 0, user=0),
    # modes: only the owner; setgid is dropped for a group the owner is not in
    Case("chmod_by_other", 0o666, ROOT_FILE, lambda p: os.chmod(p, 0o777), errno.EPERM),
    Case("chmod_by_owner", 0o600, OWN_FILE, lambda p: os.chmod(p, 0o4751), 0),
    Case("chmod_setgid_by_owner_outside_the_group", 0o755, OWN_FILE_ROOT_GROUP,
         lambda p: os.chmod(p, 0o2755), 0),
]


def make_file(root: Path, case: Case) -> Path:
    """As root: ``root/w/<case>`` with the case's content, owner, mode and an old mtime."""
    directory = root / "w" / case.name
    directory.mkdir(parents=True)
    os.chmod(root / "w", 0o777)
    os.chmod(directory, 0o777)
    if case.in_dir:
        return directory
    path = directory / "f"
    path.write_bytes(b"abc")
    os.chown(path, *case.owner)
    os.chmod(path, case.mode)  # after chown, which clears setuid/setgid
    os.utime(path, ns=(OLD_NS, OLD_NS))
    return path


def outcome(path: Path) -> dict[str, object]:
    """What a case leaves behind, comparable between the two trees."""
    if path.is_dir():
        path = path / "made"
    st = os.stat(path)
    recent = abs(time.time_ns() - st.st_mtime_ns) < 120 * 10**9
    mtime: object = "old" if st.st_mtime_ns == OLD_NS else ("now" if recent else st.st_mtime_ns)
    return {"mode": oct(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
            "size": st.st_size, "mtime": mtime}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_setattr_rules_match_a_local_directory(trees: tuple[Path, Path], case: Case) -> None:
    results = {}
    for tree in trees:
        target = make_file(tree, case)
        err = as_user(lambda target=target: case.op(target), uid=case.user)
        results[tree] = (errno.errorcode.get(err, err), outcome(target))
    on_mount, on_local = (results[t] for t in trees)
    assert on_local[0] == errno.errorcode.get(case.expect, case.expect), (
        f"the local directory itself gave {on_local}: the case's expectation is wrong")
    assert on_mount == on_local


# -- a root mount serves every user unless told not to ------------------------------------


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shinglefs_command(), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def up_dirs() -> Iterator[tuple[Path, Path]]:
    """(data dir, mount point) under a fresh /tmp directory every user may traverse."""
    if os.geteuid() != 0:
        pytest.skip("switches users: needs root")
    base = Path(tempfile.mkdtemp(prefix="shinglefs-up-", dir="/tmp"))
    base.chmod(0o755)
    (base / "mnt").mkdir()
    try:
        yield base / "data", base / "mnt"
    finally:
        if mount_entry(base / "mnt") is not None:
            cli("umount", "--force", str(base / "mnt"))
        shutil.rmtree(base, ignore_errors=True)


def read_and_write_as_nobody(shared: Path) -> int:
    def work() -> None:
        (shared / "by-nobody").write_bytes(b"hello from nobody")
        assert (shared / "by-root").read_bytes() == b"hello from root"
        os.listdir(shared)
    return as_user(work)


@NEEDS_ROOT
def test_root_up_serves_other_users_and_no_allow_other_restricts(
        up_dirs: tuple[Path, Path]) -> None:
    data, mnt = up_dirs
    up = cli("up", str(data), str(mnt))
    assert up.returncode == 0, up.stderr
    try:
        shared = mnt / "shared"
        shared.mkdir(mode=0o777)
        shared.chmod(0o1777)
        (shared / "by-root").write_bytes(b"hello from root")
        assert read_and_write_as_nobody(shared) == 0, (mnt.parent / "data" / "mount.log"
                                                      ).read_text()[-3000:]
        assert (shared / "by-nobody").read_bytes() == b"hello from nobody"
        assert (shared / "by-nobody").stat().st_uid == NOBODY
    finally:
        umount = cli("umount", str(mnt))
        assert umount.returncode == 0, umount.stderr

    up = cli("up", str(data), str(mnt), "--no-allow-other")
    assert up.returncode == 0, up.stderr
    try:
        assert (mnt / "shared" / "by-nobody").read_bytes() == b"hello from nobody"
        assert as_user(lambda: os.stat(mnt)) == errno.EACCES
        assert read_and_write_as_nobody(mnt / "shared") == errno.EACCES
    finally:
        umount = cli("umount", str(mnt))
        assert umount.returncode == 0, umount.stderr


@NEEDS_ROOT
def test_mount_no_allow_other_gives_other_users_eacces() -> None:
    base = Path(tempfile.mkdtemp(prefix="shinglefs-noallow-", dir="/tmp"))
    base.chmod(0o755)
    fs = MountedFileSystem(base / "data", base / "mnt", extra_args=["--no-allow-other"])
    try:
        with fs:
            fs.mountpoint.chmod(0o777)
            assert as_user(lambda: os.listdir(fs.mountpoint)) == errno.EACCES
            assert os.listdir(fs.mountpoint) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- --allow-other as a user who may not ----------------------------------------------------


def test_user_may_allow_other_reads_fuse_conf(tmp_path: Path) -> None:
    conf = tmp_path / "fuse.conf"
    conf.write_text("# user_allow_other\nmount_max = 1000\n")
    assert not user_may_allow_other(conf)
    conf.write_text("mount_max = 1000\n  user_allow_other  \n")
    assert user_may_allow_other(conf)
    assert not user_may_allow_other(tmp_path / "missing.conf")


@NEEDS_ROOT
def test_allow_other_as_a_user_without_user_allow_other_fails_before_mounting() -> None:
    if user_may_allow_other(FUSE_CONF):
        pytest.skip(f"{FUSE_CONF} has user_allow_other on this machine")
    base = Path(tempfile.mkdtemp(prefix="shinglefs-allow-", dir="/tmp"))
    opened = []
    try:
        base.chmod(0o755)
        (base / "mnt").mkdir()
        os.chown(base / "mnt", NOBODY, NOGROUP)
        message = base / "message"
        message.touch()
        message.chmod(0o666)

        def mount_as_user() -> None:
            # In a forked child: this interpreter's standard library (under
            # /root) may not be readable by the user, so nothing new is imported.
            try:
                mount(opened.append, base / "mnt", foreground=False, allow_other=True)
            except AllowOtherDeniedError as exc:
                message.write_text(f"{exc}\n{exc.hint}")
                raise OSError(exc.exit_code, str(exc)) from None

        assert as_user(mount_as_user) == AllowOtherDeniedError.exit_code == 21
        first, hint = message.read_text().splitlines()
        assert first == (f"--allow-other needs user_allow_other in {FUSE_CONF} "
                         "when not mounting as root")
        assert "user_allow_other" in hint
        assert mount_entry(base / "mnt") is None and os.listdir(base / "mnt") == []
    finally:
        shutil.rmtree(base, ignore_errors=True)
