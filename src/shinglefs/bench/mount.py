"""``shinglefs bench mount``: the FUSE mount against a local directory on the same disk.

Same operations, same run, medians of ``rounds`` repetitions:

- sequential write of 2 GiB (quick: 256 MiB) in 1 MiB ``write`` calls, then
  ``fsync`` and ``close`` (all timed);
- cold sequential read of that file in 1 MiB reads. Cold means: the kernel
  page cache is dropped (``echo 3 > /proc/sys/vm/drop_caches``, root) and,
  for ShingleFS, the file system is remounted first so that its in-process
  extent cache is empty too;
- concurrent cold readers (``read_mib_s_1``, ``read_mib_s_8``,
  ``read_scaling_8``): 8 files of 256 MiB (quick: 64 MiB) are written once;
  each round reads one of them alone, then all 8 at once, one thread per file
  (an epoch read by several DataLoader workers), each cold as above (the
  mount is remounted before each). ``read_mib_s_8`` is the aggregate (all
  bytes over the time until the last reader finished);
  ``read_scaling_8 = read_mib_s_8 / read_mib_s_1`` (per round, median), target
  >= 1.0: more readers through one mount must never be slower than one;
- 10,000 (quick: 2,000) files of 4 KiB created, written and closed;
- the same small files straight on the client library, no FUSE
  (``vfs_small_files_per_s``): a ``VFS`` opened in this process on its own
  file system (the mount's layout, formatted once), each file the calls the
  kernel makes of the mount for it (``lookup`` of the new name, ``create``,
  ``write``, ``flush``, ``release``), the file system shut down after each
  round so its threads never run beside the other measurements. From it,
  ``small_files_ceiling_of_floor``: the ``small_files_of_floor`` the mount
  would reach if FUSE cost it nothing beyond the floor (the floor's file and
  the library's file, one after the other on the loop's thread:
  ``vfs / (vfs + floor)``, per round, median). A target above it is out of
  reach of any FUSE-side tuning: only a cheaper client library (metadata
  engine, schema) gets there;
- a ``torch.utils.data.DataLoader`` with 2 workers reading fixed-length
  samples (seek + read) of uint16 token shards, cold as above;
- the daemon's memory (``daemon_rss_*``, once, after the rounds): 20,000
  (quick: 4,000) files of 4 KiB and one 2 GiB (quick: 512 MiB) file are
  written, the file system is remounted (a fresh daemon, caches empty), and
  every small file is read (open, read, close), then the big file streamed
  in 1 MiB reads. ``daemon_rss_peak_mib`` is the peak resident set of the
  daemon process over that pass (``VmHWM`` of /proc/PID/status, the
  kernel's own high-water mark, so no sample can miss it);
  ``daemon_rss_start_mib`` its resident set when the pass began. Target:
  ``daemon_rss_peak_mib`` <= 768 (CEILINGS): the read cache's bound
  (ClientConfig.read_cache_bytes, 256 MiB) plus a fixed overhead, whatever
  the number of files read.

The mount is a real ``shinglefs mount --foreground`` child process over SQLite
metadata and emulated SMR drives in ``workdir`` (see fuse/harness.py).

The FUSE floor (``floor_*``): the write, read and small-file measurements are
also run against ``bench/fuse_floor.py``, an in-memory pyfuse3 file system
that stores nothing (a write records a size, a read slices one preallocated
block, every handler inline) mounted with the real mount's FUSE options,
writeback cache, timeouts and read-ahead. It is the ceiling of the FUSE
transport itself on this machine, measured in the same run: pyfuse3 serves
every request on one trio thread and copies each request while holding the
GIL, so no pyfuse3 file system can beat it. ``*_of_floor`` is how much of that
ceiling the mount reaches; ``floor_write_ratio``/``floor_read_ratio`` are the
floor against the local directory, and ``floor_targets_met`` applies TARGETS
to the floor: a target the floor misses is out of reach for the FUSE
transport on this machine, whatever ShingleFS's storage path does. The
floor's reads are cold like the others (page cache dropped); it holds no
cache of its own to empty.

Each round measures the local directory, then the mount, then the floor back
to back, so the ``*_ratio`` and ``*_of_floor`` fields are the median of the
per-round ratios (a paired design: load from other jobs drifts between rounds
more than within one); the ``*_mib_s``/``*_per_s`` fields are medians over
rounds. ``samples`` keeps every round's figures.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shinglefs.bench.fuse_floor import FloorMount
from shinglefs.fuse.harness import GiB, MountedFileSystem, default_drives, drop_caches

MiB = 1024**2
BLOCK = 1 * MiB
SEQ_LEN = 4096  # tokens a sample (uint16: 8 KiB)

READERS = 8  # concurrent cold readers, each of its own file
TARGETS = {"write_ratio": 0.8, "read_ratio": 0.8, "loader_ratio": 0.8, "small_files_per_s": 2000.0,
           "read_scaling_8": 1.0}
# Upper bounds: a field meets its target when it is at most this.
CEILINGS = {"daemon_rss_peak_mib": 768.0}
# Against the FUSE floor measured in the same run: small files (create, write
# 4 KiB, close) with ordered commits (a drive flush per close) at >= 0.6 of
# what pyfuse3 itself allows.
OF_FLOOR_TARGETS = {"small_files_of_floor": 0.6}
# The FUSE floor's figure that each target is checked against (the loader is
# not run on the floor).
FLOOR_FIELDS = {"write_ratio": "floor_write_ratio", "read_ratio": "floor_read_ratio",
                "small_files_per_s": "floor_small_files_per_s",
                "read_scaling_8": "floor_read_scaling_8"}


def _sequential_write(path: Path, size: int) -> float:
    """MiB/s of writing ``size`` bytes in 1 MiB writes, fsync and close."""
    block = np.random.default_rng(1).integers(0, 256, BLOCK, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        for _ in range(size // BLOCK):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size / MiB / (time.perf_counter() - start)


def _sequential_read(path: Path) -> float:
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    total = 0
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            total += n
    return total / MiB / (time.perf_counter() - start)


def _concurrent_read(paths: list[Path]) -> float:
    """Aggregate MiB/s of one thread per file reading it whole in 1 MiB reads, all
    at once: the bytes of every file over the time from the common start until
    the last reader finished. Raises RuntimeError when a reader failed."""
    totals = [0] * len(paths)
    errors: list[BaseException] = []
    gate = threading.Barrier(len(paths) + 1)

    def reader(i: int) -> None:
        view = memoryview(bytearray(BLOCK))
        try:
            with open(paths[i], "rb", buffering=0) as f:
                gate.wait()
                while n := f.readinto(view):
                    totals[i] += n
        except threading.BrokenBarrierError:
            return  # another reader failed before the start: it reports why
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)
            gate.abort()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    try:
        gate.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} concurrent reader(s) failed: {errors[0]!r}")
    return sum(totals) / MiB / elapsed


def _write_reader_files(directory: Path, count: int, size: int) -> list[Path]:
    """``count`` files of ``size`` bytes (distinct contents) for the concurrent readers."""
    directory.mkdir()
    paths = []
    for i in range(count):
        path = directory / f"r{i}"
        block = np.random.default_rng(100 + i).integers(0, 256, BLOCK, dtype=np.uint8).tobytes()
        with open(path, "wb") as f:
            for _ in range(size // BLOCK):
                f.write(block)
        paths.append(path)
    return paths


def _vfs_small_files(meta_url: str, directory: bytes, count: int) -> float:
    """Files/s of ``_small_files``'s loop made of VFS calls in this process
    (module docstring), on the file system of ``meta_url``; ``directory`` is
    made in its root."""
    from shinglefs.client.filesystem import open_filesystem
    from shinglefs.meta.api import ROOT_INO
    from shinglefs.meta.errors import FsError

    vfs = open_filesystem(meta_url)
    try:
        parent = vfs.mkdir(ROOT_INO, directory, 0o755).ino
        payload = b"s" * 4096
        flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL
        start = time.perf_counter()
        for i in range(count):
            name = f"f{i:06d}".encode()
            try:
                vfs.lookup(parent, name)
            except FsError:
                pass  # the kernel's negative lookup before a create
            fh, _attr = vfs.create(parent, name, 0o644, flags)
            vfs.write(fh, 0, payload)
            vfs.flush(fh)
            vfs.release(fh)
        return count / (time.perf_counter() - start)
    finally:
        vfs.shutdown()


def _small_files(directory: Path, count: int) -> float:
    directory.mkdir()
    payload = b"s" * 4096
    start = time.perf_counter()
    for i in range(count):
        fd = os.open(directory / f"f{i:06d}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(fd, payload)
        os.close(fd)
    return count / (time.perf_counter() - start)


class TokenShards:
    """A map-style dataset of fixed-length samples read by seek + read from uint16 shards.

    Each worker opens each shard once (handles are per process, opened lazily).
    """

    def __init__(self, paths: list[str], seq_len: int = SEQ_LEN) -> None:
        self.paths = paths
        self.seq_len = seq_len
        self.sample_bytes = seq_len * 2
        self.per_shard = [os.path.getsize(p) // self.sample_bytes for p in paths]
        self._files: dict[int, Any] = {}

    def __len__(self) -> int:
        return sum(self.per_shard)

    def __getitem__(self, index: int) -> Any:
        import torch

        shard = 0
        while index >= self.per_shard[shard]:
            index -= self.per_shard[shard]
            shard += 1
        f = self._files.get(shard)
        if f is None:
            f = self._files[shard] = open(self.paths[shard], "rb", buffering=0)  # noqa: SIM115
        f.seek(index * self.sample_bytes)
        data = f.read(self.sample_bytes)
        return torch.from_numpy(np.frombuffer(data, dtype=np.uint16).astype(np.int64))


def _write_shards(directory: Path, shards: int, shard_bytes: int) -> list[str]:
    directory.mkdir()
    rng = np.random.default_rng(7)
    paths = []
    for s in range(shards):
        tokens = rng.integers(0, 50257, shard_bytes // 2, dtype=np.uint16)
        path = directory / f"tokens-{s:04d}.u16"
        with open(path, "wb") as f:
            f.write(tokens.tobytes())
        paths.append(str(path))
    return paths


def _loader(paths: list[str]) -> float:
    import torch

    dataset = TokenShards(paths)
    loader: Any = torch.utils.data.DataLoader(
        dataset, batch_size=16, num_workers=2, shuffle=False  # type: ignore[arg-type]
    )
    samples = 0
    start = time.perf_counter()
    for batch in loader:
        samples += len(batch)
    elapsed = time.perf_counter() - start
    assert samples == len(dataset)
    return samples / elapsed


def daemon_memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB: its resident set now and at its peak."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024  # kB
    return fields["VmRSS"], fields["VmHWM"]


def _memory_pass(fs: MountedFileSystem, small: int, size: int) -> dict[str, Any]:
    """Peak RSS of a fresh daemon reading ``small`` 4 KiB files, then streaming
    a ``size``-byte file (both written first, through the mount)."""
    root = fs.mountpoint / "rss"
    (root / "small").mkdir(parents=True)
    payload = b"r" * 4096
    for i in range(small):
        (root / "small" / f"f{i:06d}").write_bytes(payload)
    _sequential_write(root / "stream", size)
    fs.stop()
    fs.start()
    drop_caches()
    assert fs.process is not None
    pid = fs.process.pid
    start_rss, _ = daemon_memory(pid)
    started = time.perf_counter()
    for i in range(small):
        with open(root / "small" / f"f{i:06d}", "rb", buffering=0) as f:
            if f.read() != payload:
                raise RuntimeError(f"small file {i} read back wrong")
    small_s = time.perf_counter() - started
    stream = _sequential_read(root / "stream")
    _, peak = daemon_memory(pid)
    shutil.rmtree(root)
    return {
        "daemon_rss_start_mib": round(start_rss, 1),
        "daemon_rss_peak_mib": round(peak, 1),
        "daemon_rss_small_files": small,
        "daemon_rss_small_files_per_s": round(small / small_s, 1),
        "daemon_rss_stream_bytes": size,
        "daemon_rss_stream_mib_s": round(stream, 1),
    }


FIGURES = ("write", "read", "local_write", "local_read", "small", "local_small", "loader",
           "local_loader", "floor_write", "floor_read", "floor_small", "vfs_small",
           "read_1", "read_8", "local_read_1", "local_read_8", "floor_read_1", "floor_read_8")


@dataclass(frozen=True, slots=True)
class Plan:
    """The sizes of one run (module docstring; ``quick`` is the small one)."""

    size: int  # the sequential file
    small: int  # 4 KiB files per round
    shards: int  # token shards for the DataLoader
    shard_bytes: int
    rounds: int
    memory_small: int  # 4 KiB files of the memory pass
    memory_size: int  # the streamed file of the memory pass
    reader_bytes: int  # each file of the concurrent readers

    @classmethod
    def of(cls, quick: bool, rounds: int | None) -> Plan:
        if quick:
            return cls(256 * MiB, 2_000, 4, 32 * MiB, rounds or 3, 4_000, 512 * MiB, 64 * MiB)
        return cls(2 * GiB, 10_000, 8, 64 * MiB, rounds or 3, 20_000, 2 * GiB, 256 * MiB)


def _drives(data: Path, plan: Plan) -> list[str]:
    """The drives of the bench's file systems, in ``data``: two SMR drives with
    room for the rounds' files, one conventional."""
    data.mkdir(parents=True, exist_ok=True)
    return default_drives(data, smr_drives=2, smr_bytes=max(16 * GiB, 4 * plan.size),
                          conventional_bytes=2 * GiB)


def _formatted_mount(workdir: Path, plan: Plan) -> MountedFileSystem:
    """A freshly formatted (not yet started) file system in ``workdir/fs``."""
    fs = MountedFileSystem(workdir / "fs", workdir / "mnt", drives=_drives(workdir / "fs", plan))
    fs.format()
    return fs


def _formatted_library(workdir: Path, plan: Plan) -> str:
    """The metadata URL of a freshly formatted file system in ``workdir/vfs``,
    laid out as ``_formatted_mount``'s, for ``_vfs_small_files``."""
    from shinglefs.client.filesystem import format_filesystem

    drives = _drives(workdir / "vfs", plan)
    url = f"sqlite3://{(workdir / 'vfs' / 'meta.db').resolve()}"
    format_filesystem(url, drives)
    return url


def _round(r: int, plan: Plan, fs: MountedFileSystem, measured: tuple[tuple[str, Path], ...],
           shards: dict[str, list[str]], figures: dict[str, list[float]], library: str) -> bool:
    """One round over every target, back to back; False if a cache could not be dropped."""
    cold = True
    for name, root in measured:
        figures[name + "write"].append(_sequential_write(root / f"seq{r}", plan.size))
    for name, root in measured:
        if root == fs.mountpoint:
            fs.stop()
            fs.start()
        cold = drop_caches() and cold
        figures[name + "read"].append(_sequential_read(root / f"seq{r}"))
        os.unlink(root / f"seq{r}")
    for name, root in measured:
        figures[name + "small"].append(_small_files(root / f"small{r}", plan.small))
    figures["vfs_small"].append(_vfs_small_files(library, f"small{r}".encode(), plan.small))
    for name, paths in shards.items():
        if not name:
            fs.stop()
            fs.start()
        cold = drop_caches() and cold
        figures[name + "loader"].append(_loader(paths))
    for _name, root in measured:
        shutil.rmtree(root / f"small{r}")
    return _readers_round(fs, measured, figures) and cold


def _readers_round(fs: MountedFileSystem, measured: tuple[tuple[str, Path], ...],
                   figures: dict[str, list[float]]) -> bool:
    """One reader of one file, then ``READERS`` readers of their own files, each
    cold (files written by ``run`` in ``readers/``); False if a cache could not
    be dropped."""
    cold = True
    for name, root in measured:
        paths = sorted((root / "readers").iterdir())
        for figure, run_readers in (("read_1", paths[:1]), ("read_8", paths)):
            if root == fs.mountpoint:
                fs.stop()
                fs.start()
            cold = drop_caches() and cold
            figures[name + figure].append(_concurrent_read(run_readers))
    return cold


def _report(plan: Plan, figures: dict[str, list[float]], cold: bool,
            memory: dict[str, Any]) -> dict[str, Any]:
    """The result fields: medians, paired ratios, targets met."""
    med = {k: statistics.median(v) for k, v in figures.items()}

    def paired(name: str, baseline: str | None = None) -> float:
        """Median of the per-round ratios ``name / baseline`` (default: ``local_<name>``)."""
        return statistics.median(m / b for m, b in zip(
            figures[name], figures[baseline or "local_" + name], strict=True))

    result: dict[str, Any] = {
        "write_mib_s": round(med["write"], 1),
        "read_mib_s": round(med["read"], 1),
        "local_write_mib_s": round(med["local_write"], 1),
        "local_read_mib_s": round(med["local_read"], 1),
        "write_ratio": round(paired("write"), 3),
        "read_ratio": round(paired("read"), 3),
        "small_files_per_s": round(med["small"], 1),
        "local_small_files_per_s": round(med["local_small"], 1),
        "loader_samples_per_s": round(med["loader"], 1),
        "local_loader_samples_per_s": round(med["local_loader"], 1),
        "loader_ratio": round(paired("loader"), 3),
        "floor_write_mib_s": round(med["floor_write"], 1),
        "floor_read_mib_s": round(med["floor_read"], 1),
        "floor_small_files_per_s": round(med["floor_small"], 1),
        "write_of_floor": round(paired("write", "floor_write"), 3),
        "read_of_floor": round(paired("read", "floor_read"), 3),
        "small_files_of_floor": round(paired("small", "floor_small"), 3),
        "vfs_small_files_per_s": round(med["vfs_small"], 1),
        "small_files_ceiling_of_floor": round(statistics.median(
            v / (v + f) for v, f in zip(figures["vfs_small"], figures["floor_small"],
                                        strict=True)), 3),
        "floor_write_ratio": round(paired("floor_write", "local_write"), 3),
        "floor_read_ratio": round(paired("floor_read", "local_read"), 3),
        **{f"{name}read_mib_s_{n}": round(med[f"{name}read_{n}"], 1)
           for name in ("", "local_", "floor_") for n in (1, READERS)},
        "read_scaling_8": round(paired("read_8", "read_1"), 3),
        "local_read_scaling_8": round(paired("local_read_8", "local_read_1"), 3),
        "floor_read_scaling_8": round(paired("floor_read_8", "floor_read_1"), 3),
        "reader_bytes": plan.reader_bytes,
        "file_bytes": plan.size,
        "small_files": plan.small,
        "loader_bytes": plan.shards * plan.shard_bytes,
        "sample_bytes": SEQ_LEN * 2,
        "rounds": plan.rounds,
        "cold_reads": cold,
        "samples": {k: [round(x, 1) for x in v] for k, v in figures.items()},
        **memory,
    }
    result["targets_met"] = {k: result[k] >= v for k, v in TARGETS.items()}
    result["targets_met"].update({k: result[k] <= v for k, v in CEILINGS.items()})
    result["targets_met"].update({k: result[k] >= v for k, v in OF_FLOOR_TARGETS.items()})
    result["floor_targets_met"] = {k: result[f] >= TARGETS[k] for k, f in FLOOR_FIELDS.items()}
    return result


def run(quick: bool, workdir: Path, rounds: int | None = None, **_: Any) -> dict[str, Any]:
    """Measure the mount and the local baseline; returns medians and ratios."""
    plan = Plan.of(quick, rounds)
    workdir = Path(workdir)
    local = workdir / "local"
    local.mkdir(parents=True, exist_ok=True)
    fs = _formatted_mount(workdir, plan)
    library = _formatted_library(workdir, plan)
    floor = FloorMount(workdir / "floor")
    figures: dict[str, list[float]] = {k: [] for k in FIGURES}
    cold = True
    try:
        fs.start()
        floor.start()
        mount_shards = _write_shards(fs.mountpoint / "shards", plan.shards, plan.shard_bytes)
        local_shards = _write_shards(local / "shards", plan.shards, plan.shard_bytes)
        shards = {"local_": local_shards, "": mount_shards}  # the loader has no floor
        measured = (("local_", local), ("", fs.mountpoint), ("floor_", floor.mountpoint))
        for _name, root in measured:
            _write_reader_files(root / "readers", READERS, plan.reader_bytes)
        for r in range(plan.rounds):
            cold = _round(r, plan, fs, measured, shards, figures, library) and cold
        memory = _memory_pass(fs, plan.memory_small, plan.memory_size)
    finally:
        try:
            floor.stop()
        finally:
            fs.stop()
    return _report(plan, figures, cold, memory)
