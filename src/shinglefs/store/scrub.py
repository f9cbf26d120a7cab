"""Scrub: read every stored slice of one drive and verify its checksums.

``scrub_drive`` walks the drive's zones in order and, in each, the live
extents in device order, reading each one through the store's own verified
read path (header crc, every 256 KiB block crc; ``SliceStore.readinto``), so
a slice moved by GC meanwhile is read where it now lives and a reset zone is
never misread. A slice whose bytes fail is reported once, by id; mapping it to
files is the caller's business (``shinglefs.client.recovery``).

Resumable: the position (the device offset up to which every extent was
verified) and the damaged slices found so far are saved in a small JSON state
file every ``SAVE_INTERVAL_S`` and at the end of each zone (written to a
temporary name and renamed); a scrub that starts with a state file continues
from its position. A finished scrub removes the state file.

Rate-limited: ``rate_bytes`` per second at most (``RateLimit``: sleeping before
an extent until its turn).
"""

from __future__ import annotations

import json
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shinglefs.store.api import MAX_SLICE_SIZE
from shinglefs.store.errors import ChecksumMismatch, SliceNotFound, StoreIOError
from shinglefs.store.slice_store import SliceStore

SAVE_INTERVAL_S = 2.0
Progress = Callable[[int], None]  # bytes verified since the last call


@dataclass
class ScrubState:
    """Where a drive's scrub stands: the device offset verified up to, the bytes
    read, and the damaged slices found (slice id -> what failed)."""

    position: int = 0
    bytes_read: int = 0
    damaged: dict[int, str] = field(default_factory=dict)
    started_ns: int = field(default_factory=time.time_ns)
    finished: bool = False

    @classmethod
    def load(cls, path: Path) -> ScrubState:
        """The saved state at ``path``, or a fresh one (absent or unreadable file)."""
        try:
            raw = json.loads(path.read_text())
            return cls(int(raw["position"]), int(raw["bytes_read"]),
                       {int(k): str(v) for k, v in raw["damaged"].items()},
                       int(raw["started_ns"]))
        except (OSError, ValueError, KeyError, TypeError):
            return cls()

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({
            "position": self.position, "bytes_read": self.bytes_read,
            "damaged": {str(k): v for k, v in self.damaged.items()},
            "started_ns": self.started_ns}))
        os.replace(tmp, path)


class RateLimit:
    """Paces reads to at most ``rate`` bytes per second: ``wait`` before a read
    until its turn, ``spend`` after it. No credit builds up while idle (the next
    read's turn is never earlier than the previous read's start plus its bytes
    at ``rate``), so one ``RateLimit`` kept across calls (a storage server's
    scrub requests of one drive) keeps the rate across them. ``rate`` None or 0:
    no limit."""

    POLL_S = 0.25  # a wait re-asks ``stop`` this often

    def __init__(self, rate_bytes: float | None) -> None:
        self.rate = rate_bytes
        self.next_at = time.monotonic()
        self._started = self.next_at

    def wait(self, stop: Callable[[], bool] | None = None) -> bool:
        """Sleep until the next read's turn; False when ``stop()`` became true first."""
        if not self.rate:
            return True
        while (ahead := self.next_at - time.monotonic()) > 0:
            if stop is not None and stop():
                return False
            time.sleep(min(ahead, self.POLL_S))
        self._started = time.monotonic()
        return True

    def spend(self, nbytes: int) -> None:
        """Account a read of ``nbytes`` that started at the last ``wait``'s return."""
        if self.rate:
            self.next_at = max(self.next_at, self._started) + nbytes / self.rate


def _verify(store: SliceStore, sid: int, off: int, length: int, buf: memoryview) -> str | None:
    """None if ``[off, off + length)`` of the slice reads back verified, else why not."""
    try:
        store.readinto(sid, off, buf[:length])
    except ChecksumMismatch as exc:
        return str(exc)
    except SliceNotFound:
        return None  # deleted meanwhile: nothing left to verify
    except StoreIOError as exc:
        return f"read error: {exc}"
    return None


def scrub_drive(store: SliceStore, state_path: Path, *, rate_bytes: float | None = None,
                progress: Progress | None = None,
                stop: Callable[[], bool] | None = None,
                limit: RateLimit | None = None) -> ScrubState:
    """Verify every live extent of ``store``'s drive from the saved position on.

    Returns the final state (``finished`` unless ``stop()`` became true, in
    which case the position is saved for the next run; ``stop`` is asked
    before each extent and while waiting for the rate). ``limit``: a
    ``RateLimit`` to pace by instead of a fresh one of ``rate_bytes`` (kept by
    a caller that scrubs one drive in several calls). Never modifies the
    drive; a damaged slice stays where it is (the caller decides). Raises
    ``OSError`` when the state file cannot be written.
    """
    log = store.slice_log
    state = ScrubState.load(state_path)
    limit = limit if limit is not None else RateLimit(rate_bytes)
    # Page-aligned: a drive that reads around the page cache (an emulated one,
    # docs/drives.md) verifies the bytes on the medium, not a cached copy, and
    # a scrub of a whole drive evicts nothing from the page cache.
    buf = memoryview(mmap.mmap(-1, MAX_SLICE_SIZE))
    saved = time.monotonic()
    for zone in range(log.first_seq_zone, log.nz):
        if (zone + 1) * log.zs <= state.position:
            continue
        for sid, off, length, dev, _group in sorted(log.live_extents(zone), key=lambda e: e.dev):
            if dev < state.position or sid in state.damaged:
                continue
            if (stop is not None and stop()) or not limit.wait(stop):
                state.save(state_path)
                return state
            why = _verify(store, sid, off, length, buf)
            if why is not None:
                state.damaged[sid] = why
            state.position = dev + 1
            state.bytes_read += length
            limit.spend(length)
            if progress is not None:
                progress(length)
            if time.monotonic() - saved > SAVE_INTERVAL_S:
                state.save(state_path)
                saved = time.monotonic()
        state.position = max(state.position, (zone + 1) * log.zs)
        state.save(state_path)
    limit.wait(stop)  # the last extent's time at the rate, too (a stop cuts it short)
    state.finished = True
    state_path.unlink(missing_ok=True)
    return state


def live_bytes(store: SliceStore) -> int:
    """Bytes a full scrub of the drive reads (for a progress bar's total)."""
    return store.stats().live_bytes
