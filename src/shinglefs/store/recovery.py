"""What recovery found when a store was opened: the ``RecoveryReport``."""

from __future__ import annotations

from dataclasses import dataclass, field


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
