"""Opening and closing files in one client: meta's open-file rows, handles, close-to-open.

``open``/``create`` record the open in meta for this client's session
(an unlinked file lives on until its last close in every session), check
access, apply O_TRUNC (buffered bytes included), and attach a handle to the
inode's state (:class:`~shinglefs.client.inodes.InodeTable`): the first
handle makes its writer. ``release`` commits the inode's buffered writes,
closes the open in meta (at once, or queued for a group close with
``deferred_close``) and detaches the handle; the last handle leaves the
inode's stamp behind.

Close-to-open: a handle sees every byte other clients closed before it was
opened. ``keep_cache`` tells the kernel whether its cached pages of the file
are still right: True only when meta's ``(mtime, ctime, size)`` is the stamp
this client saw last.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

from shinglefs.client.background import CloseQueue
from shinglefs.client.handles import HandleTable
from shinglefs.client.inodes import InodeTable
from shinglefs.client.writepath import WritePath
from shinglefs.meta.api import UTIME_NOW, Ctx, InodeAttr, MetaStore
from shinglefs.meta.errors import FsError

__all__ = ["OpenFiles"]


class OpenFiles:
    """Opens and releases files of one client (thread-safe).

    ``session()`` is this client's current session id; ``closes`` takes the
    deferred closes (when ``deferred``); ``wake()`` starts a background pass
    (an inode was freed: its slices are to be deleted).
    """

    def __init__(
        self,
        meta: MetaStore,
        *,
        handles: HandleTable,
        inodes: InodeTable,
        writes: WritePath,
        session: Callable[[], int],
        closes: CloseQueue,
        deferred: bool,
        wake: Callable[[], None],
    ) -> None:
        self.meta = meta
        self.handles = handles
        self.inodes = inodes
        self.writes = writes
        self._session = session
        self._closes = closes
        self._deferred = deferred
        self._wake = wake

    def open(self, ino: int, flags: int, ctx: Ctx) -> int:
        """Open ``ino`` with ``flags`` (O_TRUNC truncates); returns a file handle.

        ESTALE when ``ino`` no longer exists, or has no name left and this
        client holds it nowhere (another client still has it open, or has
        not sent its deferred close yet): the caller's name for it is stale
        (another client unlinked it, or renamed another file over it, since
        the kernel looked the name up). On ESTALE the kernel looks the name
        up again and retries the open once (``do_filp_open``), which then
        opens what the name is now, or creates it (O_CREAT); ENOENT would
        reach the application although the name exists. (An unlinked file
        this client holds open reopens: ``/proc/self/fd/N``.)"""
        try:
            attr = self.meta.getattr(ino)
            if attr.is_dir:
                raise FsError(errno.EISDIR, f"inode {ino} is a directory", ino=ino)
            if attr.nlink == 0 and self.inodes.get(ino) is None:
                raise FsError(errno.ENOENT, f"inode {ino} has no name left", ino=ino)
            self._access_for_flags(attr, flags, ctx)
            self.meta.open_file(self._session(), ino)
        except FsError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise FsError(errno.ESTALE, f"inode {ino} no longer exists", ino=ino) from exc
        try:
            if flags & os.O_TRUNC:  # O_RDONLY too, as Linux (write permission checked)
                attr = self._truncate_on_open(attr, ctx)
            return self._attach(ino, flags, attr)
        except BaseException:
            self.meta.close_file(self._session(), ino)
            raise

    def create(
        self, parent: int, name: bytes, mode: int, flags: int, ctx: Ctx
    ) -> tuple[int, InodeAttr]:
        """Create (O_EXCL: exclusively) and open a regular file in one transaction.
        Without O_EXCL an existing regular file is opened instead (``ctx`` must
        be allowed ``flags``' access to it); an existing symbolic link: EEXIST."""
        seen = self.inodes.dirs.last_seen(parent)  # a hint: meta checks it as it writes
        created = self.meta.create_file(
            parent, name, mode, ctx, exclusive=bool(flags & os.O_EXCL), session=self._session(),
            parent_seen=None if seen is None else (seen.mode, seen.uid, seen.gid),
        )
        attr, made = created.attr, created.made
        self.inodes.note_parent(attr.ino, parent)
        if made:  # no xattrs; else an existing file was opened: its access is checked
            self.inodes.note_no_caps(attr.ino, time.monotonic())
            self.inodes.dirs.touched(parent, attr.ctime_ns)
        try:
            if not made:
                self._access_for_flags(attr, flags, ctx)
            if flags & os.O_TRUNC and not made:
                attr = self._truncate_on_open(attr, ctx)
            fh = self._attach(attr.ino, flags, attr)
        except BaseException:
            self.meta.close_file(self._session(), attr.ino)
            raise
        return fh, self.writes.with_buffered_size(attr)

    def release(self, fh: int) -> None:
        """Commit the inode's buffered writes, close ``fh`` in meta, detach it.
        A write-back error is raised after the handle is released."""
        h = self.handles.pop_file(fh)
        error: BaseException | None = None
        state = self.inodes.get(h.ino)
        if state is not None:
            try:
                with state.writer.lock:
                    state.writer.flush()
            except BaseException as exc:
                error = exc
        try:
            if self._deferred:
                self._closes.put(self._session(), h.ino)
            elif self.meta.close_file(self._session(), h.ino):
                self._wake()
        finally:
            self._detach(h.ino)
        if error is not None:
            raise error

    def changed_since_open(self, ino: int) -> bool:
        """Has ``ino`` changed (mtime, ctime or size in meta) since this client last cached it?"""
        attr = self.meta.getattr(ino)
        return self.inodes.stamp(ino) != (attr.mtime_ns, attr.ctime_ns, attr.size)

    def _access_for_flags(self, attr: InodeAttr, flags: int, ctx: Ctx) -> None:
        """May ``ctx`` open ``attr``'s file with ``flags``: EACCES by its mode bits
        (root passes), EPERM for writing a read-only snapshot's file (anyone)."""
        mode = flags & os.O_ACCMODE
        mask = {os.O_RDONLY: os.R_OK, os.O_WRONLY: os.W_OK, os.O_RDWR: os.R_OK | os.W_OK}.get(
            mode, os.R_OK
        )
        if flags & os.O_TRUNC:
            mask |= os.W_OK
        if mask & os.W_OK and attr.immutable:
            raise FsError(errno.EPERM, f"inode {attr.ino} is part of a read-only snapshot",
                          ino=attr.ino)
        if not ctx.is_root:
            self.meta.access(ctx, attr.ino, mask)

    def _truncate_on_open(self, attr: InodeAttr, ctx: Ctx) -> InodeAttr:
        """O_TRUNC of an existing file: empty it, including bytes this client
        still buffers, and set mtime and ctime even when it was empty (POSIX
        open). ``ctx``'s write permission was checked (``_access_for_flags``)."""
        return self.writes.after_commit(attr.ino, lambda: self.meta.setattr(
            attr.ino, size=0, mtime_ns=UTIME_NOW, ctx=ctx, checked=True))

    def _attach(self, ino: int, flags: int, attr: InodeAttr) -> int:
        """Create a handle for an inode already opened in meta for our session."""
        stamp = (attr.mtime_ns, attr.ctime_ns, attr.size)
        keep = self.inodes.attach(ino, stamp, lambda: self.writes.new_writer(ino, attr.size))
        return self.handles.add_file(ino, flags, keep, stamp)

    def _detach(self, ino: int) -> None:
        if not self.inodes.detach(ino):
            return
        try:
            attr = self.meta.getattr(ino)
            self.inodes.note_stamp(ino, (attr.mtime_ns, attr.ctime_ns, attr.size))
        except FsError:
            self.inodes.drop_stamp(ino)
