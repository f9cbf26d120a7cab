"""``shinglefs bench index-scale``: the slice index's memory and lookup time at drive scale.

Builds the index of a 28 TB drive full of 8 MiB extents (3.5 million; quick:
350,000) in a fresh subprocess, through the same ``SliceIndex.add`` path the
slice log uses (recent extents in the tail dict, merged into the numpy
columns), and reports the growth of the process's resident memory
(``VmRSS`` from /proc/self/status before and after), its peak (``VmHWM``), and
lookup latency of random slice ids. Baseline in the same run: what a plain
Python dict of tuples (the obvious design) costs per extent, measured on a
smaller sample and extrapolated linearly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
EXTENT = 8 * MiB
ZONE = 256 * MiB
FULL_EXTENTS = 3_500_000


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(extents: int, baseline_sample: int) -> dict[str, Any]:
    """Run inside the subprocess: build, measure, look up."""
    import time

    import numpy as np

    from shinglefs.store.index import SliceIndex

    rng = np.random.default_rng(7)
    ids = rng.integers(1, 2**63, extents, dtype=np.int64).tolist()
    per_zone = ZONE // (EXTENT + 4096)  # 31 records of 8 MiB + a 4 KiB header a zone
    zones = extents // per_zone + 1
    ids_bytes = _status("VmRSS")  # the id list is the benchmark's input, not the index
    before = _status("VmRSS")
    index = SliceIndex(ZONE, zones)
    t = time.perf_counter()
    for i, sid in enumerate(ids):
        zone, k = divmod(i, per_zone)
        index.add(sid, 0, EXTENT, zone * ZONE + k * (EXTENT + 4096), i % 64)
    index.merge()
    build_s = time.perf_counter() - t
    after = _status("VmRSS")
    peak = _status("VmHWM")
    sample = [ids[j] for j in rng.integers(0, extents, 20_000).tolist()]
    lat = []
    for sid in sample:
        t0 = time.perf_counter_ns()
        found = index.extents(sid)
        lat.append(time.perf_counter_ns() - t0)
        assert found and found[0][1] == EXTENT
    lat.sort()
    # Baseline: the obvious dict of lists of tuples, on a sample.
    base_before = _status("VmRSS")
    naive: dict[int, list[tuple[int, int, int, int]]] = {}
    for i, sid in enumerate(ids[:baseline_sample]):
        naive[sid] = [(0, EXTENT, i * (EXTENT + 4096), i % 64)]
    base_after = _status("VmRSS")
    naive_per_extent = (base_after - base_before) / baseline_sample
    grown = after - before
    return {
        "extents": extents,
        "slices": index.slices,
        "rss_mib": round(grown / MiB, 1),
        "bytes_per_extent": round(grown / extents, 1),
        "rss_peak_mib": round((peak - ids_bytes) / MiB, 1) if peak > ids_bytes else 0.0,
        "column_bytes_per_extent": round(index.memory_bytes() / extents, 1),
        "rss_mib_at_3_5m": round(grown / extents * FULL_EXTENTS / MiB, 1),
        "build_s": round(build_s, 2),
        "lookup_us_p50": round(lat[len(lat) // 2] / 1000, 2),
        "lookup_us_p99": round(lat[int(len(lat) * 0.99)] / 1000, 2),
        "baseline_dict_bytes_per_extent": round(naive_per_extent, 1),
        "baseline_dict_rss_mib_at_3_5m": round(naive_per_extent * FULL_EXTENTS / MiB, 1),
    }


def run(quick: bool, workdir: Path, **options: Any) -> dict:
    extents = int(options.get("extents", 350_000 if quick else FULL_EXTENTS))
    sample = min(extents, 200_000)
    code = (
        "import json, sys\n"
        "from shinglefs.bench.index_scale import measure\n"
        f"print(json.dumps(measure({extents}, {sample})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=str(workdir)
    )
    if out.returncode:
        raise RuntimeError(f"index-scale subprocess failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))
