"""``shinglefs bench store``: slice put/get throughput against the raw disk, and write amplification.

Baselines, measured in the same run on the same file system with the same
sizes: raw sequential write is the faster of O_DIRECT writes and buffered
writes with a final fsync; raw sequential read is the faster of O_DIRECT and
buffered reads after dropping the page cache (``/proc/sys/vm/drop_caches``
when root, else ``posix_fadvise(DONTNEED)``). The store writes and reads the
same bytes as 8 MiB slices on an emulated drive in the same directory; its
reads start with a cold cache too. The O_DIRECT read runs after both the
store's and the buffered raw read, so each side has the same amount of other
I/O between writing its bytes and reading them back. Every figure is the median of
``repeats`` runs (8; quick 6), alternating which of store and raw goes
first; the raw rate is the faster method's median. Whichever goes first in a
repeat is faster on a shared VM, so each ratio is the geometric mean of the
per-repeat ratios over equally many repeats of each order (the ratio of the
medians is reported too).

Write amplification: ``waf_append`` is device bytes / user bytes of the put
workload (append only). ``waf_churn`` runs 20 rounds of 8 lifetime groups of
128 MiB each (one writer thread a group), keeping the last 3 rounds (deleting
round r-3's groups), on a drive far smaller than what is written, so zones
are reset many times; with groups mapped to zones no GC copy is needed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive

MiB = 1024 * 1024
SLICE = 8 * MiB


def drop_cache(path: Path) -> None:
    """Evict ``path`` from the page cache (and everything, when root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        pass
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _aligned(n: int) -> mmap.mmap:
    return mmap.mmap(-1, n)  # page aligned, as O_DIRECT needs


def raw_write(path: Path, total: int, data: memoryview) -> dict[str, float]:
    """Buffered+fsync and O_DIRECT sequential write rates, MiB/s (0 where unsupported)."""
    rates = {"buffered": 0.0, "direct": 0.0}
    for direct in (False, True):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        flags = os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if direct else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError:
            continue  # no O_DIRECT on this file system
        buf: Any = data
        if direct:
            buf = _aligned(len(data))
            buf[:] = data
        try:
            t = time.perf_counter()
            pos = 0
            while pos < total:
                pos += os.pwrite(fd, buf, pos)
            os.fsync(fd)
            rates["direct" if direct else "buffered"] = total / MiB / (time.perf_counter() - t)
        except OSError:
            pass
        finally:
            os.close(fd)
            if direct:
                buf.close()
    return rates


def raw_read(path: Path, total: int,
             methods: tuple[str, ...] = ("buffered", "direct")) -> dict[str, float]:
    """Buffered and/or O_DIRECT sequential read rates from a cold cache, MiB/s."""
    rates = {"buffered": 0.0, "direct": 0.0}
    for direct in (False, True):
        if ("direct" if direct else "buffered") not in methods:
            continue
        drop_cache(path)
        try:
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        except OSError:
            continue
        buf: Any = _aligned(SLICE) if direct else bytearray(SLICE)
        try:
            t = time.perf_counter()
            pos = 0
            while pos < total:
                n = os.preadv(fd, [buf], pos)
                if n <= 0:
                    break
                pos += n
            rates["direct" if direct else "buffered"] = pos / MiB / (time.perf_counter() - t)
        except OSError:
            pass
        finally:
            os.close(fd)
            if direct:
                buf.close()
    return rates


class StorePutGet:
    """One emulated drive holding ``total`` bytes as 8 MiB slices: timed put, then timed get."""

    def __init__(self, workdir: Path, total: int, data: memoryview) -> None:
        zone = 256 * MiB
        self.path = workdir / "put.drive"
        self.total = total
        self.data = data
        self.drive = EmulatedZonedDrive.create(
            str(self.path), zone_size=zone, zone_count=total // zone + 8, conventional_zones=2
        )
        self.store = SliceStore.format(self.drive, gc_background=False)

    def put(self) -> float:
        os.sync()
        n = self.total // SLICE
        t = time.perf_counter()
        futures = [self.store.submit(i, 0, self.data, group=1) for i in range(n)]
        for f in futures:
            f.result()
        self.store.flush()
        return self.total / MiB / (time.perf_counter() - t)

    def get(self) -> float:
        drop_cache(self.path)
        buf = bytearray(SLICE)
        t = time.perf_counter()
        for i in range(self.total // SLICE):
            self.store.readinto(i, 0, buf)
        rate = self.total / MiB / (time.perf_counter() - t)
        if buf != self.data:
            raise AssertionError("store returned wrong bytes")
        return rate

    def close(self) -> float:
        waf = self.store.stats().write_amplification
        self.store.close()
        self.drive.close_drive()
        self.path.unlink()
        Path(str(self.path) + ".zones").unlink()
        return waf


def churn(workdir: Path, quick: bool, data: memoryview) -> dict[str, Any]:
    """20 rounds x 8 groups x group_bytes, keep the last 3 rounds; returns WAF and GC bytes."""
    rounds, groups = 20, 8
    group_bytes = 16 * MiB if quick else 128 * MiB
    zone = 32 * MiB if quick else 256 * MiB
    zones = 40 + 2  # far below rounds * groups * group_bytes / zone (80 zones)
    path = workdir / "churn.drive"
    drive = EmulatedZonedDrive.create(
        str(path), zone_size=zone, zone_count=zones, conventional_zones=2
    )
    store = SliceStore.format(drive)
    piece = 4 * MiB
    try:
        t = time.perf_counter()
        for rnd in range(rounds):

            def writer(g: int, rnd: int = rnd) -> None:
                group = rnd * 100 + g
                futures = []
                for k in range(group_bytes // SLICE):
                    sid = group * 1000 + k
                    for off in range(0, SLICE, piece):
                        futures.append(store.submit(sid, off, data[off : off + piece], group))
                for f in futures:
                    f.result()

            threads = [threading.Thread(target=writer, args=(g,)) for g in range(groups)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            store.flush()  # the round (a checkpoint step) is committed
            if rnd >= 3:
                for g in range(groups):
                    store.delete_group((rnd - 3) * 100 + g)
        store.flush()
        seconds = time.perf_counter() - t
        stats = store.stats()
    finally:
        store.close()
        drive.close_drive()
        path.unlink()
        Path(str(path) + ".zones").unlink()
    return {
        "waf_churn": round(stats.write_amplification, 4),
        "gc_bytes_copied_churn": stats.gc_bytes_copied,
        "zone_resets_churn": stats.zone_resets,
        "churn_user_gib": round(stats.user_bytes_written / 1024**3, 2),
        "churn_drive_gib": round(zones * zone / 1024**3, 2),
        "churn_mib_s": round(stats.user_bytes_written / MiB / seconds, 1),
        "group_zone_evictions_churn": stats.group_zone_evictions,
    }


def _balanced(ratios: list[float]) -> float:
    """Geometric mean over equally many raw-first (even) and store-first (odd) repeats."""
    pairs = len(ratios) // 2
    used = ratios[: 2 * pairs] if pairs else ratios
    return float(np.exp(np.mean(np.log(used))))


def run(quick: bool, workdir: Path, **options: Any) -> dict:
    total = int(options.get("total_bytes", (256 if quick else 2048) * MiB))
    repeats = int(options.get("repeats", 6 if quick else 8))
    workdir.mkdir(parents=True, exist_ok=True)
    data = memoryview(np.random.default_rng(1).integers(0, 256, SLICE, np.uint8).tobytes())
    raw_w: list[dict[str, float]] = []
    raw_r: list[dict[str, float]] = []
    put: list[float] = []
    get: list[float] = []
    waf: list[float] = []
    raw_path = workdir / "raw.bin"
    for rep in range(repeats):
        # Alternate which goes first, so drifting machine load biases neither.
        trial = StorePutGet(workdir, total, data)
        try:
            # The O_DIRECT read comes last either way: between each side's write and its
            # read lies the other side's write or buffered read, never 2 GiB more I/O for
            # one side only (a VM's host cache makes reads of recent writes faster).
            if rep % 2:
                put.append(trial.put())
                os.sync()
                raw_w.append(raw_write(raw_path, total, data))
                get.append(trial.get())
                rates = raw_read(raw_path, total, ("buffered",))
            else:
                os.sync()
                raw_w.append(raw_write(raw_path, total, data))
                put.append(trial.put())
                rates = raw_read(raw_path, total, ("buffered",))
                get.append(trial.get())
            rates["direct"] = raw_read(raw_path, total, ("direct",))["direct"]
            raw_r.append(rates)
        finally:
            waf.append(trial.close())
            with contextlib.suppress(FileNotFoundError):
                raw_path.unlink()
    med = statistics.median
    # The faster raw method, judged by its median (not the max of noisy samples). On a
    # shared VM whichever of store and raw runs first in a repeat is measurably faster, so
    # a ratio is the geometric mean of per-repeat ratios over equally many repeats of each
    # order, which cancels that bias; the ratio of the medians is reported beside it.
    wm = max(("buffered", "direct"), key=lambda m: med(r[m] for r in raw_w))
    rm = max(("buffered", "direct"), key=lambda m: med(r[m] for r in raw_r))
    raw_write_rate = med(r[wm] for r in raw_w)
    raw_read_rate = med(r[rm] for r in raw_r)
    put_ratios = [p / r[wm] for p, r in zip(put, raw_w, strict=True)]
    get_ratios = [g / r[rm] for g, r in zip(get, raw_r, strict=True)]
    result: dict[str, Any] = {
        "slice_mib": SLICE // MiB,
        "total_mib": total // MiB,
        "repeats": repeats,
        "put_mib_s": round(med(put), 1),
        "get_mib_s": round(med(get), 1),
        "raw_write_mib_s": round(raw_write_rate, 1),
        "raw_read_mib_s": round(raw_read_rate, 1),
        "raw_write_buffered_mib_s": round(med(r["buffered"] for r in raw_w), 1),
        "raw_write_direct_mib_s": round(med(r["direct"] for r in raw_w), 1),
        "raw_read_buffered_mib_s": round(med(r["buffered"] for r in raw_r), 1),
        "raw_read_direct_mib_s": round(med(r["direct"] for r in raw_r), 1),
        "put_ratio": round(_balanced(put_ratios), 3),
        "get_ratio": round(_balanced(get_ratios), 3),
        "put_ratio_of_medians": round(med(put) / raw_write_rate, 3),
        "get_ratio_of_medians": round(med(get) / raw_read_rate, 3),
        "put_ratios": [round(x, 2) for x in put_ratios],
        "get_ratios": [round(x, 2) for x in get_ratios],
        # Per repeat, in run order (even repeats: raw first), to tell noise from a trend.
        "put_mib_s_runs": [round(x) for x in put],
        "raw_write_mib_s_runs": [round(r[wm]) for r in raw_w],
        "get_mib_s_runs": [round(x) for x in get],
        "raw_read_mib_s_runs": [round(r[rm]) for r in raw_r],
        "waf_append": round(med(waf), 4),
    }
    result.update(churn(workdir, quick, data))
    return result
