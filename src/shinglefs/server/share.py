"""Sharing an embedded file system with other processes on the host.

An embedded file system (drives recorded at format time, ``shinglefs up``)
is opened by one process at a time: its drives are locked by the process
that opened them. So that a mount, a ``connect()`` in a script, fsspec in a
DataLoader and a second mount can use it at once, the process that owns
the drives also serves them (``DriveSharing``): a ``SliceServer`` on the
loopback interface, registered in the metadata as a storage server labelled
``embedded=<host>`` with the file system's drive uuids, heartbeating while
it runs. A second process that finds the drives held (``DriveInUse``)
opens the file system through that server instead (``owner_of``,
``ClusterNode(local_server=...)``): its slices go to the owner's drives over
loopback, its reads come from them, and meta's replicas of the owner's own
slices (``("local", drive)``) name that server.

When the owner exits it unregisters; when it is killed its registration goes
stale and the next process to open the file system finds the drives free and
becomes the owner.
"""

from __future__ import annotations

import socket

from shinglefs.meta.api import SERVER_HEARTBEAT_S, MetaStore, ServerRecord
from shinglefs.server.membership import Membership
from shinglefs.server.node import StorageNode
from shinglefs.server.service import SliceServer

EMBEDDED_LABEL = "embedded"


def owner_of(meta: MetaStore) -> ServerRecord | None:
    """The live server that shares this embedded file system's drives (the
    registration holding their uuids), if one is live."""
    uuids = {r.uuid for r in meta.drive_records() if r.uuid is not None}
    for record in meta.list_servers():
        if record.live and uuids and uuids <= {d.uuid for d in record.drives}:
            return record
    return None


class DriveSharing:
    """The drives of this process's embedded file system, served on loopback and
    registered in meta (module docstring). ``start`` raises what binding and
    registering raise, with nothing left running; ``stop`` is idempotent."""

    def __init__(self, meta: MetaStore, node: StorageNode, key: bytes,
                 heartbeat_s: float = SERVER_HEARTBEAT_S) -> None:
        self.meta = meta
        self.node = node
        self.key = key
        uuids = {i: r.uuid for i, r in enumerate(meta.drive_records())}
        self._membership = Membership(meta, node, uuids,
                                      {EMBEDDED_LABEL: socket.gethostname()}, heartbeat_s)
        self._server: SliceServer | None = None

    @property
    def server_id(self) -> int | None:
        return self._membership.server_id

    def start(self) -> DriveSharing:
        self._server = SliceServer(self.node, self.key, host="127.0.0.1", port=0,
                                   workers=4).start()
        try:
            host, port = self._server.address
            self.node.server_id = self._membership.register(f"{host}:{port}")
        except BaseException:
            self._server.close()
            self._server = None
            raise
        self._membership.start()
        return self

    def stop(self) -> None:
        """Unregister (other processes stop using it at once), stop serving."""
        self._membership.stop()
        if self._server is not None:
            self._server.close()
            self._server = None
