"""The storage node: placement by lifetime group and free space, drive locks, slice I/O by id."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shinglefs.server.errors import DriveInUse, SliceMissing
from shinglefs.server.node import StorageNode
from shinglefs.zoned.errors import DriveFormatError

MiB = 1024 * 1024


def specs(root: Path, count: int, size: int = 2048 * MiB) -> list[tuple[int, str]]:
    return [(i, f"emulated:{root}/d{i}.img:{size}") for i in range(count)]


@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    n = StorageNode.open(specs(tmp_path, 2), create=True)
    yield n
    n.close()


def test_slices_are_written_read_and_deleted_by_id(node: StorageNode) -> None:
    data = os.urandom(5 * MiB)
    drive = node.write(101, 0, data[: 4 * MiB], group=7)
    assert node.write(101, 4 * MiB, data[4 * MiB :], group=7) == drive
    assert node.read(101, 0, 5 * MiB, drive) == data
    assert node.read(101, 4 * MiB - 3, 10) == data[4 * MiB - 3 : 4 * MiB + 7]
    assert node.length(101) == 5 * MiB
    node.delete(101, drive)
    assert not node.contains(101)
    with pytest.raises(SliceMissing):
        node.read(101, 0, 1, drive)
    node.delete(101, drive)  # idempotent


def test_a_group_stays_on_its_drive_and_new_groups_go_to_the_freest(node: StorageNode) -> None:
    first = node.write(1, 0, b"a" * MiB, group=10)
    assert node.write(2, 0, b"b" * MiB, group=10) == first
    assert node.write(3, 0, b"c" * MiB, group=10) == first
    node.refresh_stats()
    other = node.write(4, 0, b"d" * MiB, group=11)
    assert other != first  # the other drive has more free bytes
    assert node.place(5, 10) == first


def test_stats_sum_the_drives(node: StorageNode) -> None:
    node.write(1, 0, b"x" * MiB, group=1)
    stats = node.stats()
    assert len(stats.drives) == 2
    assert stats.capacity_bytes == sum(d.capacity_bytes for d in stats.drives) > 0
    assert stats.free_bytes <= stats.capacity_bytes - MiB
    assert stats.user_bytes_written >= MiB


def test_second_open_of_the_same_drives_names_the_holder(tmp_path: Path) -> None:
    with StorageNode.open(specs(tmp_path, 1), create=True):
        with pytest.raises(DriveInUse) as exc:
            StorageNode.open(specs(tmp_path, 1))
        assert exc.value.holder_pid == os.getpid()
        assert exc.value.errno == errno.EBUSY
        assert f"pid {os.getpid()}" in str(exc.value)
        code = (
            "import sys\n"
            "from shinglefs.server.node import StorageNode\n"
            "from shinglefs.server.errors import DriveInUse\n"
            f"try:\n    StorageNode.open([(0, {specs(tmp_path, 1)[0][1]!r})])\n"
            "except DriveInUse as e:\n    print(e.holder_pid); sys.exit(0)\n"
            "sys.exit(1)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) == os.getpid()
    # Released on close: opening again works.
    StorageNode.open(specs(tmp_path, 1)).close()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_closing_a_node_closes_the_drives_it_opened(tmp_path: Path) -> None:
    # Each emulated drive holds three descriptors (data, O_DIRECT writer, zone
    # table); a node that closed its stores but not their drives kept all three.
    StorageNode.open(specs(tmp_path, 2), create=True).close()
    before = open_descriptors()
    for _ in range(10):
        StorageNode.open(specs(tmp_path, 2)).close()
    assert open_descriptors() == before


def test_a_failed_open_closes_the_drives_opened_before_the_failure(tmp_path: Path) -> None:
    StorageNode.open(specs(tmp_path, 1), create=True).close()
    missing = (1, f"emulated:{tmp_path}/absent.img:{2048 * MiB}")
    before = open_descriptors()
    for _ in range(10):
        with pytest.raises(DriveFormatError):
            StorageNode.open([*specs(tmp_path, 1), missing])
    assert open_descriptors() == before
