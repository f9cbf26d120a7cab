"""Drive timing models: what a real drive would take for exactly what our code did.

Owns: the mechanics of hard disks (``geometry``), the drive models behind one
interface (``model.DriveModel.replay``: operations in, modeled seconds, bytes,
seeks and zone switches out) - host-managed SMR and CMR (``hdd``),
drive-managed SMR (``dmsmr``), flash (``flash``) - their calibrated profiles
(``drives``), synthetic fio-like workloads (``workloads``), the trace file
format (``tracefile``), the cluster model and sizing (``cluster``, ``sizing``).

May call: ``shinglefs.zoned`` (the ``TraceRecord`` type and drives to trace),
and, for the cluster model only, the placement and write-scheduler code of
``shinglefs.store`` / ``shinglefs.server`` (read-only use: it never changes
them). Never does I/O to a real drive: a model is arithmetic over a trace.
"""

from shinglefs.sim.dmsmr import DmSmrDiskModel
from shinglefs.sim.drives import PROFILES, archive_dmsmr, cmr_hdd, hc620, nvme_flash, profile
from shinglefs.sim.flash import FlashModel
from shinglefs.sim.geometry import DiskGeometry
from shinglefs.sim.hdd import CmrDiskModel, HmSmrDiskModel
from shinglefs.sim.model import DriveModel, Simulation
from shinglefs.sim.result import ReplayResult

__all__ = [
    "PROFILES",
    "CmrDiskModel",
    "DiskGeometry",
    "DmSmrDiskModel",
    "DriveModel",
    "FlashModel",
    "HmSmrDiskModel",
    "ReplayResult",
    "Simulation",
    "archive_dmsmr",
    "cmr_hdd",
    "hc620",
    "nvme_flash",
    "profile",
]
