"""This client's session in meta: registered at start, kept alive, ended at shutdown.

A session names the client that holds files open (an unlinked file lives on
until its last close in every session). ``ClientSession.run``, every
``ClientConfig.heartbeat_interval`` seconds (``HEARTBEAT_INTERVAL`` at most),
renews the session and expires the sessions of crashed clients (silent past
``session_timeout``), which releases their unlinked-open files. A session
that expired while this process stalled is registered again and the inodes
this client holds are opened again in it.

Each heartbeat also vouches for the slices this client's writers have in
progress (``MetaStore.touch_slices``, one statement per
``SLICE_RECORDS_BATCH`` of them): a live writer's slice never ages past
``abandoned_slice_age``, so no client's janitor discards it
(background/janitor.py).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Collection

from shinglefs.client.config import SESSION_HEARTBEAT_S
from shinglefs.meta.api import SLICE_RECORDS_BATCH, MetaStore, SessionInfo
from shinglefs.meta.errors import FsError

log = logging.getLogger(__name__)

__all__ = ["HEARTBEAT_INTERVAL", "ClientSession"]

HEARTBEAT_INTERVAL = SESSION_HEARTBEAT_S


class ClientSession:
    """The session ``id`` this client opens files in; ``held()`` lists the
    ``(inode, handles)`` it holds open (to re-open after an expiry),
    ``in_progress()`` the ids of the slices its writers have not committed yet."""

    def __init__(
        self,
        meta: MetaStore,
        info: SessionInfo,
        *,
        timeout: float,
        held: Callable[[], list[tuple[int, int]]],
        in_progress: Callable[[], Collection[int]],
    ) -> None:
        self.meta = meta
        self.info = info
        self.timeout = timeout
        self._held = held
        self._in_progress = in_progress
        self.id = meta.register_session(info)

    def run(self) -> None:
        """Heartbeat, then expire the sessions of crashed clients."""
        self.heartbeat()
        self.meta.expire_sessions(self.timeout)

    def heartbeat(self) -> None:
        """Keep the session alive; if it expired (this process stalled past the
        timeout), register again and re-open the inodes this client holds.
        Then vouch for the slices in progress (``vouch``). Raises what meta
        raises (the scheduler logs it and retries on a later pass)."""
        self._renew()
        self.vouch()

    def vouch(self) -> int:
        """Mark every slice this client's writers have in progress, still
        WRITING in meta, as registered now (``MetaStore.touch_slices``, one
        statement per ``SLICE_RECORDS_BATCH``); returns how many were touched.
        A slice committed meanwhile is left alone."""
        ids = sorted(self._in_progress())
        return sum(self.meta.touch_slices(ids[i:i + SLICE_RECORDS_BATCH])
                   for i in range(0, len(ids), SLICE_RECORDS_BATCH))

    def _renew(self) -> None:
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
