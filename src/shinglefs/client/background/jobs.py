"""The background jobs of one client, built and registered with their scheduler.

A pass runs, in this order: the deferred closes, keep-last-N retention of
the directories this client added entries to, the deletion consumer
(``deletion_consumer``), the compactions this client's commits queued, the
slices whose commit was in doubt (``indoubt``: settled once meta answers), the
scan for fragmented chunks (every ``compaction_scan_interval`` with
``compaction``), the janitor (every ``janitor_interval``), the session
heartbeat, which vouches for this client's slices in progress, and expiry
of crashed clients' sessions (every ``heartbeat_interval``), the metadata
backup to the drives (when due).
Closes drain before deletions so that a file freed by its last close is
deleted in the same pass. A job that fails holds back none after it (the
scheduler runs each on its own and retries it after a doubling wait): a
janitor or compaction scan failing on every pass still leaves the session
heartbeat running, so the session does not expire under this client.
"""

from __future__ import annotations

from shinglefs.client.background.closes import CloseQueue
from shinglefs.client.background.compaction import Compactor
from shinglefs.client.background.deletions import DeletionConsumer
from shinglefs.client.background.indoubt import InDoubtSlices
from shinglefs.client.background.janitor import Janitor, slices_in_progress
from shinglefs.client.background.retention import Retention
from shinglefs.client.background.scheduler import BackgroundScheduler
from shinglefs.client.background.sessions import ClientSession
from shinglefs.client.config import ClientConfig
from shinglefs.client.groups import GroupPolicy
from shinglefs.client.inodes import DirNames, InodeTable
from shinglefs.client.reader import ExtentCache, ReadSlice
from shinglefs.client.recovery import MetadataBackup
from shinglefs.meta.api import MetaStore, SessionInfo
from shinglefs.server.node import SliceNode

__all__ = ["ClientJobs"]


class ClientJobs:
    """Every background job of one client; ``start`` and ``stop`` their thread.

    Registers the client's session in meta when made (``session``).
    """

    def __init__(
        self,
        meta: MetaStore,
        node: SliceNode,
        config: ClientConfig,
        *,
        session: SessionInfo,
        chunk_size: int,
        inodes: InodeTable,
        groups: GroupPolicy,
        cache: ExtentCache,
        read_slice: ReadSlice,
        dir_names: DirNames,
    ) -> None:
        self.scheduler = bg = BackgroundScheduler(config.deletion_interval)
        self.session = ClientSession(
            meta, session, timeout=config.session_timeout, held=inodes.held,
            in_progress=lambda: slices_in_progress(inodes.writers()),
        )
        self.closes = CloseQueue(meta, bg.wake)

        def forget_dirs() -> None:  # retention changed directories: memos of them go
            dir_names.clear()
            inodes.dirs.clear()

        self.retention = Retention(meta, freed=bg.wake, changed=forget_dirs)
        self.deletions = DeletionConsumer(
            meta, node, config, forget_slice=cache.drop_slice, before=self.closes.drain
        )
        self.compactor = Compactor(
            meta, node, config, chunk_size=chunk_size, inodes=inodes, groups=groups,
            read_slice=read_slice, wake=bg.wake, pause=bg.pause,
        )
        self.janitor = Janitor(
            meta, abandoned_age=config.abandoned_slice_age, writers=inodes.writers, wake=bg.wake
        )
        self.backup = MetadataBackup(meta, node)  # to the drives, every interval
        self.in_doubt = InDoubtSlices(meta, node, wake=bg.wake)
        bg.add("closes", self.closes.drain)
        bg.add("retention", self.retention.run)  # before deletions: its unlinks free slices
        if config.deletion_consumer:
            bg.add("deletions", self.deletions.run)
        bg.add("queued compactions", self.compactor.run_queued)
        bg.add("in-doubt commits", self.in_doubt.resolve)
        if config.compaction and config.compaction_scan_interval:
            # Chunks fragmented by any client (or by this one before a restart).
            bg.add("compaction scan", self.compactor.compact_fragmented,
                   every=config.compaction_scan_interval)
        if config.janitor_interval:
            bg.add("janitor", self.janitor.run, every=config.janitor_interval)
        bg.add("session", self.session.run, every=config.heartbeat_interval)
        bg.add("metadata backup", self.backup.maybe_write)

    def start(self) -> None:
        self.scheduler.start()

    def wake(self) -> None:
        """Run a pass now: something was freed or queued."""
        self.scheduler.wake()

    def stop(self) -> None:
        """End the thread after its current job (the jobs stay callable)."""
        self.scheduler.stop()
