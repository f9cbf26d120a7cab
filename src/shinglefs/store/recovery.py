"""Recovery of a slice log when it is opened, and what it found: the ``RecoveryReport``.

After any crash a drive's state is rebuilt from the last good index
checkpoint, the zone generation table, the write pointers and the records
after the checkpoint (see docs/slice-log.md, "Recovery"). ``recover`` is called
by ``SliceLog.open`` only; the passes below each do one step of it.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from shinglefs.store.errors import StoreFormatError, StoreIOError
from shinglefs.store.record import (
    BLOCK,
    HEADER_BLOCK,
    RecordDecodeError,
    RecordHeader,
    RecordType,
    align_up,
    decode_header,
    verify_blocks,
)
from shinglefs.store.zones import ZoneRole, ZoneState
from shinglefs.zoned.errors import ZoneError
from shinglefs.zoned.model import ZoneCondition, ZoneInfo, ZoneType

if TYPE_CHECKING:
    from shinglefs.store.log import SliceLog

log = logging.getLogger("shinglefs.store")


class TailKind(enum.Enum):
    """Why a zone's log ends where it does (the first block that is not a valid record)."""

    ZEROS = "zeros"  # nothing was written there: the clean end of a log
    BAD_HEADER = "bad header"
    READ_ERROR = "read error"
    TORN = "torn"  # the record runs past the write pointer
    BAD_PAYLOAD = "bad payload"


@dataclass(frozen=True, slots=True)
class TailReason:
    """The kind of a log's end (decisions use it) and its text (reports show it)."""

    kind: TailKind
    text: str


@dataclass(frozen=True, slots=True)
class DiscardedTail:
    """Bytes of ``zone`` from ``offset`` to its write pointer that recovery threw away.

    ``reason`` says which check failed on the first bad record (bad magic,
    header crc, payload crc, a record running past the write pointer...). The
    zone was finished (made FULL) so nothing is ever written after garbage.
    """

    zone: int
    offset: int
    bytes: int
    reason: str


@dataclass(slots=True)
class RecoveryReport:
    """The outcome of opening a store: the checkpoint used, what was replayed and discarded."""

    drive: str
    checkpoint_number: int = 0
    checkpoint_seq: int = 0
    zones_scanned: int = 0
    records_replayed: int = 0
    bytes_replayed: int = 0
    records_skipped: int = 0
    discarded: list[DiscardedTail] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def discarded_bytes(self) -> int:
        return sum(d.bytes for d in self.discarded)

    @property
    def discarded_per_zone(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for d in self.discarded:
            out[d.zone] = out.get(d.zone, 0) + d.bytes
        return out

    @property
    def clean(self) -> bool:
        return not self.discarded and not self.notes

    def summary(self) -> str:
        text = (f"{self.drive}: checkpoint {self.checkpoint_number} (seq {self.checkpoint_seq}), "
                f"{self.zones_scanned} zones scanned, {self.records_replayed} records "
                f"({self.bytes_replayed} bytes) replayed")
        if self.discarded:
            text += (f", {self.discarded_bytes} bytes discarded in zones "
                     f"{sorted(self.discarded_per_zone)}")
        if self.records_skipped:
            text += f", {self.records_skipped} records skipped"
        return text


# ====================================================================== the recovery passes
# Recovery runs once, when a store is opened, with the log's ``io_lock`` held and
# before any reader exists: it works on the log's index and zone table directly.
#
#   load the checkpoint  ->  read the generation table  ->  scan each zone's log
#   after what the checkpoint covers  ->  replay the records found, in sequence
#   order  ->  adopt the GC copies set aside  ->  give the streams their zones back

Found = tuple[int, int, RecordHeader, "bytes | None"]  # (seq, device offset, header, tombstone ids)


@dataclass(frozen=True, slots=True)
class _Checkpointed:
    """What the loaded checkpoint says about each zone, and the last sequence it covers."""

    write_pointers: np.ndarray
    generations: np.ndarray
    covered_seq: int


def recover(slog: SliceLog) -> int:
    """Rebuild ``slog``'s index and zone table from the drive; returns the next sequence number.

    Raises ``StoreFormatError`` when no checkpoint is valid or its geometry
    does not match the drive. Fills ``slog.recovery_report``; never writes a
    record (the caller writes a fresh checkpoint afterwards).
    """
    t0 = time.perf_counter()
    report = slog.recovery_report
    ck = _load_checkpoint(slog, report)
    gens, valid = slog.area.read_generations()
    slog.z_gen[:] = np.where(valid, gens, ck.generations)
    bad_blocks = int((~valid).sum())
    if bad_blocks:
        report.notes.append(f"{bad_blocks} zone generation entries unreadable: those zones "
                            "were scanned from their start")
    found: list[Found] = []
    for info in slog.drive_call(slog.drive.report_zones):
        if info.index >= slog.first_seq_zone:
            _scan_zone_after_checkpoint(slog, info, ck, bool(valid[info.index]),
                                        int(gens[info.index]), found, report)
    found.sort(key=lambda f: f[0])
    max_seq = _replay(slog, found, ck.covered_seq, report)
    slog.zone_resets += int(np.where(valid, (gens - ck.generations).astype(np.int64), 0).sum())
    slog.reattach_streams()
    report.seconds = time.perf_counter() - t0
    level = logging.WARNING if report.discarded or report.records_skipped else logging.INFO
    log.log(level, "recovery: %s", report.summary())
    return max_seq + 1


def _load_checkpoint(slog: SliceLog, report: RecoveryReport) -> _Checkpointed:
    """Load the newest valid checkpoint into the index, the zone table and the counters."""
    ckpt, notes = slog.area.load_best()
    report.notes.extend(notes)
    if ckpt is None:
        raise StoreFormatError("no valid index checkpoint: not a slice store, or both "
                               "checkpoint slots are corrupt", drive=slog.name,
                               hint="check the drive path; a drive is made by `shinglefs format`")
    meta = ckpt.meta
    if meta.get("zone_size") != slog.zs or meta.get("zone_count") != slog.nz:
        raise StoreFormatError("checkpoint geometry does not match the drive", drive=slog.name)
    cols = ckpt.columns
    slog.index.load_columns({k: cols[k] for k in ("sid", "off", "len", "dev", "grp")},
                            meta["groups"])
    slog.z_role[:] = cols["z_role"]
    slog.z_group[:] = cols["z_group"]
    slog.z_lastb[:] = cols["z_lastb"]
    slog.z_lastseq[:] = cols["z_lastseq"]
    slog.user_bytes = meta["user_bytes"]
    slog.device_bytes = meta["device_bytes"]
    slog.gc_bytes = meta["gc_bytes"]
    slog.zone_resets = meta["zone_resets"]
    slog.evictions = meta["evictions"]
    slog.checkpoint_bytes_base = meta["checkpoint_bytes"]
    slog.ckpt_number = ckpt.number
    slot_covered = [ckpt.covered_seq, ckpt.covered_seq]
    for number, covered in slog.area.slot_numbers():
        slot_covered[number % 2] = covered
    slog.slot_covered = [min(c, ckpt.covered_seq) for c in slot_covered]
    report.checkpoint_number = ckpt.number
    report.checkpoint_seq = ckpt.covered_seq
    return _Checkpointed(cols["z_wp"].astype(np.int64), cols["z_gen"].astype(np.uint32),
                         ckpt.covered_seq)


def _scan_zone_after_checkpoint(slog: SliceLog, info: ZoneInfo, ck: _Checkpointed,
                                gen_valid: bool, gen: int, found: list[Found],
                                report: RecoveryReport) -> None:
    """Scan one sequential zone from where the checkpoint left it (its start if it was
    reset since) to its write pointer, and set its state from what was found."""
    z = info.index
    start = info.start
    if slog.wp_emulated:
        # No write pointer: scan to the first invalid record (zeros end the log).
        info = ZoneInfo(z, start, slog.zs, slog.zs, start + slog.zs,
                        ZoneType.SEQUENTIAL_WRITE_REQUIRED, ZoneCondition.CLOSED)
    slog.z_wp[z] = info.write_pointer
    if info.condition == ZoneCondition.OFFLINE:
        slog.z_state[z] = ZoneState.BAD
        if slog.index.zone_live[z]:
            report.notes.append(f"zone {z} is offline: {int(slog.index.zone_live[z])} "
                                "live bytes cannot be read")
        return
    reset_since = (not gen_valid) or gen != ck.generations[z]
    scan_from = start if reset_since else int(ck.write_pointers[z])
    if reset_since:
        slog.z_role[z] = ZoneRole.NONE
    if slog.wp_emulated:
        slog.z_wp[z] = scan_from  # until the scan finds records
    if info.write_pointer < scan_from:
        report.notes.append(
            f"zone {z}: write pointer {info.write_pointer} is behind the checkpoint's "
            f"{scan_from}; its newer records are lost")
        scan_from = info.write_pointer
    if info.write_pointer > scan_from:
        report.zones_scanned += 1
        _scan_zone(slog, z, scan_from, info.write_pointer, found, report)
    if info.condition == ZoneCondition.READ_ONLY:
        slog.z_state[z] = ZoneState.BAD
    elif slog.z_wp[z] == start:
        slog.z_state[z] = ZoneState.EMPTY
    else:
        slog.z_state[z] = ZoneState.SEALED
    if info.condition.is_open:
        try:
            slog.zone_close(z)
        except ZoneError:
            pass


def _replay(slog: SliceLog, found: list[Found], covered: int, report: RecoveryReport) -> int:
    """Apply the records after the checkpoint, in sequence order; returns the last sequence seen.

    Extents that do not continue what the index knows of their slice yet are
    set aside: GC copies whose originals were in a zone collected (reset)
    since the checkpoint, and records that follow such copies. Copies carry
    newer sequence numbers than what they copied, so a slice's extents arrive
    out of offset order; they are added once the pass has seen them all.
    """
    max_seq = covered
    adopted: dict[int, list[tuple[int, int, int, int]]] = {}
    index = slog.index
    for seq, dev, header, ids in found:
        max_seq = max(max_seq, seq)
        z = dev // slog.zs
        slog.z_lastseq[z] = max(int(slog.z_lastseq[z]), seq)
        if seq <= covered:
            continue
        slog.device_bytes += header.footprint
        slog.z_lastb[z] = slog.device_bytes
        report.records_replayed += 1
        report.bytes_replayed += header.length
        if header.type == RecordType.DATA:
            _replay_data(slog, header, dev, adopted)
        elif header.type == RecordType.TOMBSTONE and ids is not None:
            for sid in np.frombuffer(ids, np.uint64).tolist():
                index.remove(sid)
                adopted.pop(sid, None)
        elif header.type == RecordType.GROUP_DELETE:
            index.remove_group(header.group)
            for sid in [s for s, ext in adopted.items() if ext[0][3] == header.group]:
                del adopted[sid]
    _adopt_gc_copies(slog, adopted, report)
    return max_seq


def _replay_data(slog: SliceLog, header: RecordHeader, dev: int,
                 adopted: dict[int, list[tuple[int, int, int, int]]]) -> None:
    """Index one data record, or set it aside in ``adopted`` when it does not continue its slice."""
    index = slog.index
    piece = (header.slice_offset, header.length, dev, header.group)
    if header.is_gc_copy:
        slog.gc_bytes += header.length
        if not index.relocate(header.slice_id, header.slice_offset, None, dev):
            adopted.setdefault(header.slice_id, []).append(piece)
        return
    slog.user_bytes += header.length
    current = index.length(header.slice_id) or 0
    if header.slice_offset < current:
        # A piece rewritten after a failed write: the newer record wins.
        index.truncate(header.slice_id, header.slice_offset)
        current = index.length(header.slice_id) or 0
    if header.slice_offset != current:
        adopted.setdefault(header.slice_id, []).append(piece)
        return
    index.add(header.slice_id, header.slice_offset, header.length, dev, header.group)


def _adopt_gc_copies(slog: SliceLog, adopted: dict[int, list[tuple[int, int, int, int]]],
                     report: RecoveryReport) -> None:
    """Index the extents set aside by the replay, in offset order: what
    continues each slice is added, the rest is reported and dropped."""
    for sid, extents in adopted.items():
        for off, length, dev, group in sorted(extents):
            current = slog.index.length(sid) or 0
            if off < current:
                continue  # copied twice (a later collection): one is enough
            if off != current:
                report.records_skipped += 1
                report.notes.append(f"slice {sid:#x}: record at offset {off} (zone "
                                    f"{dev // slog.zs}) does not continue the slice; "
                                    "dropped")
                break
            slog.index.add(sid, off, length, dev, group)


def _check_record(slog: SliceLog, pos: int, wp: int,
                  head: bytearray) -> tuple[RecordHeader | None, bytearray | None, TailReason | None]:
    """Read and verify the record at ``pos``: its header, its payload, or why it is not one."""
    try:
        slog.read_raw(pos, memoryview(head))
        header = decode_header(head)
    except RecordDecodeError as exc:
        kind = TailKind.ZEROS if exc.zeros else TailKind.BAD_HEADER
        return None, None, TailReason(kind, f"record header: {exc}")
    except StoreIOError as exc:
        return None, None, TailReason(TailKind.READ_ERROR, f"read error: {exc}")
    if pos + header.footprint > wp:
        return header, None, TailReason(TailKind.TORN,
                                        "record runs past the write pointer (torn write)")
    buf = bytearray(align_up(header.length))
    view = memoryview(buf)
    try:
        slog.read_raw(pos + HEADER_BLOCK, view)
    except StoreIOError as exc:
        return header, None, TailReason(TailKind.READ_ERROR, f"read error: {exc}")
    bad = verify_blocks(header, view[: header.length], 0)
    if bad is not None:
        return header, None, TailReason(TailKind.BAD_PAYLOAD,
                                        f"payload crc mismatch at payload byte {bad}")
    return header, buf, None


def _scan_zone(slog: SliceLog, z: int, pos: int, wp: int, found: list[Found],
               report: RecoveryReport) -> None:
    """Collect the valid records of zone ``z`` in ``[pos, wp)``; the first bad one ends the zone."""
    head = bytearray(HEADER_BLOCK)
    first = pos
    while pos < wp:
        header, buf, reason = _check_record(slog, pos, wp, head)
        if reason is not None and slog.wp_emulated:
            _end_emulated_zone(slog, z, pos, reason, header, report)
            return
        if reason is not None and reason.kind == TailKind.ZEROS and wp == slog.zone_start(z) + slog.zs:
            return  # a zone finished with room left (LogZones._seal): its unwritten end
        if reason is not None:
            report.discarded.append(DiscardedTail(z, pos, wp - pos, reason.text))
            log.warning("recovery: zone %d of %s: discarding %d bytes from %d: %s",
                        z, slog.name, wp - pos, pos, reason.text)
            try:
                slog.zone_finish(z)
            except ZoneError as exc:
                report.notes.append(f"zone {z}: finish failed: {exc}")
            slog.z_wp[z] = (z + 1) * slog.zs
            return
        assert header is not None and buf is not None
        ids = bytes(buf[: header.length]) if header.type == RecordType.TOMBSTONE else None
        found.append((header.seq, pos, header, ids))
        if pos == first and first == slog.zone_start(z):
            if header.type == RecordType.DATA:
                slog.z_role[z] = ZoneRole.GC if header.is_gc_copy else ZoneRole.DATA
                slog.z_group[z] = header.group
            else:
                slog.z_role[z] = ZoneRole.META
        pos += header.footprint
        if slog.wp_emulated:
            slog.z_wp[z] = pos


def _end_emulated_zone(slog: SliceLog, z: int, pos: int, reason: TailReason,
                       header: RecordHeader | None, report: RecoveryReport) -> None:
    """The end of a zone's log on a drive without write pointers.

    Zeros are the clean end; anything else (a torn or corrupt record) is
    reported. Either way the rest of the zone is zeroed, so no later scan
    can mistake what lies beyond the end for records.
    """
    slog.z_wp[z] = pos
    end = slog.zone_start(z) + slog.zs
    if reason.kind != TailKind.ZEROS:
        claimed = min(header.footprint, end - pos) if header is not None else BLOCK
        report.discarded.append(DiscardedTail(z, pos, claimed, reason.text))
        log.warning("recovery: zone %d of %s: discarding the record at %d: %s", z,
                    slog.name, pos, reason.text)
    if pos < end:
        # Unflushed blocks may have landed out of order: clear the rest of the zone.
        slog.drive_call(slog.drive.discard, pos, end - pos)
