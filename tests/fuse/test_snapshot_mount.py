"""Snapshots on a real mount, made with the real ``shinglefs snapshot`` command
while mounted (docs/cli.md, docs/metadata.md "Snapshots").

A versioned dataset as a user keeps one: a corpus written through the mount,
a copy taken, the corpus then changed and finally deleted. Each step tries to
break a promise: the copy appears at once and reads bit-exact from the
drives (caches dropped); changes on either side never reach the other;
deleting the source frees nothing the copy still names (the deletion queue
is drained before the copy is read again); deleting the last side frees the
drives' bytes; the metadata stays consistent throughout.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from shinglefs.fuse.harness import MountedFileSystem, drop_caches, shinglefs_command
from shinglefs.meta import open_meta
from shinglefs.meta.check import check_consistency

MiB = 1 << 20


def snapshot(*args: str) -> dict:
    done = subprocess.run([*shinglefs_command(), "snapshot", *args, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def status(fs: MountedFileSystem) -> dict:
    return dict(json.loads(os.getxattr(fs.mountpoint, "user.shinglefs.status")))


def drain_deletions(fs: MountedFileSystem, timeout: float = 60) -> None:
    """Wait until the mount's deletion consumer has emptied the queue."""
    db = fs.meta_url.removeprefix("sqlite3://")
    deadline = time.monotonic() + timeout
    while True:
        with sqlite3.connect(db) as con:
            (queued,) = con.execute("SELECT COUNT(*) FROM deletions").fetchone()
        if queued == 0:
            return
        assert time.monotonic() < deadline, f"{queued} deletions still queued"
        time.sleep(0.2)


def consistent(fs: MountedFileSystem) -> None:
    meta = open_meta(fs.meta_url)
    try:
        problems = check_consistency(meta)
    finally:
        meta.close()
    assert problems == [], problems


def read_all(root: Path) -> dict[str, bytes]:
    drop_caches()
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


@pytest.fixture
def fs(tmp_path: Path):
    with MountedFileSystem(tmp_path / "data", tmp_path / "mnt") as mounted:
        yield mounted


def test_a_versioned_corpus_through_its_whole_life(fs: MountedFileSystem) -> None:
    corpus = fs.mountpoint / "corpus"
    (corpus / "shard-0").mkdir(parents=True)
    want = {}
    for i in range(3):  # big shards on the drives, small files inline in meta
        want[f"shard-0/part-{i}.tar"] = os.urandom(3 * MiB + i)
        want[f"shard-0/meta-{i}.json"] = b'{"i": %d}' % i
    for rel, data in want.items():
        (corpus / rel).write_bytes(data)
    os.link(corpus / "shard-0/part-0.tar", corpus / "part-0.link")
    want["part-0.link"] = want["shard-0/part-0.tar"]
    os.symlink("shard-0/part-1.tar", corpus / "latest")
    os.setxattr(corpus / "shard-0/part-2.tar", "user.origin", b"crawl-7")
    live_before = status(fs)["live_bytes"]

    out = snapshot(str(corpus), str(fs.mountpoint / "corpus@v1"))
    assert out["copy"] == "/corpus@v1"
    snapshot(fs.meta_url, "/corpus", "/corpus@ro", "--read-only")
    v1, ro = fs.mountpoint / "corpus@v1", fs.mountpoint / "corpus@ro"
    assert read_all(v1) == want == read_all(ro)
    assert os.readlink(v1 / "latest") == "shard-0/part-1.tar"
    assert os.stat(v1 / "part-0.link").st_ino == os.stat(v1 / "shard-0/part-0.tar").st_ino
    assert os.getxattr(v1 / "shard-0/part-2.tar", "user.origin") == b"crawl-7"
    assert os.stat(ro / "shard-0/part-0.tar").st_mode & 0o222 == 0
    assert status(fs)["live_bytes"] == live_before  # no byte was copied
    consistent(fs)

    # The corpus moves on: appended, rewritten in place, a file replaced.
    with open(corpus / "shard-0/part-0.tar", "ab") as f:
        f.write(b"appended")
    with open(corpus / "shard-0/part-1.tar", "r+b") as f:
        f.seek(MiB)
        f.write(b"x" * MiB)
    (corpus / "shard-0/meta-0.json").write_bytes(b"{}")
    # ... and so does the writable copy.
    with open(v1 / "shard-0/part-2.tar", "ab") as f:
        f.write(b"v1 only")
    assert read_all(ro) == want
    got = read_all(v1)
    assert got.pop("shard-0/part-2.tar") == want["shard-0/part-2.tar"] + b"v1 only"
    assert got == {k: v for k, v in want.items() if k != "shard-0/part-2.tar"}
    assert (corpus / "shard-0/part-2.tar").read_bytes() == want["shard-0/part-2.tar"]

    # The source goes; what the copies name stays on the drives.
    subprocess.run(["rm", "-rf", str(corpus)], check=True)
    drain_deletions(fs)
    assert read_all(ro) == want
    consistent(fs)

    # The last copies go (the read-only one by the command that may remove
    # it): the drives' bytes are freed.
    assert snapshot("--delete", str(ro))["deleted"] == "/corpus@ro"
    subprocess.run(["rm", "-rf", str(v1)], check=True)
    drain_deletions(fs)
    deadline = time.monotonic() + 60
    while status(fs)["live_bytes"] > 0:
        assert time.monotonic() < deadline, status(fs)["live_bytes"]
        time.sleep(0.2)
    consistent(fs)


def test_refusals_are_one_line_and_change_nothing(fs: MountedFileSystem, tmp_path: Path) -> None:
    (fs.mountpoint / "d").mkdir()
    (fs.mountpoint / "d" / "f").write_bytes(b"x")
    cases = [
        ([str(fs.mountpoint / "d"), str(fs.mountpoint / "d")], 1, "/d exists"),
        ([str(fs.mountpoint / "d"), str(fs.mountpoint / "d" / "in")], 1, "into itself"),
        ([str(fs.mountpoint / "nope"), str(fs.mountpoint / "x")], 1, "/nope does not exist"),
        ([str(fs.mountpoint / "d"), str(fs.mountpoint / "x" / "y")], 1, "/x does not exist"),
        # walked as the kernel walks it, not lexically: x does not exist
        ([str(fs.mountpoint / "d"), f"{fs.mountpoint}/x/../c3"], 1, "x/../c3 does not exist"),
        ([str(fs.mountpoint / "d"), f"{fs.mountpoint}/d/f/../c3"], 1, "is not a directory"),
        ([f"{fs.mountpoint}/x/../d", str(fs.mountpoint / "c4")], 1, "x/../d does not exist"),
        (["--delete", f"{fs.mountpoint}/x/../ro@v1"], 1, "x/../ro@v1 does not exist"),
        (["--delete", f"{fs.mountpoint}/d/f/../../ro@v1"], 1, "is not a directory"),
        ([str(fs.mountpoint / "d"), str(tmp_path / "x")], 2, "nor on a ShingleFS mount"),
        ([str(tmp_path), str(fs.mountpoint / "x")], 2, "nor on a ShingleFS mount"),
        ([fs.meta_url, "d", "/x"], 2, "absolute path"),
        ([fs.meta_url, "/d", "/"], 2, "no new entry"),
        (["--delete", str(fs.mountpoint / "nope")], 1, "/nope does not exist"),
        (["--delete", str(fs.mountpoint / "d")], 1, "/d is not a read-only snapshot"),
        (["--delete", str(fs.mountpoint / "d" / "f")], 1, "/d/f is not a read-only snapshot"),
        (["--delete", str(fs.mountpoint / "d"), str(fs.mountpoint / "x")], 2, "one path"),
        (["--delete", str(tmp_path / "x")], 2, "nor on a ShingleFS mount"),
        (["--delete", fs.meta_url], 2, "is a metadata URL: --delete takes"),
        ([str(fs.mountpoint / "d")], 2, "a source and a new name"),
        (["d", ".."], 2, f"'..' ({fs.mountpoint.parent}) is neither"),  # as typed, and where
        ([str(fs.mountpoint / "d"), str(fs.mountpoint / "ro@v1" / "in")], 1,
         "/ro@v1 is a read-only snapshot"),
    ]
    snapshot(str(fs.mountpoint / "d"), str(fs.mountpoint / "ro@v1"), "--read-only")
    for args, code, words in cases:
        done = subprocess.run([*shinglefs_command(), "snapshot", *args],
                              capture_output=True, text=True, timeout=120, cwd=fs.mountpoint)
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert sorted(os.listdir(fs.mountpoint)) == ["d", "ro@v1"]
    assert (fs.mountpoint / "d" / "f").read_bytes() == b"x"
    consistent(fs)


def test_names_are_taken_as_given(fs: MountedFileSystem) -> None:
    """A name that is not UTF-8 is copied byte for byte (the command neither
    crashes nor mangles it); a symlink is copied as the link, with a URL or on
    the mount alike, and a symlink's target is never where a copy lands."""
    mnt = os.fsencode(fs.mountpoint)
    os.mkdir(mnt + b"/\xffdata")
    with open(mnt + b"/\xffdata/f\xfe", "wb") as f:
        f.write(b"odd")
    os.symlink("\xffdata".encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape"),
               mnt + b"/ln")
    os.symlink(b"elsewhere", mnt + b"/dangling")
    runs = [
        [mnt + b"/\xffdata", mnt + b"/\xffdata@1"],
        [fs.meta_url.encode(), b"/\xffdata", b"/\xffdata@2"],
        [mnt + b"/ln", mnt + b"/ln@1"],
    ]
    for args in runs:
        done = subprocess.run([*shinglefs_command(), "snapshot", *args], capture_output=True,
                              timeout=120)
        assert done.returncode == 0, (args, done.stderr)
        assert b"Traceback" not in done.stderr
    for copy in (b"/\xffdata@1", b"/\xffdata@2"):
        with open(mnt + copy + b"/f\xfe", "rb") as f:
            assert f.read() == b"odd"
    assert os.readlink(mnt + b"/ln@1") == os.readlink(mnt + b"/ln")
    done = subprocess.run([*shinglefs_command(), "snapshot", mnt + b"/ln", mnt + b"/dangling"],
                          capture_output=True, timeout=120)
    assert done.returncode == 1 and b"/dangling exists" in done.stderr, done.stderr
    assert not os.path.lexists(mnt + b"/elsewhere")
    consistent(fs)


@pytest.mark.skipif(os.geteuid() != 0, reason="switches users: needs root")
def test_a_user_snapshots_on_a_shared_mount_with_their_own_rights() -> None:
    """``shinglefs snapshot`` on a mount is a request to the daemon, made as
    the caller (fuse/requests.py): a user of root's mount copies what they
    may read into where they may write, owns the copy, and gets the errno
    of anything else; the mount's own buffered writes are in the copy."""
    from tests.fuse.opskit import NOBODY, as_user, root_mount_and_local

    from shinglefs.fuse.requests import SNAPSHOT_XATTR, snapshot_request

    def ask(directory: Path, src: str, name: str, read_only: bool = False) -> None:
        os.setxattr(directory, SNAPSHOT_XATTR,
                    snapshot_request(src.encode(), name.encode(), read_only))

    with root_mount_and_local("shinglefs-snap-") as (mnt, _local):
        shared, data, private = mnt / "shared", mnt / "shared" / "data", mnt / "private"
        shared.mkdir(mode=0o777)
        shared.chmod(0o777)
        data.mkdir()
        (data / "part-0").write_bytes(b"readable")
        private.mkdir(mode=0o700)
        (private / "secret").write_bytes(b"root only")
        os.mknod(shared / "sda", 0o600 | 0o060000, os.makedev(8, 0))
        with open(data / "open-file", "wb") as f:  # still open: buffered in the mount
            f.write(b"not closed yet")
            f.flush()
            assert as_user(lambda: ask(shared, "/shared/data", "mine")) == 0
        assert sorted(os.listdir(shared / "mine")) == ["open-file", "part-0"]
        assert (shared / "mine" / "open-file").read_bytes() == b"not closed yet"
        assert (shared / "mine" / "part-0").read_bytes() == b"readable"
        assert (shared / "mine").stat().st_uid == NOBODY
        assert (shared / "mine" / "part-0").stat().st_uid == NOBODY
        assert as_user(lambda: ask(shared, "/private", "p")) == errno.EACCES
        assert as_user(lambda: ask(mnt, "/shared/data", "top")) == errno.EACCES
        assert as_user(lambda: ask(shared, "/shared/sda", "dev")) == errno.EPERM
        assert as_user(lambda: ask(shared, "/shared/data", "mine")) == errno.EEXIST
        assert as_user(lambda: ask(shared, "/nope", "x")) == errno.ENOENT
        assert as_user(lambda: os.setxattr(shared, SNAPSHOT_XATTR, b"junk")) == errno.EINVAL
        assert sorted(os.listdir(shared)) == ["data", "mine", "sda"]
        assert SNAPSHOT_XATTR.decode() not in os.listxattr(shared)  # a request, never stored


def test_a_read_only_snapshot_is_immutable_even_for_root(fs: MountedFileSystem) -> None:
    """Root (whom no mode bit stops) tries every way to change a read-only copy
    through the mount: each fails with EPERM and the copy reads as it was; the
    command that deletes snapshots refuses an ordinary tree, and removes the
    read-only copy, leaving its source whole."""
    corpus = fs.mountpoint / "corpus"
    (corpus / "shard").mkdir(parents=True)
    want = {"shard/a.bin": os.urandom(2 * MiB), "shard/b.json": b"{}", "c.txt": b"c"}
    for rel, data in want.items():
        (corpus / rel).write_bytes(data)
    os.symlink("c.txt", corpus / "latest")
    snapshot(str(corpus), str(fs.mountpoint / "v1"), "--read-only")
    v1 = fs.mountpoint / "v1"
    a, shard = v1 / "shard" / "a.bin", v1 / "shard"
    attempts = {
        "append": lambda: open(a, "ab").close(),
        "open for writing": lambda: os.close(os.open(a, os.O_WRONLY)),
        "O_TRUNC": lambda: os.close(os.open(a, os.O_RDONLY | os.O_TRUNC)),
        "truncate": lambda: os.truncate(a, 0),
        "chmod": lambda: os.chmod(a, 0o644),
        "chown": lambda: os.chown(a, 1, 1),
        "utime": lambda: os.utime(a, (1, 1)),
        "touch now": lambda: os.utime(a),
        "setxattr": lambda: os.setxattr(a, "user.x", b"1"),
        "create": lambda: (shard / "new").write_bytes(b"x"),
        "mkdir": lambda: os.mkdir(shard / "new"),
        "symlink": lambda: os.symlink("a.bin", shard / "new"),
        "link out": lambda: os.link(a, corpus / "a-link"),
        "unlink": lambda: os.unlink(a),
        "unlink symlink": lambda: os.unlink(v1 / "latest"),
        "rmdir": lambda: os.rmdir(v1),
        "rename inside": lambda: os.rename(a, shard / "moved"),
        "rename out": lambda: os.rename(a, corpus / "moved"),
        "rename in": lambda: os.rename(corpus / "c.txt", shard / "c.txt"),
        "rename over": lambda: os.replace(corpus / "c.txt", v1 / "c.txt"),
        "rename the copy": lambda: os.rename(v1, fs.mountpoint / "v2"),
        "retention": lambda: subprocess.run(
            [*shinglefs_command(), "policy", str(v1), "--keep-last", "1"], check=True,
            capture_output=True, timeout=60),
    }
    for what, attempt in attempts.items():
        with pytest.raises((PermissionError, subprocess.CalledProcessError)) as info:
            attempt()
        if isinstance(info.value, OSError):
            assert info.value.errno == errno.EPERM, what
    done = subprocess.run(["rm", "-rf", str(v1)], capture_output=True, timeout=60)
    assert done.returncode != 0
    assert read_all(v1) == want
    assert os.readlink(v1 / "latest") == "c.txt"

    # Not a read-only snapshot: refused, and kept.
    done = subprocess.run([*shinglefs_command(), "snapshot", "--delete", str(corpus)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "/corpus is not a read-only snapshot" in done.stderr, \
        done.stderr
    assert read_all(corpus) == want

    # Part of a snapshot, or an ordinary tree holding one: refused, nothing removed.
    os.mkdir(fs.mountpoint / "proj")
    (fs.mountpoint / "proj" / "main.py").write_bytes(b"code")
    snapshot(str(corpus), str(fs.mountpoint / "proj" / "data@v1"), "--read-only")
    for path, words in ((shard, "/v1/shard: not deleted"),
                        (v1 / "latest", "/v1/latest: not deleted"),
                        (fs.mountpoint / "proj", "/proj is not a read-only snapshot")):
        done = subprocess.run([*shinglefs_command(), "snapshot", "--delete", str(path)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and words in done.stderr, (path, done.stderr)
    assert (fs.mountpoint / "proj" / "main.py").read_bytes() == b"code"
    assert read_all(v1) == want == read_all(fs.mountpoint / "proj" / "data@v1")
    with pytest.raises(PermissionError):
        (shard / "new").write_bytes(b"x")
    done = subprocess.run([*shinglefs_command(), "snapshot", "--delete", str(fs.mountpoint)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "root of its file system" in done.stderr, done.stderr

    # A writable copy of the read-only one restores the version.
    snapshot(str(v1), str(fs.mountpoint / "restored"))
    (fs.mountpoint / "restored" / "c.txt").write_bytes(b"changed")

    assert snapshot("--delete", str(v1))["entries"] == 6  # v1, shard, a, b, c, latest
    assert not v1.exists()
    assert read_all(corpus) == want
    drain_deletions(fs)
    assert read_all(fs.mountpoint / "restored")["shard/a.bin"] == want["shard/a.bin"]
    consistent(fs)


@pytest.mark.skipif(os.geteuid() != 0, reason="switches users: needs root")
def test_a_user_deletes_their_own_read_only_snapshot_and_no_one_elses() -> None:
    """On root's shared mount a user pins their data read-only and cannot change
    it by accident either; ``snapshot --delete`` removes it (its directories
    have no write bit: the command gives it back); another user's pinned copy
    stays (EPERM): here root's, of root's data."""
    from tests.fuse.opskit import NOBODY, as_user, root_mount_and_local

    import shinglefs.cli.snapshot as cli
    from shinglefs.fuse.requests import SNAPSHOT_XATTR, snapshot_request
    from shinglefs.meta.errors import FsError

    def pin(directory: Path, src: str, name: str) -> None:
        os.setxattr(directory, SNAPSHOT_XATTR, snapshot_request(src.encode(), name.encode(),
                                                                True))

    def delete(path: Path) -> None:
        try:
            cli._delete_through_mount(str(path))
        except FsError as exc:
            raise OSError(exc.errno, str(exc)) from None

    with root_mount_and_local("shinglefs-pin-") as (mnt, _local):
        shared = mnt / "shared"
        shared.mkdir(mode=0o777)
        shared.chmod(0o777)
        assert as_user(lambda: (shared / "data").mkdir()) == 0
        assert as_user(lambda: (shared / "data" / "part").write_bytes(b"mine")) == 0
        assert as_user(lambda: pin(shared, "/shared/data", "data@v1")) == 0
        (shared / "rootdata").mkdir()
        (shared / "rootdata" / "part").write_bytes(b"root's")
        pin(shared, "/shared/rootdata", "root@v1")  # root's: it keeps root as owner
        pinned = shared / "data@v1"
        assert pinned.stat().st_uid == NOBODY
        assert as_user(lambda: os.unlink(pinned / "part")) in (errno.EACCES, errno.EPERM)
        assert as_user(lambda: os.chmod(pinned, 0o755)) == errno.EPERM
        assert as_user(lambda: delete(shared / "root@v1")) == errno.EPERM
        assert (shared / "root@v1" / "part").read_bytes() == b"root's"
        # Root pinned a tree of the user's holding another user's directory: the
        # user cannot remove that one, so nothing is made writable.
        assert as_user(lambda: (shared / "data" / "theirs").mkdir(mode=0o777)) == 0
        os.chown(shared / "data" / "theirs", NOBODY - 1, NOBODY - 1)
        pin(shared, "/shared/data", "mixed@v1")
        assert as_user(lambda: delete(shared / "mixed@v1")) == errno.EPERM
        with pytest.raises(PermissionError):
            (shared / "mixed@v1" / "theirs" / "f").write_bytes(b"x")  # still read-only
        assert as_user(lambda: delete(pinned)) == 0
        assert not pinned.exists()
        assert (shared / "data" / "part").read_bytes() == b"mine"
        assert sorted(os.listdir(shared)) == ["data", "mixed@v1", "root@v1", "rootdata"]
