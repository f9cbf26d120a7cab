"""A flash drive (NVMe SSD) for the hot tier and for comparison.

No positioning: each operation costs a fixed latency plus its transfer at the
read or write bandwidth, one after another (the queue-depth-1 view; a real SSD
overlaps requests, so this is a conservative figure for small I/O and the
bandwidth for large I/O). Figures are generic datacenter NVMe, not calibrated
against one device.
"""

from __future__ import annotations

from dataclasses import dataclass

from shinglefs.sim.model import DriveModel, Simulation


class FlashSimulation(Simulation):
    def __init__(self, model: FlashModel) -> None:
        super().__init__(model.name)
        self.model = model

    def read(self, position: int, length: int, zone: int) -> None:
        self.charge(self.model.read_latency_s + length / self.model.read_rate, write=False)
        self.result.bytes_read += length

    def write(self, position: int, length: int, zone: int) -> None:
        self.charge(self.model.write_latency_s + length / self.model.write_rate, write=True)
        self.result.bytes_written += length


@dataclass(frozen=True, slots=True)
class FlashModel(DriveModel):
    name: str
    capacity: int
    read_rate: float
    write_rate: float
    read_latency_s: float = 80e-6
    write_latency_s: float = 20e-6
    zone_size: int = 256 * 1024 * 1024  # only for mapping traces from zoned drives

    def simulation(self) -> Simulation:
        return FlashSimulation(self)
