"""Stateful test: the emulated drive against a small independent model, with power cuts.

The model keeps, per sequential zone, its blocks (one seed byte a block), its
condition, the least-recently-written order of implicitly open zones and the
durable write pointer; per conventional block, its value and whether it was
written since the last flush. Every step compares the whole drive with it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shinglefs.zoned.emulated import EmulatedZonedDrive
from shinglefs.zoned.errors import (
    TooManyOpenZones,
    WritePointerViolation,
    ZoneBoundaryError,
    ZoneFullError,
)
from shinglefs.zoned.model import ZoneCondition

BS = 4096
ZONE_BLOCKS = 8
ZONES = 6
CONV = 1
MAX_OPEN = 2
C = ZoneCondition

seq_zones = st.integers(CONV, ZONES - 1)


def block(seed: int) -> bytes:
    return bytes([seed]) * BS


class SeqZone:
    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.cond = C.EMPTY
        self.durable = 0


class EmulatedDriveMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="shinglefs-model-"))
        self.path = self.dir / "d.img"
        self.drive = EmulatedZonedDrive.create(
            self.path, zone_size=ZONE_BLOCKS * BS, zone_count=ZONES, conventional_zones=CONV,
            max_open_zones=MAX_OPEN,
        )
        self.zones = {z: SeqZone() for z in range(CONV, ZONES)}
        self.implicit: list[int] = []  # least recently written first
        self.explicit: set[int] = set()
        self.conv = [0] * (CONV * ZONE_BLOCKS)
        self.conv_dirty: set[int] = set()
        self.last_write: tuple[int, int, int] | None = None  # zone, first block, end block

    def teardown(self) -> None:
        try:
            self.drive.close_drive()
        except Exception:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- model helpers -----------------------------------------------------------------
    def _release(self, z: int) -> None:
        if z in self.implicit:
            self.implicit.remove(z)
        self.explicit.discard(z)

    def _closed(self, z: int) -> ZoneCondition:
        return C.EMPTY if not self.zones[z].blocks else C.CLOSED

    def _take(self, z: int) -> bool:
        if len(self.implicit) + len(self.explicit) < MAX_OPEN:
            return True
        victims = [v for v in self.implicit if v != z]
        if not victims:
            return False
        self._release(victims[0])
        self.zones[victims[0]].cond = self._closed(victims[0])
        return True

    # -- rules ---------------------------------------------------------------------------
    @rule(z=seq_zones, n=st.integers(1, 4), seed=st.integers(1, 255))
    def append(self, z: int, n: int, seed: int) -> None:
        zone = self.zones[z]
        data = [block(seed)] * n
        if zone.cond is C.FULL:
            expected: type | None = ZoneFullError
        elif len(zone.blocks) + n > ZONE_BLOCKS:
            expected = ZoneBoundaryError
        elif zone.cond in (C.EMPTY, C.CLOSED) and not self._take(z):
            expected = TooManyOpenZones
        else:
            expected = None
        if expected is not None:
            try:
                self.drive.append(z, data)
            except expected:
                return
            raise AssertionError(f"append to zone {z} should raise {expected.__name__}")
        offset = self.drive.append(z, data)
        first = len(zone.blocks)
        assert offset == (z * ZONE_BLOCKS + first) * BS
        zone.blocks += [seed] * n
        if zone.cond in (C.EMPTY, C.CLOSED):
            zone.cond = C.IMPLICIT_OPEN
            self.implicit.append(z)
        elif zone.cond is C.IMPLICIT_OPEN:
            self.implicit.remove(z)
            self.implicit.append(z)
        if len(zone.blocks) == ZONE_BLOCKS:
            self._release(z)
            zone.cond = C.FULL
        self.last_write = (z, first, first + n)

    @rule(z=seq_zones, delta=st.sampled_from([-1, 1, 2]))
    def write_off_the_pointer(self, z: int, delta: int) -> None:
        zone = self.zones[z]
        block_index = len(zone.blocks) + delta
        if not 0 <= block_index < ZONE_BLOCKS or zone.cond is C.FULL:
            return
        try:
            self.drive.write(z, (z * ZONE_BLOCKS + block_index) * BS, block(7))
        except WritePointerViolation:
            return
        raise AssertionError("a write off the write pointer succeeded")

    @rule(b=st.integers(0, CONV * ZONE_BLOCKS - 1), seed=st.integers(1, 255))
    def write_conventional(self, b: int, seed: int) -> None:
        self.drive.write(b // ZONE_BLOCKS, b * BS, block(seed))
        self.conv[b] = seed
        self.conv_dirty.add(b)
        self.last_write = (b // ZONE_BLOCKS, b % ZONE_BLOCKS, b % ZONE_BLOCKS + 1)

    @rule(z=seq_zones)
    def open(self, z: int) -> None:
        zone = self.zones[z]
        if zone.cond is C.FULL:
            try:
                self.drive.open(z)
            except ZoneFullError:
                return
            raise AssertionError("OPEN of a FULL zone succeeded")
        if zone.cond is C.EXPLICIT_OPEN:
            self.drive.open(z)
            return
        if zone.cond is C.IMPLICIT_OPEN:
            self.implicit.remove(z)
        elif not self._take(z):
            try:
                self.drive.open(z)
            except TooManyOpenZones:
                return
            raise AssertionError("OPEN past the limit succeeded")
        self.drive.open(z)
        self.explicit.add(z)
        zone.cond = C.EXPLICIT_OPEN

    @rule(z=seq_zones)
    def close(self, z: int) -> None:
        self.drive.close(z)
        if self.zones[z].cond.is_open:
            self._release(z)
            self.zones[z].cond = self._closed(z)

    @rule(z=seq_zones)
    def finish(self, z: int) -> None:
        self.drive.finish(z)
        zone = self.zones[z]
        self._release(z)
        zone.blocks += [0] * (ZONE_BLOCKS - len(zone.blocks))
        zone.cond = C.FULL

    @rule(z=seq_zones)
    def reset(self, z: int) -> None:
        self.drive.reset(z)
        self._release(z)
        self.zones[z] = SeqZone()  # durable at once: durable pointer 0
        if self.last_write is not None and self.last_write[0] == z:
            self.last_write = None

    @rule()
    def flush(self) -> None:
        self.drive.flush()
        for zone in self.zones.values():
            zone.durable = len(zone.blocks)
        self.conv_dirty.clear()
        self.last_write = None

    @rule(torn=st.booleans(), keep=st.integers(0, 4))
    def power_cut_and_reopen(self, torn: bool, keep: int) -> None:
        self.drive.simulate_power_cut(torn=torn, keep_blocks=keep)
        kept: tuple[int, int, int] | None = None
        if torn and self.last_write is not None:
            z, first, end = self.last_write
            kept = (z, first, min(end, first + keep))
        for z, zone in self.zones.items():
            length = zone.durable
            if kept is not None and kept[0] == z:
                length = kept[2]
            del zone.blocks[length:]
            zone.durable = length
            zone.cond = C.EMPTY if length == 0 else C.FULL if length == ZONE_BLOCKS else C.CLOSED
        for b in self.conv_dirty:
            z, i = divmod(b, ZONE_BLOCKS)
            if kept is None or kept[0] != z or not kept[1] <= i < kept[2]:
                self.conv[b] = 0
        self.conv_dirty.clear()
        self.implicit.clear()
        self.explicit.clear()
        self.last_write = None
        self.drive = EmulatedZonedDrive.open(self.path)

    @rule()
    def process_crash_and_reopen(self) -> None:
        """Unflushed sequential bytes vanish behind the pointers; conventional ones stay."""
        self.drive.simulate_process_crash()
        for zone in self.zones.values():
            del zone.blocks[zone.durable:]
            n = len(zone.blocks)
            zone.cond = C.EMPTY if n == 0 else C.FULL if n == ZONE_BLOCKS else C.CLOSED
        self.conv_dirty.clear()  # a later power cut finds them in the file: durable enough
        self.implicit.clear()
        self.explicit.clear()
        self.last_write = None
        self.drive = EmulatedZonedDrive.open(self.path)

    @rule()
    def clean_close_and_reopen(self) -> None:
        self.drive.close_drive()  # flushes
        self.flush_model_only()
        for z, zone in self.zones.items():
            if zone.cond.is_open:
                zone.cond = self._closed(z)
        self.implicit.clear()
        self.explicit.clear()
        self.drive = EmulatedZonedDrive.open(self.path)

    def flush_model_only(self) -> None:
        for zone in self.zones.values():
            zone.durable = len(zone.blocks)
        self.conv_dirty.clear()
        self.last_write = None

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def drive_matches_model(self) -> None:
        infos = self.drive.report_zones()
        for z, zone in self.zones.items():
            info = infos[z]
            assert info.condition is zone.cond, (z, info.condition, zone.cond)
            assert info.written == len(zone.blocks) * BS, (z, info.written, zone.blocks)
            expected = b"".join(block(s) for s in zone.blocks) + bytes(
                (ZONE_BLOCKS - len(zone.blocks)) * BS)
            assert self.drive.read(z * ZONE_BLOCKS * BS, ZONE_BLOCKS * BS) == expected
        conv = b"".join(block(s) for s in self.conv)
        assert self.drive.read(0, len(conv)) == conv
        imp, exp = self.drive.open_zone_count()
        assert (imp, exp) == (len(self.implicit), len(self.explicit))


EmulatedDriveMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_emulated_drive_matches_model = EmulatedDriveMachine.TestCase


class LongEmulatedDriveMachine(EmulatedDriveMachine):
    """The same machine, many more and longer runs (``make test-all``)."""


LongEmulatedDriveMachine.TestCase.settings = settings(
    max_examples=1500, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_emulated_drive_matches_model_soak = pytest.mark.slow(LongEmulatedDriveMachine.TestCase)
