"""A node's registration as a storage server in the metadata, kept alive.

Used by the storage server process (``server/process.py``) and by an embedded
file system shared with the host's other processes (``server/share.py``):
``register`` records the address, the drives (``server_drives``: capacity
and free bytes per drive, tier by drive kind) and labels; ``start`` runs a
heartbeat thread that refreshes the free bytes every ``heartbeat_s`` and
registers again when meta says the registration is gone (stopped or removed
meanwhile); a beat that cannot reach meta logs a warning and the next one
tries again; ``stop`` ends the thread and unregisters (placement leaves the
server out at once).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Mapping

from shinglefs.errors import ShingleError
from shinglefs.meta.api import MetaStore, ServerDrive
from shinglefs.meta.errors import FsError
from shinglefs.server.node import TIER_OF_KIND, StorageNode
from shinglefs.zoned.drivespec import parse_drive_spec

log = logging.getLogger(__name__)

def server_drives(node: StorageNode, uuids: Mapping[int, str | None]) -> list[ServerDrive]:
    """A node's drives as meta records a server's, free bytes as of now."""
    return [
        ServerDrive(d.drive_id, d.spec, uuids.get(d.drive_id),
                    TIER_OF_KIND[parse_drive_spec(d.spec).kind], d.capacity_bytes, d.free_bytes)
        for d in node.stats().drives
    ]


class Membership:
    """One registration of ``node`` (module docstring). Thread-safe as far as
    the metadata store is (by contract)."""

    def __init__(self, meta: MetaStore, node: StorageNode, uuids: Mapping[int, str | None],
                 labels: Mapping[str, str], heartbeat_s: float) -> None:
        self.meta = meta
        self.node = node
        self.uuids = dict(uuids)
        self.labels = dict(labels)
        self.heartbeat_s = heartbeat_s
        self.address = ""
        self.server_id: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def register(self, address: str) -> int:
        """Register (or rejoin under the id these drives had); returns the id."""
        self.address = address
        self.server_id = self.meta.register_server(address, server_drives(self.node, self.uuids),
                                                   self.labels)
        log.info("storage server %d registered at %s", self.server_id, address)
        return self.server_id

    def heartbeat(self) -> None:
        """One heartbeat; registers again when meta says the registration is gone."""
        assert self.server_id is not None
        try:
            at = time.time_ns()  # before the figures: pieces stored later are not in them
            self.meta.heartbeat_server(self.server_id, server_drives(self.node, self.uuids),
                                       at_ns=at)
        except FsError as exc:
            if exc.errno != errno.ESTALE:
                raise
            log.warning("server %d was unregistered meanwhile; registering again",
                        self.server_id)
            self.register(self.address)

    def start(self) -> None:
        """Heartbeat from a thread until ``stop``."""
        self._beat = threading.Thread(target=self._loop, name="server-heartbeat", daemon=True)
        self._beat.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.heartbeat()
            except ShingleError as exc:
                log.warning("heartbeat of server %s failed: %s", self.server_id, exc)
            except Exception:  # the node keeps serving; the next beat tries again
                log.exception("heartbeat of server %s failed", self.server_id)

    def stop(self) -> None:
        """Stop heartbeating and unregister. Idempotent."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        if self.server_id is not None:
            try:
                self.meta.unregister_server(self.server_id)
            except ShingleError as exc:
                log.warning("unregistering server %d failed: %s", self.server_id, exc)
            self.server_id = None
