"""One ``shinglefs up`` file system used by a mount, ``connect()`` in another
process and a second mount at once (server/share.py): the process holding
the drives serves them on loopback; the others go through it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.polling import wait_until

from shinglefs.fuse.harness import MountedFileSystem, shinglefs_command

MiB = 1024 * 1024


def test_a_mount_a_connect_in_another_process_and_a_second_mount_share_one_file_system(
        tmp_path: Path) -> None:
    data, first, second = tmp_path / "data", tmp_path / "mnt1", tmp_path / "mnt2"
    first.mkdir()
    second.mkdir()
    up = subprocess.run([*shinglefs_command(), "up", str(data), str(first)],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    url = f"sqlite3://{data / 'meta.db'}"
    other = MountedFileSystem(data, second, meta_url=url)
    other.log_path = tmp_path / "mount2.log"
    try:
        wait_until(lambda: os.path.ismount(first), "the up mount")
        big = os.urandom(6 * MiB + 5)
        (first / "from_up.bin").write_bytes(big)
        script = (
            "import shinglefs, sys\n"
            "fs = shinglefs.connect(sys.argv[1])\n"
            "assert fs.read_bytes('/from_up.bin') == open(sys.argv[2], 'rb').read()\n"
            "fs.write_bytes('/from_script.bin', bytes(range(256)) * 8192)\n"
            "fs.close()\n")
        (tmp_path / "expected").write_bytes(big)
        run = subprocess.run([sys.executable, "-c", script, url, str(tmp_path / "expected")],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert (first / "from_script.bin").read_bytes() == bytes(range(256)) * 8192
        other.start()  # a second mount of the same file system, drives held by the first
        assert (second / "from_up.bin").read_bytes() == big
        (second / "from_second.txt").write_text("hello from the second mount")
        assert (first / "from_second.txt").read_text() == "hello from the second mount"
        assert sorted(os.listdir(second)) == sorted(os.listdir(first))
        # Close-to-open across the mounts when a name moves to another inode:
        # the second mount's cached name leads to the old inode, unlinked but
        # not yet closed by the first mount (deferred closes): its open must
        # fail ESTALE, so that the kernel looks the name up again, and never
        # read the previous checkpoint or a deleted file.
        for step in range(5):
            (first / "ck.tmp").write_bytes(b"step %d" % step)
            os.replace(first / "ck.tmp", first / "ck")
            assert (second / "ck").read_bytes() == b"step %d" % step
            (first / "x").write_bytes(b"first %d" % step)
            assert (second / "x").read_bytes() == b"first %d" % step
            os.unlink(first / "x")
            (first / "x").write_bytes(b"second %d" % step)
            assert (second / "x").read_bytes() == b"second %d" % step
        # Close-to-open for the size: the second mount's kernel holds the file's
        # attributes from a stat (for ATTR_TIMEOUT); the first mount grows the
        # file; an open on the second must read all of it, not stop at the
        # size it had cached (it read the old 100 bytes of a 4 KiB file).
        for step in range(5):
            (first / "grown").write_bytes(b"a" * (100 + step))
            assert os.stat(second / "grown").st_size == 100 + step
            (first / "grown").write_bytes(b"b" * (4096 * (step + 1)))
            with open(second / "grown", "rb") as f:
                assert f.read() == b"b" * (4096 * (step + 1)), step
                assert os.fstat(f.fileno()).st_size == 4096 * (step + 1)
            # ... and appended to on the second, read on the first.
            with open(second / "grown", "ab") as f:
                f.write(b"c" * 1000)
            with open(first / "grown", "rb") as f:
                assert f.read() == b"b" * (4096 * (step + 1)) + b"c" * 1000, step
    finally:
        other.stop()
        subprocess.run([*shinglefs_command(), "umount", str(first)], capture_output=True,
                       timeout=120)
