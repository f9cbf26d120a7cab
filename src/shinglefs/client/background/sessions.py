"""This client's session in meta: registered at start, kept alive, ended at shutdown.

A session names the client that holds files open (an unlinked file lives on
until its last close in every session). ``ClientSession.run``, every
``HEARTBEAT_INTERVAL`` seconds, renews the session and expires the sessions
of crashed clients (silent past ``session_timeout``), which releases their
unlinked-open files. A session that expired while this process stalled is
registered again and the inodes this client holds are opened again in it.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

from shinglefs.meta.api import MetaStore, SessionInfo
from shinglefs.meta.errors import FsError

log = logging.getLogger(__name__)

__all__ = ["HEARTBEAT_INTERVAL", "ClientSession"]

HEARTBEAT_INTERVAL = 10.0


class ClientSession:
    """The session ``id`` this client opens files in; ``held()`` lists the
    ``(inode, handles)`` it holds open (to re-open after an expiry)."""

    def __init__(
        self,
        meta: MetaStore,
        info: SessionInfo,
        *,
        timeout: float,
        held: Callable[[], list[tuple[int, int]]],
    ) -> None:
        self.meta = meta
        self.info = info
        self.timeout = timeout
        self._held = held
        self.id = meta.register_session(info)

    def run(self) -> None:
        """Heartbeat, then expire the sessions of crashed clients."""
        self.heartbeat()
        self.meta.expire_sessions(self.timeout)

    def heartbeat(self) -> None:
        """Keep the session alive; if it expired (this process stalled past the
        timeout), register again and re-open the inodes this client holds."""
        try:
            self.meta.heartbeat(self.id)
        except FsError as exc:
            if exc.errno != errno.ESTALE:
                raise
            log.warning("session %d expired; registering again", self.id)
            self.id = self.meta.register_session(self.info)
            for ino, handles in self._held():
                for _ in range(handles):
                    try:
                        self.meta.open_file(self.id, ino)
                    except FsError:
                        log.warning("inode %d was freed while the session was expired", ino)
                        break

    def end(self) -> None:
        """Unregister the session (shutdown): its open files are closed in meta."""
        self.meta.unregister_session(self.id)
