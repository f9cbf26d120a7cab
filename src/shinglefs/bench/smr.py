"""``shinglefs bench smr``: what a real SMR drive would take for exactly what our store did.

The real slice store and write scheduler run on emulated drives with tracing
on; each trace is then replayed through the HC620 host-managed SMR model
(``shinglefs.sim``). Every fraction is modeled throughput of user bytes over
the model's own single-stream sequential rate for the same bytes in the same
zones (the "rated" rate, ~235 MiB/s write, ~238 MiB/s read at the outer
diameter); host CPU time is not counted.

Workloads (sizes for full / ``--quick``):

- Checkpoint writes: R ranks (1, 4, 16, 64) each write one file (its own
  lifetime group, as the client gives a large file) of total/R bytes in 1 MiB
  pieces (FUSE's max_write) into 64 MiB slices, all at once: the pieces
  arrive round robin over the ranks (``write_files``); then one flush.
  Total 4 GiB / 1 GiB.
- Uncoalesced baseline: the same 16-rank writes through the same scheduler
  with coalescing off (every piece its own run and batch, no linger), so the
  drive sees the pieces in the order they arrived.
- DM-SMR baseline: the same 16-rank pieces in their arrival order, laid out
  as a conventional file system would (each file contiguous in its own
  extent, written where it is dirtied), replayed through the drive-managed
  SMR model; fraction of that drive's own sequential rate.
  ``dmsmr_write_fraction_16_100gb``: the same round-robin pattern for a
  100 GB checkpoint (past the media cache: the write cliff).
- Restore: the 16 ranks read their files back concurrently (64 MiB reads, the
  client's readahead).
- Epoch reads: a corpus of 8 files written by one writer, then read by 1, 4
  and 8 concurrent readers (64 MiB reads); 2 GiB / 512 MiB.
- ``ckpt_write_fraction_64_queue_1gib``: the 64-rank checkpoint with the
  scheduler's queue at 1 GiB instead of 256 MiB (``StoreConfig.max_queue_bytes``):
  with 64 groups the queue bound caps a run at about 256 MiB / 64 = 4 MiB.
- ``cluster_100gb_seconds``: the cluster model (``sim.cluster``, real node
  placement and schedulers on a sample): a 100 GB checkpoint on 12 nodes x 1
  drive, 96 ranks, 25 GbE, one replica; ``cluster_scaling`` varies one
  figure at a time; ``sizing_5pb`` is ``sim.sizing`` for 5 PB.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shinglefs.sim import DmSmrDiskModel, HmSmrDiskModel, archive_dmsmr, cluster, hc620
from shinglefs.sim.sizing import size_cluster, tier_costs
from shinglefs.sim.tracefile import Trace, write_trace
from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive
from shinglefs.zoned.model import TraceRecord

MiB = 1024 * 1024
GiB = 1024 * MiB
PIECE = MiB
SLICE = 64 * MiB
READ = 64 * MiB
ZONE = 256 * MiB
UNCOALESCED = {"min_run_bytes": 0, "max_run_bytes": PIECE, "batch_bytes": PIECE, "linger_s": 0.0}


@dataclass
class TracedStore:
    """An emulated drive with a fresh slice store on it, traced from creation on."""

    path: Path
    capacity: int
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.drive = EmulatedZonedDrive.create(
            str(self.path), zone_size=ZONE, zone_count=self.capacity // ZONE + 12,
            conventional_zones=2)
        self.store = SliceStore.format(self.drive, gc_background=False, **self.config)
        self.drive.start_trace()

    def take_trace(self) -> list[TraceRecord]:
        """The records since the last take (tracing goes on)."""
        records = self.drive.stop_trace()
        self.drive.start_trace()
        return records

    def close(self) -> None:
        self.drive.stop_trace()
        self.store.close()
        self.drive.close_drive()
        self.path.unlink()
        Path(str(self.path) + ".zones").unlink()


def _slice_id(rank: int, k: int) -> int:
    return rank * 100_000 + k


def write_files(store: SliceStore, sizes: list[int], data: memoryview,
                arrivals: list[tuple[int, int, int]] | None = None, first_rank: int = 0) -> None:
    """The ranks' files arrive piece by piece, round robin over the ranks; then one flush.

    Round robin is how equally fast ranks writing at once interleave at the
    store (and the hardest order to coalesce). One thread submits for all
    ranks, so the order is exact and repeatable (threads would hand the store
    bursts of one rank per GIL switch interval instead). ``arrivals`` collects
    (rank, file offset, length) in submission order. Each file is its own
    lifetime group, as the client gives a large file (group = rank + 1; ranks
    are numbered from ``first_rank``).
    """
    futures: list[Future[None]] = []
    for pos in range(0, max(sizes), PIECE):
        for index, size in enumerate(sizes):
            if pos >= size:
                continue
            rank = first_rank + index
            n = min(PIECE, size - pos)
            off = pos % SLICE
            if arrivals is not None:
                arrivals.append((index, pos, n))
            futures.append(store.submit(_slice_id(rank, pos // SLICE), off,
                                        data[off % len(data):][:n], group=rank + 1))
    for f in futures:
        f.result()
    store.flush()


def read_files(store: SliceStore, sizes: list[int], ranks: list[int]) -> None:
    """``ranks`` read their files concurrently, READ bytes at a time."""
    def reader(rank: int) -> None:
        buf = bytearray(READ)
        for pos in range(0, sizes[rank], READ):
            n = min(READ, sizes[rank] - pos, SLICE - pos % SLICE)
            store.readinto(_slice_id(rank, pos // SLICE), pos % SLICE, memoryview(buf)[:n])

    threads = [threading.Thread(target=reader, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def rated(model: HmSmrDiskModel | DmSmrDiskModel, nbytes: int, op: str, start: int) -> float:
    """The model's media rate (MiB/s) over ``nbytes`` from ``start``: one sequential stream."""
    return model.geometry.rate(start + nbytes // 2, write=op == "write") / MiB


def fraction(model: HmSmrDiskModel, records: list[TraceRecord], user_bytes: int, op: str,
             zone_size: int = ZONE) -> tuple[float, dict[str, Any]]:
    """Modeled user MiB/s of ``records`` over the rated rate; and the replay's figures."""
    r = model.replay(records, zone_size=zone_size)
    seconds = r.write_seconds if op == "write" else r.read_seconds
    first = min((x.offset for x in records if x.op == op and x.zone >= 2), default=2 * ZONE)
    mib_s = user_bytes / MiB / seconds if seconds else 0.0
    return mib_s / rated(model, user_bytes, op, first), r.as_dict()


def dmsmr_records(arrivals: list[tuple[int, int, int]], sizes: list[int],
                  zone_size: int) -> list[TraceRecord]:
    """The arrivals as a conventional file system lays them out: each file in its own extent.

    Files are placed one after another from 1 GiB in, each rounded up to 1 MiB
    (an ext4-like allocator gives a large file one contiguous extent); each
    piece is written at its file offset, in the order it arrived.
    """
    base, starts = GiB, []
    for size in sizes:
        starts.append(base)
        base += -(-size // MiB) * MiB
    out = []
    for rank, pos, n in arrivals:
        lba = starts[rank] + pos
        out.append(TraceRecord("write", lba // zone_size, lba, n, 0.0))
    out.append(TraceRecord("flush", -1, 0, 0, 0.0))
    return out


def round_robin_records(ranks: int, rank_bytes: int, zone_size: int) -> list[TraceRecord]:
    """``dmsmr_records`` of ``ranks`` files of ``rank_bytes`` arriving round robin in 1 MiB pieces."""
    arrivals = [(rank, pos, PIECE) for pos in range(0, rank_bytes - PIECE + 1, PIECE)
                for rank in range(ranks)]
    return dmsmr_records(arrivals, [rank_bytes] * ranks, zone_size)


def checkpoint(workdir: Path, ranks: int, total: int, data: memoryview,
               config: dict[str, Any] | None = None, restore: bool = False,
               keep_trace: Path | None = None) -> dict[str, Any]:
    """Write a ``ranks``-rank checkpoint of ``total`` bytes; model its write (and read back)."""
    sizes = [total // ranks] * ranks
    arrivals: list[tuple[int, int, int]] = []
    ts = TracedStore(workdir / f"ckpt{ranks}.drive", total, config or {})
    m = hc620()
    try:
        t = time.perf_counter()
        write_files(ts.store, sizes, data, arrivals)
        host_s = time.perf_counter() - t
        wrec = ts.take_trace()
        if keep_trace is not None:
            write_trace(Trace.of(ts.drive, wrec), keep_trace)
        out: dict[str, Any] = {"host_s": round(host_s, 3), "records": len(wrec)}
        out["fraction"], out["replay"] = fraction(m, wrec, total, "write")
        runs = [n for _, n in ts.store.scheduler.runs_written]
        out["mean_run_mib"] = round(float(np.mean(runs)) / MiB, 2) if runs else 0.0
        if restore:
            read_files(ts.store, sizes, list(range(ranks)))
            out["restore_fraction"], out["restore_replay"] = fraction(
                m, ts.take_trace(), total, "read")
    finally:
        ts.close()
    out["arrivals"] = arrivals
    out["sizes"] = sizes
    return out


def epoch(workdir: Path, total: int, data: memoryview, readers: tuple[int, ...],
          files: int = 8) -> dict[int, float]:
    """Write a corpus of ``files`` files (one writer), then model reads by N concurrent readers."""
    sizes = [total // files] * files
    ts = TracedStore(workdir / "corpus.drive", total)
    m = hc620()
    out = {}
    try:
        for rank in range(files):  # one writer: file after file
            write_files(ts.store, [sizes[rank]], data, first_rank=rank)
        ts.take_trace()
        for n in readers:
            per = files // n
            for k in range(per):  # every file read once per epoch, n at a time
                read_files(ts.store, sizes, [k * n + i for i in range(n)])
            out[n], _ = fraction(m, ts.take_trace(), total, "read")
    finally:
        ts.close()
    return out


def churn(workdir: Path, quick: bool, data: memoryview) -> list[dict[str, Any]]:
    """Corpus growth plus checkpoint churn with retention; the store's counters after each round.

    Each round appends one corpus file and writes an 8-rank checkpoint; the
    checkpoint of round r-3 is deleted (keep 3). The drive holds 1.25 times the
    peak of live zones (each file starts its own zone) plus 12 spare, far less
    than the zones the rounds take in all, so zones are reset and reused; GC
    runs in the background as in production. Each round's trace is replayed through the
    HC620 model.
    """
    rounds, ranks = (12, 8) if quick else (24, 8)
    zone, rank_bytes, corpus_step = (32 * MiB, 16 * MiB, 32 * MiB) if quick else \
        (256 * MiB, 64 * MiB, 256 * MiB)
    per_file = -(-(rank_bytes + MiB) // zone)  # zones a file takes (records add headers)
    peak = rounds * -(-(corpus_step + MiB) // zone) + 4 * ranks * per_file
    zones = int(peak * 1.25) + 12
    path = workdir / "churn.drive"
    drive = EmulatedZonedDrive.create(str(path), zone_size=zone, zone_count=zones,
                                      conventional_zones=2)
    store = SliceStore.format(drive)
    m, series = hc620(), []
    try:
        for rnd in range(rounds):
            drive.start_trace()
            base = 1_000 + rnd * 100  # ranks of this round: base (corpus), base+1.. (ckpt)
            write_files(store, [corpus_step], data, first_rank=base)  # the corpus grows
            write_files(store, [rank_bytes] * ranks, data, first_rank=base + 1)
            if rnd >= 3:  # keep 3: drop the checkpoint of round rnd-3 (group = rank + 1)
                for g in range(ranks):
                    store.delete_group(1_000 + (rnd - 3) * 100 + 1 + g + 1)
            store.flush()
            r = m.replay(drive.stop_trace(), zone_size=zone)
            st = store.stats()
            series.append({"round": rnd + 1, "user_gib": round(st.user_bytes_written / GiB, 3),
                           "waf": round(st.write_amplification, 4),
                           "gc_mib_copied": round(st.gc_bytes_copied / MiB, 1),
                           "zone_resets": st.zone_resets,
                           "modeled_mib_s": round(r.write_mib_s, 1)})
    finally:
        store.close()
        drive.close_drive()
        path.unlink()
        Path(str(path) + ".zones").unlink()
    return series


def checkpoints(out: dict[str, Any], workdir: Path, total: int, data: memoryview,
                step: Callable[[str], None]) -> None:
    """ShingleFS, uncoalesced and DM-SMR fractions for 1, 4, 16 and 64 ranks; restore of 16."""
    dm = archive_dmsmr()
    dm_rated = rated(dm, total, "write", GiB)
    for ranks in (1, 4, 16, 64):
        step(f"checkpoint {ranks} ranks")
        res = checkpoint(workdir, ranks, total, data, restore=ranks == 16)
        out[f"ckpt_write_fraction_{ranks}"] = round(res["fraction"], 3)
        out[f"ckpt_mean_run_mib_{ranks}"] = res["mean_run_mib"]
        out[f"ckpt_zone_switches_{ranks}"] = res["replay"]["zone_switches"]
        if ranks == 16:
            out["restore_read_fraction"] = round(res["restore_fraction"], 3)
        unco = checkpoint(workdir, ranks, total, data, config=UNCOALESCED)
        out[f"ckpt_write_fraction_{ranks}_uncoalesced"] = round(unco["fraction"], 3)
        out[f"ckpt_zone_switches_{ranks}_uncoalesced"] = unco["replay"]["zone_switches"]
        r = dm.replay(dmsmr_records(res["arrivals"], res["sizes"], dm.zone_size))
        out[f"dmsmr_write_fraction_{ranks}"] = round(total / MiB / r.write_seconds / dm_rated, 3)
        out[f"dmsmr_media_cache_gib_{ranks}"] = round(r.media_cache_bytes / GiB, 2)
    # The same 16-rank arrival pattern at the headline's size: past the media cache
    for_100gb = round_robin_records(16, 100 * 10**9 // 16, dm.zone_size)
    r = dm.replay(for_100gb)
    out["dmsmr_write_fraction_16_100gb"] = round(
        r.bytes_written / MiB / r.write_seconds / rated(dm, r.bytes_written, "write", GiB), 3)
    step("64 ranks, 1 GiB queue")
    big = checkpoint(workdir, 64, total, data, config={"max_queue_bytes": GiB})
    out["ckpt_write_fraction_64_queue_1gib"] = round(big["fraction"], 3)
    out["ckpt_mean_run_mib_64_queue_1gib"] = big["mean_run_mib"]


TARGETS = {"ckpt_write_fraction_16": 0.95, "ckpt_write_fraction_64": 0.9,
           "epoch_read_fraction_8": 0.85, "restore_read_fraction": 0.85,
           "cluster_100gb_seconds": 72}


def run(quick: bool, workdir: Path, **options: Any) -> dict:
    total = int(options.get("total_bytes", (1 if quick else 4) * GiB))
    corpus = int(options.get("corpus_bytes", (512 * MiB) if quick else 2 * GiB))
    sample = int(options.get("cluster_sample_bytes", (32 if quick else 64) * MiB))
    workdir.mkdir(parents=True, exist_ok=True)
    data = memoryview(np.random.default_rng(7).integers(0, 256, 4 * MiB, np.uint8).tobytes())
    step: Callable[[str], None] = options.get("progress") or (lambda _s: None)
    out: dict[str, Any] = {"quick": quick, "checkpoint_bytes": total, "corpus_bytes": corpus,
                           "model": hc620().name}
    checkpoints(out, workdir, total, data, step)
    step("epoch reads")
    for n, frac in epoch(workdir, corpus, data, (1, 4, 8)).items():
        out[f"epoch_read_fraction_{n}"] = round(frac, 3)
    if options.get("churn", True):
        step("churn with retention")
        out["churn"] = churn(workdir, quick, data)
    step("cluster model")
    head = cluster.headline(workdir, sample)
    out["cluster_100gb_seconds"] = round(head.seconds, 1)
    out["cluster_100gb"] = head.as_dict()
    out["cluster_scaling"] = [
        {"nodes": e.spec.nodes, "drives_per_node": e.spec.drives_per_node, "ranks": e.spec.ranks,
         "replicas": e.spec.replicas, "seconds": round(e.seconds, 1), "bottleneck": e.bottleneck,
         "drive_fraction": round(e.drive_fraction, 3)}
        for e in cluster.scaling(workdir, sample)]
    out["sizing_5pb"] = size_cluster(5 * 10**15)
    out["tier_usd_per_tb_month"] = tier_costs()
    out["targets"] = dict(TARGETS)
    out["targets_met"] = {k: (out[k] <= v if k == "cluster_100gb_seconds" else out[k] >= v)
                          for k, v in TARGETS.items()}
    out["host"] = os.uname().nodename
    return out
