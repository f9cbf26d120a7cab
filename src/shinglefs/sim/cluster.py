"""The cluster model: how long a checkpoint takes on N nodes x D drives behind a network.

There is no multi-node placement in ShingleFS yet (issue 11 asks the model to
drive today's code and be extended when servers exist), so:

- Ranks are spread over nodes round robin (rank r writes to node r mod N;
  with ``replicas`` > 1 each shard also goes to the next nodes), so a node
  receives ``ceil(ranks * replicas / nodes)`` shard streams.
- Within a node, the real code runs: a ``StorageNode`` of D emulated drives
  places every slice (``StorageNode.place``: group affinity, most free bytes),
  and each drive's real ``WriteScheduler`` coalesces the pieces, which arrive
  round robin over the node's streams in 1 MiB pieces. Every drive is traced
  and its trace replayed through the HC620 model. This is done for a sample
  of ``sample_per_stream`` bytes per stream (the pattern - run lengths, zone
  switches - depends on streams per drive, not on the total once each stream
  has a few runs); the node's modeled drive rate is the sample's bytes over
  its slowest drive's modeled time.
- A node's time is the largest of: its bytes over that drive rate, its bytes
  over its NIC (``node_gbit`` x ``network_efficiency``), and a client's bytes
  over the client NIC; plus ``commit_s`` for the metadata commit. Network and
  drives overlap (streaming), so the slowest stage sets the time.

Never does: anything on a real network. The emulated drives live in a
temporary directory under ``workdir`` and are removed.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from shinglefs.server.node import StorageNode
from shinglefs.sim.drives import hc620
from shinglefs.sim.hdd import HmSmrDiskModel
from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive

MiB = 1024 * 1024
PIECE = MiB
SLICE = 64 * MiB
ZONE = 256 * MiB


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A cluster and its clients; every figure is an assumption to override."""

    nodes: int = 12
    drives_per_node: int = 1
    node_gbit: float = 25.0
    clients: int = 12
    client_gbit: float = 25.0
    ranks: int = 96  # 12 clients x 8 GPUs
    replicas: int = 1
    network_efficiency: float = 0.94  # TCP payload share of the line rate (assumed)
    commit_s: float = 0.05  # metadata commit of the checkpoint (assumed)


@dataclass(frozen=True, slots=True)
class ClusterEstimate:
    spec: ClusterSpec
    checkpoint_bytes: int
    seconds: float
    drive_seconds: float
    network_seconds: float
    client_seconds: float
    bottleneck: str
    node_drive_mib_s: float
    drive_fraction: float  # modeled drive rate over the drives' rated single-stream rate
    streams_per_node: int

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        for k in ("seconds", "drive_seconds", "network_seconds", "client_seconds",
                  "node_drive_mib_s", "drive_fraction"):
            out[k] = round(out[k], 3)
        return out


class NodeSampler:
    """Runs the real node code on emulated drives for a sample; caches by (streams, drives)."""

    def __init__(self, workdir: Path, sample_per_stream: int = 64 * MiB,
                 model: HmSmrDiskModel | None = None) -> None:
        self.workdir = workdir
        self.sample_per_stream = sample_per_stream
        self.model = model or hc620()
        self._cache: dict[tuple[int, int], tuple[float, float]] = {}
        self._data = memoryview(np.random.default_rng(5).integers(0, 256, 4 * MiB, np.uint8)
                                .tobytes())

    def node_rate(self, streams: int, drives: int) -> tuple[float, float]:
        """(modeled MiB/s of one node's drives together, fraction of their rated rate)."""
        key = (streams, drives)
        if key not in self._cache:
            self._cache[key] = self._sample(streams, drives)
        return self._cache[key]

    def _sample(self, streams: int, drives: int) -> tuple[float, float]:
        total = streams * self.sample_per_stream
        per_drive = -(-total // drives)
        with tempfile.TemporaryDirectory(prefix="cluster-", dir=self.workdir) as tmp:
            raw = [EmulatedZonedDrive.create(str(Path(tmp) / f"d{i}"), zone_size=ZONE,
                                             zone_count=per_drive // ZONE + 12 + streams,
                                             conventional_zones=2) for i in range(drives)]
            stores = {i: SliceStore.format(d, gc_background=False) for i, d in enumerate(raw)}
            node = StorageNode(dict(stores))
            try:
                for d in raw:
                    d.start_trace()
                futures = []
                for pos in range(0, self.sample_per_stream, PIECE):
                    for s in range(streams):
                        off = pos % SLICE
                        _drive, fut = node.submit(s * 100_000 + pos // SLICE, off,
                                                  self._data[off % len(self._data):][:PIECE],
                                                  group=s + 1)
                        futures.append(fut)
                for f in futures:
                    f.result()
                node.flush()
                traces = [(d.zone_size, d.stop_trace()) for d in raw]
            finally:
                node.close()
                for d in raw:
                    d.close_drive()
        results = [self.model.replay(recs, zone_size=zs) for zs, recs in traces]
        slowest = max(r.write_seconds for r in results)
        mib_s = total / MiB / slowest
        rated = self.model.geometry.rate(2 * self.model.zone_size, write=True) / MiB
        return mib_s, mib_s / (rated * drives)


def estimate(spec: ClusterSpec, checkpoint_bytes: int, sampler: NodeSampler) -> ClusterEstimate:
    """The checkpoint time of ``spec`` (see the module docstring for the model)."""
    streams = math.ceil(spec.ranks * spec.replicas / spec.nodes)
    node_bytes = checkpoint_bytes * streams / spec.ranks
    mib_s, frac = sampler.node_rate(streams, spec.drives_per_node)
    drive_s = node_bytes / MiB / mib_s
    net_s = node_bytes / (spec.node_gbit * 1e9 / 8 * spec.network_efficiency)
    client_s = checkpoint_bytes / spec.clients / (spec.client_gbit * 1e9 / 8
                                                  * spec.network_efficiency)
    stages = {"drives": drive_s, "node network": net_s, "client network": client_s}
    bottleneck = max(stages, key=stages.__getitem__)
    return ClusterEstimate(spec, checkpoint_bytes, stages[bottleneck] + spec.commit_s, drive_s,
                           net_s, client_s, bottleneck, mib_s, frac, streams)


HEADLINE_BYTES = 100 * 10**9


def headline(workdir: Path, sample_per_stream: int = 64 * MiB) -> ClusterEstimate:
    """The seed's headline: a 100 GB checkpoint on 12 nodes x 1 drive, 25 GbE."""
    return estimate(ClusterSpec(), HEADLINE_BYTES, NodeSampler(workdir, sample_per_stream))


def scaling(workdir: Path, sample_per_stream: int = 64 * MiB,
            checkpoint_bytes: int = HEADLINE_BYTES) -> list[ClusterEstimate]:
    """How the headline scales with nodes, drives per node, ranks and replicas (one at a time)."""
    sampler = NodeSampler(workdir, sample_per_stream)
    base = ClusterSpec()
    specs = [base]
    specs += [ClusterSpec(nodes=n, clients=base.clients) for n in (4, 8, 24)]
    specs += [ClusterSpec(drives_per_node=d) for d in (2, 4)]
    specs += [ClusterSpec(ranks=r) for r in (12, 384)]
    specs += [ClusterSpec(replicas=2)]
    return [estimate(s, checkpoint_bytes, sampler) for s in specs]
