"""The slice log, one per drive.

Owns: self-describing checksummed records in sequential zones, lifetime groups
mapped to zones, the compact slice index with its checkpoints, recovery after a
crash, zone GC, and the per-drive write scheduler that coalesces concurrent
writers into long sequential appends.

Rooms: ``api.py`` the contract (``SliceStoreAPI``, ``StoreStats``,
``StoreAbilities``), ``config.py`` the tunables, ``slice_store.py`` the store
of one drive; the log itself in ``log.py`` (``SliceLog``: appends, deletes,
checkpoints), ``zones.py`` (zone table, streams, space, resets), ``reads.py``
(verified reads, index queries) and ``recovery.py``; ``record.py``,
``index.py``, ``checkpoint.py`` the formats; ``scheduler.py``, ``gc.py``,
``scrub.py``, ``metabackup.py`` the work on top.

May call: ``shinglefs.zoned`` and ``shinglefs.errors``.
"""

from shinglefs.store.api import (
    MAX_SLICE_SIZE,
    SliceStoreAPI,
    StoreAbilities,
    StoreStats,
    WriteQueue,
)
from shinglefs.store.config import StoreConfig
from shinglefs.store.errors import (
    ChecksumMismatch,
    SliceNotFound,
    SliceOrderError,
    StoreClosed,
    StoreError,
    StoreFormatError,
    StoreFull,
    StoreIOError,
)
from shinglefs.store.gc import ZoneCollector, choose_victim, cost_benefit
from shinglefs.store.index import Extent, SliceIndex
from shinglefs.store.log import SliceLog
from shinglefs.store.record import RecordHeader, RecordType
from shinglefs.store.recovery import DiscardedTail, RecoveryReport
from shinglefs.store.scheduler import WriteScheduler
from shinglefs.store.slice_store import SliceStore

__all__ = [
    "MAX_SLICE_SIZE",
    "ChecksumMismatch",
    "DiscardedTail",
    "Extent",
    "RecordHeader",
    "RecordType",
    "RecoveryReport",
    "SliceIndex",
    "SliceLog",
    "SliceNotFound",
    "SliceOrderError",
    "SliceStore",
    "SliceStoreAPI",
    "StoreAbilities",
    "StoreClosed",
    "StoreConfig",
    "StoreError",
    "StoreFormatError",
    "StoreFull",
    "StoreIOError",
    "StoreStats",
    "WriteQueue",
    "WriteScheduler",
    "ZoneCollector",
    "choose_victim",
    "cost_benefit",
]
