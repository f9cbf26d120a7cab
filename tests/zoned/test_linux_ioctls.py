"""Linux zoned-device plumbing without a device: ioctl numbers, struct layouts, sysfs, errors.

The layouts are checked three ways: the ``_IOC`` macros recomputed here, the
struct sizes, and (when a C compiler and ``linux/blkzoned.h`` are present) a
small C program printing what the real header says.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from shinglefs.zoned import linux
from shinglefs.zoned.errors import (
    DriveFormatError,
    TooManyOpenZones,
    WritePointerViolation,
    ZoneBoundaryError,
    ZoneError,
    ZoneFullError,
    ZoneOfflineError,
    ZoneReadOnlyError,
)
from shinglefs.zoned.linux import (
    BLK_ZONE_REP_CAPACITY,
    BlkZone,
    classify_write_error,
    pack_blk_zone,
    pack_report_request,
    pack_zone_range,
    parse_report,
    read_queue_limits,
)
from shinglefs.zoned.model import ZoneCondition, ZoneInfo, ZoneType

# asm-generic/ioctl.h
_IOC_NRSHIFT, _IOC_TYPESHIFT, _IOC_SIZESHIFT, _IOC_DIRSHIFT = 0, 8, 16, 30
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, type_: int, nr: int, size: int) -> int:
    return (direction << _IOC_DIRSHIFT) | (type_ << _IOC_TYPESHIFT) | (nr << _IOC_NRSHIFT) | (
        size << _IOC_SIZESHIFT)


def _ior(t: int, nr: int, size: int) -> int:
    return _ioc(_IOC_READ, t, nr, size)


def _iow(t: int, nr: int, size: int) -> int:
    return _ioc(_IOC_WRITE, t, nr, size)


def _iowr(t: int, nr: int, size: int) -> int:
    return _ioc(_IOC_READ | _IOC_WRITE, t, nr, size)


def test_ioctl_numbers_match_the_ioc_macros() -> None:
    report, zrange, u32 = linux.BLK_ZONE_REPORT.size, linux.BLK_ZONE_RANGE.size, 4
    assert _iowr(0x12, 130, report) == linux.BLKREPORTZONE
    assert _iow(0x12, 131, zrange) == linux.BLKRESETZONE
    assert _ior(0x12, 132, u32) == linux.BLKGETZONESZ
    assert _ior(0x12, 133, u32) == linux.BLKGETNRZONES
    assert _iow(0x12, 134, zrange) == linux.BLKOPENZONE
    assert _iow(0x12, 135, zrange) == linux.BLKCLOSEZONE
    assert _iow(0x12, 136, zrange) == linux.BLKFINISHZONE


def test_struct_sizes_match_the_kernel_abi() -> None:
    assert linux.BLK_ZONE.size == 64
    assert linux.BLK_ZONE_REPORT.size == 16
    assert linux.BLK_ZONE_RANGE.size == 16


_C_PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include <linux/blkzoned.h>
int main(void) {
    printf("%zu %zu %zu\n", sizeof(struct blk_zone), sizeof(struct blk_zone_report),
           sizeof(struct blk_zone_range));
    printf("%zu %zu %zu %zu %zu %zu %zu %zu\n", offsetof(struct blk_zone, start),
           offsetof(struct blk_zone, len), offsetof(struct blk_zone, wp),
           offsetof(struct blk_zone, type), offsetof(struct blk_zone, cond),
           offsetof(struct blk_zone, non_seq), offsetof(struct blk_zone, reset),
           offsetof(struct blk_zone, capacity));
    printf("%zu %zu %zu\n", offsetof(struct blk_zone_report, sector),
           offsetof(struct blk_zone_report, nr_zones), offsetof(struct blk_zone_report, flags));
    printf("%lu %lu %lu %lu %lu %lu %lu\n", (unsigned long)BLKREPORTZONE,
           (unsigned long)BLKRESETZONE, (unsigned long)BLKGETZONESZ,
           (unsigned long)BLKGETNRZONES, (unsigned long)BLKOPENZONE,
           (unsigned long)BLKCLOSEZONE, (unsigned long)BLKFINISHZONE);
    printf("%d %d %d %d\n", BLK_ZONE_REP_CAPACITY, BLK_ZONE_COND_READONLY,
           BLK_ZONE_COND_FULL, BLK_ZONE_COND_OFFLINE);
    return 0;
}
"""


def test_layouts_and_numbers_match_the_installed_header(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not Path("/usr/include/linux/blkzoned.h").exists():
        pytest.skip("needs a C compiler and linux/blkzoned.h (linux-libc-dev)")
    src = tmp_path / "probe.c"
    src.write_text(_C_PROBE)
    subprocess.run([cc, "-o", str(tmp_path / "probe"), str(src)], check=True)
    lines = subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True,
                           text=True).stdout.split("\n")
    sizes, zone_offsets, report_offsets, numbers, enums = (
        [int(x) for x in line.split()] for line in lines[:5])
    assert sizes == [linux.BLK_ZONE.size, linux.BLK_ZONE_REPORT.size, linux.BLK_ZONE_RANGE.size]
    # offsets implied by '<QQQBBBB4sQ24s' and '<QII'
    assert zone_offsets == [0, 8, 16, 24, 25, 26, 27, 32]
    assert report_offsets == [0, 8, 12]
    assert numbers == [linux.BLKREPORTZONE, linux.BLKRESETZONE, linux.BLKGETZONESZ,
                       linux.BLKGETNRZONES, linux.BLKOPENZONE, linux.BLKCLOSEZONE,
                       linux.BLKFINISHZONE]
    assert enums == [BLK_ZONE_REP_CAPACITY, ZoneCondition.READ_ONLY, ZoneCondition.FULL,
                     ZoneCondition.OFFLINE]


def test_report_request_header_asks_for_zones_from_a_sector() -> None:
    buf = pack_report_request(sector=524288, nr_zones=3)
    assert len(buf) == 16 + 3 * 64
    assert linux.BLK_ZONE_REPORT.unpack_from(buf) == (524288, 3, 0)
    assert bytes(buf[16:]) == bytes(3 * 64)


def test_parse_report_reads_back_what_the_kernel_writes() -> None:
    zones = [
        BlkZone(0, 524288, 524288, ZoneType.CONVENTIONAL, ZoneCondition.NOT_WP, 0, 0, 524288),
        BlkZone(524288, 524288, 524288 + 8, ZoneType.SEQUENTIAL_WRITE_REQUIRED,
                ZoneCondition.IMPLICIT_OPEN, 0, 1, 524280),
    ]
    buf = pack_report_request(0, 4)  # room for 4, the "kernel" fills 2
    linux.BLK_ZONE_REPORT.pack_into(buf, 0, 0, 2, BLK_ZONE_REP_CAPACITY)
    for i, z in enumerate(zones):
        buf[16 + i * 64 : 16 + (i + 1) * 64] = pack_blk_zone(z)
    flags, parsed = parse_report(buf)
    assert flags == BLK_ZONE_REP_CAPACITY and parsed == zones


def test_zone_info_converts_sectors_and_honours_the_capacity_flag() -> None:
    z = BlkZone(524288, 524288, 524288 + 8, 2, 2, 0, 0, 262144)
    info = z.to_zone_info(1, BLK_ZONE_REP_CAPACITY)
    assert info == ZoneInfo(1, 256 << 20, 256 << 20, 128 << 20, (256 << 20) + 4096,
                            ZoneType.SEQUENTIAL_WRITE_REQUIRED, ZoneCondition.IMPLICIT_OPEN)
    assert z.to_zone_info(1, 0).capacity == 256 << 20  # old kernels: capacity = len
    conv = BlkZone(0, 524288, 999, 1, 0, 0, 0, 0).to_zone_info(0, 0)
    assert conv.write_pointer == 0 and conv.type is ZoneType.CONVENTIONAL


def test_parse_report_rejects_a_count_larger_than_the_buffer() -> None:
    buf = pack_report_request(0, 1)
    linux.BLK_ZONE_REPORT.pack_into(buf, 0, 0, 5, 0)
    with pytest.raises(ValueError, match="room for 1"):
        parse_report(buf)


def test_zone_range_is_two_little_endian_u64() -> None:
    assert pack_zone_range(524288, 524288) == (524288).to_bytes(8, "little") * 2


def _fake_queue(root: Path, **files: str) -> Path:
    q = root / "block" / "nullb0" / "queue"
    q.mkdir(parents=True)
    for name, value in files.items():
        (q / name).write_text(value + "\n")
    return q


def test_sysfs_limits_of_a_host_managed_drive(tmp_path: Path) -> None:
    q = _fake_queue(tmp_path, zoned="host-managed", chunk_sectors="524288", nr_zones="55880",
                    max_open_zones="128", max_active_zones="0", logical_block_size="512",
                    physical_block_size="4096")
    assert linux.queue_dir_for("/dev/nullb0", str(tmp_path)) == q
    limits = read_queue_limits(q)
    assert limits == linux.QueueLimits("host-managed", 524288, 55880, 128, 0, 512, 4096)


def test_sysfs_limits_of_an_old_kernel_without_zone_limit_files(tmp_path: Path) -> None:
    q = _fake_queue(tmp_path, zoned="none")
    limits = read_queue_limits(q)
    assert (limits.zoned, limits.max_open_zones, limits.logical_block_size) == ("none", 0, 512)


def test_sysfs_garbage_is_reported_with_the_file_name(tmp_path: Path) -> None:
    q = _fake_queue(tmp_path, zoned="host-managed", nr_zones="many")
    with pytest.raises(ValueError, match="nr_zones"):
        read_queue_limits(q)


def _zone(cond: ZoneCondition, wp: int = 4096, ztype: ZoneType = ZoneType.SEQUENTIAL_WRITE_REQUIRED
          ) -> ZoneInfo:
    return ZoneInfo(1, 0, 1 << 20, 1 << 20, wp, ztype, cond)


@pytest.mark.parametrize(
    ("err", "zone", "offset", "expected", "expected_errno"),
    [
        (errno.EIO, _zone(ZoneCondition.IMPLICIT_OPEN), 8192, WritePointerViolation, errno.EIO),
        (errno.EIO, _zone(ZoneCondition.FULL, 1 << 20), 8192, ZoneFullError, errno.EIO),
        (errno.EIO, _zone(ZoneCondition.READ_ONLY), 4096, ZoneReadOnlyError, errno.EIO),
        (errno.EIO, _zone(ZoneCondition.OFFLINE), 4096, ZoneOfflineError, errno.EIO),
        (errno.ETOOMANYREFS, _zone(ZoneCondition.EMPTY, 0), 0, TooManyOpenZones,
         errno.ETOOMANYREFS),
        (errno.EIO, _zone(ZoneCondition.IMPLICIT_OPEN, (1 << 20) - 4096), (1 << 20) - 4096,
         ZoneBoundaryError, errno.EIO),
        (errno.EOVERFLOW, _zone(ZoneCondition.EMPTY, 0), 0, TooManyOpenZones, errno.EOVERFLOW),
        (errno.ENOSPC, _zone(ZoneCondition.IMPLICIT_OPEN), 4096, ZoneError, errno.ENOSPC),
        (errno.EIO, None, 4096, ZoneError, errno.EIO),
    ],
)
def test_kernel_write_errors_become_typed_errors(
    err: int, zone: ZoneInfo | None, offset: int, expected: type, expected_errno: int
) -> None:
    exc = classify_write_error(OSError(err, "x"), zone, offset, 8192, "nullb0")
    assert type(exc) is expected
    assert exc.errno == expected_errno and exc.drive == "nullb0" and exc.offset == offset


def test_opening_a_regular_file_as_a_zoned_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(DriveFormatError, match="not a block device") as exc:
        linux.LinuxZonedDrive.open(tmp_path / "f")
    assert "smr:" in (exc.value.hint or "")
    with pytest.raises(DriveFormatError, match="does not exist"):
        linux.LinuxZonedDrive.open(tmp_path / "missing")


def test_opening_a_non_zoned_block_device_is_refused() -> None:
    device = "/dev/loop0"
    if not Path(device).exists() or Path("/sys/block/loop0/queue/zoned").read_text().strip() != (
            "none"):
        pytest.skip("needs /dev/loop0 as an ordinary block device")
    with pytest.raises(DriveFormatError, match="not a zoned device"):
        linux.LinuxZonedDrive.open(device)


def test_aligned_buffers_are_page_aligned() -> None:
    buf = linux.aligned_buffer(3 * 4096)
    view = memoryview(buf)
    assert linux.is_aligned(view, 4096)
    assert not linux.is_aligned(view[512:4608], 4096)
    assert not linux.is_aligned(view[:100], 4096)
    view.release()
    buf.close()


@pytest.fixture
def direct_loop_drive(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A LinuxZonedDrive wrapped around an ordinary loop device, all zones conventional.

    No zoned device exists here, but the O_DIRECT data path (alignment checks,
    aligned buffers passed straight through, bounce copies for the rest,
    vectored writes, flush) is the same code, so it runs on a loop device.
    """
    import os

    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("needs root and losetup to attach a loop device")
    backing = tmp_path / "backing.img"
    zone_size = 8 << 20
    with open(backing, "wb") as f:
        f.truncate(4 * zone_size)
    try:
        device = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True,
                                capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"losetup failed: {exc.stderr.strip()}")
    fd = os.open(device, os.O_RDWR | os.O_DIRECT)
    limits = linux.QueueLimits("none", zone_size // 512, 4, 0, 0, 512, 512)
    drive = linux.LinuxZonedDrive(device, fd, limits, zone_size, 4, "loop",
                                  conventional_zones=4)
    yield drive
    drive.close_drive()
    subprocess.run(["losetup", "-d", device], check=False)


def test_o_direct_writes_of_unaligned_memory_go_through_the_bounce_buffer(
    direct_loop_drive: linux.LinuxZonedDrive,
) -> None:
    d = direct_loop_drive
    payload = bytes(range(256)) * (linux.BOUNCE_SIZE // 256) + b"\x07" * (3 * 4096)  # > 1 bounce
    head = b"\x05" * 4096
    d.write(1, d.zone_start(1), [head, payload])  # bytes objects: not page aligned
    d.flush()
    assert d.read(d.zone_start(1), 4096 + len(payload)) == head + payload


def test_o_direct_aligned_buffers_pass_straight_through(
    direct_loop_drive: linux.LinuxZonedDrive,
) -> None:
    d = direct_loop_drive
    buf = linux.aligned_buffer(64 * 1024)
    buf[:] = b"\x42" * len(buf)
    with memoryview(buf) as view:
        d.write(2, d.zone_start(2) + 8192, view)
        into = linux.aligned_buffer(64 * 1024)
        with memoryview(into) as target:
            assert d.readinto(d.zone_start(2) + 8192, target) == len(buf)
        assert into[:] == buf[:]
        plain = bytearray(4096)  # an unaligned caller buffer is filled through the bounce
        d.readinto(d.zone_start(2) + 8192, memoryview(plain))
        assert bytes(plain) == b"\x42" * 4096
    into.close()
    buf.close()


def test_o_direct_io_keeps_the_alignment_and_boundary_rules(
    direct_loop_drive: linux.LinuxZonedDrive,
) -> None:
    from shinglefs.zoned.errors import OutOfRangeError, UnalignedIOError

    d = direct_loop_drive
    with pytest.raises(UnalignedIOError):
        d.write(0, 512, b"x" * 4096)
    with pytest.raises(ZoneBoundaryError):
        d.write(0, d.zone_size - 4096, b"x" * 8192)
    with pytest.raises(OutOfRangeError):
        d.read(d.capacity, 4096)
    d.start_trace()
    d.write(3, d.zone_start(3), b"t" * 4096)
    assert [(r.op, r.zone, r.length) for r in d.stop_trace()] == [("write", 3, 4096)]
