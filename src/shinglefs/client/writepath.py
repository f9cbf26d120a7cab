"""The write path of open files: one writer per open inode, and the commit of its slices.

Each inode this client has open gets one
:class:`~shinglefs.client.writer.FileWriter` (shared by its handles), made
on the first open. All writers share one :class:`WriteBudget`
(``total_buffer_bytes``: back-pressure) and one pool of ``commit_threads``
that settle slices ended while writing. A finished slice is registered in
meta when its first piece is stored (``register_slice``) and committed
through :class:`~shinglefs.client.commit.OrderedCommits` (its drive flushed
first); every commit invalidates the inode's map window, stamps the inode
and is reported to ``on_commit`` (compaction counts them).

Size changes (truncate, O_TRUNC, fallocate, O_APPEND's end of file) run
under the writer's lock with the buffered bytes committed first, so no
write lands on the wrong side of the new size.
"""

from __future__ import annotations

import dataclasses
import mmap
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shinglefs.client.commit import FinishedSlice, OrderedCommits, register_slice
from shinglefs.client.config import ClientConfig
from shinglefs.client.groups import GroupPolicy
from shinglefs.client.handles import FileHandle
from shinglefs.client.inodes import InodeTable, OpenInode
from shinglefs.client.writer import FileWriter, WriteBudget
from shinglefs.meta.api import InodeAttr, MetaStore
from shinglefs.server.errors import NodeFull
from shinglefs.server.node import Declined, SliceNode

__all__ = ["WritePath"]

# The kernel writes a shared mapping back a page at a time, from page boundaries.
PAGE_SIZE = mmap.PAGESIZE


class WritePath:
    """The writers of one client's open inodes (thread-safe)."""

    def __init__(
        self,
        meta: MetaStore,
        node: SliceNode,
        config: ClientConfig,
        *,
        chunk_size: int,
        inodes: InodeTable,
        groups: GroupPolicy,
        on_commit: Callable[[OpenInode, int], None],
        in_doubt: Callable[[int, int | None], None] | None = None,
    ) -> None:
        self.meta = meta
        self.node = node
        self.config = config
        self.chunk_size = chunk_size
        self.inodes = inodes
        self.groups = groups
        self._on_commit = on_commit
        self._in_doubt = in_doubt
        self.budget = WriteBudget(config.total_buffer_bytes)
        self.commits = OrderedCommits(meta, node.flush)
        # FIFO: a settle task waits only on its file's earlier task, started before it.
        self._settler = ThreadPoolExecutor(config.commit_threads, thread_name_prefix="shinglefs-commit")
        self._stamping = threading.Lock()  # _commit_slice

    def new_writer(self, ino: int, committed_size: int) -> FileWriter:
        """The writer of ``ino`` when this client opens it (size ``committed_size`` in meta)."""

        def choose_group(small: bool) -> int:
            return self.groups.group_for(ino, self.inodes.parent(ino), small)

        def register(slice_id: int, drive_id: int, group: int) -> None:
            register_slice(self.meta, slice_id, self.node.replicas_of(slice_id, drive_id), group)

        return FileWriter(
            ino,
            node=self.node,
            config=self.config,
            chunk_size=self.chunk_size,
            budget=self.budget,
            new_slice_id=self.meta.next_slice_id,
            choose_group=choose_group,
            register=register,
            commit=self._commit_slice,
            settler=self._settler,
            committed_size=committed_size,
            in_doubt=self._in_doubt,
        )

    def _commit_slice(self, finished: FinishedSlice, file_end: int,
                      queued: threading.Event | None) -> None:
        """A writer's slice is stored: commit it (ordered commits; ``queued`` as
        ``OrderedCommits.commit``), note the inode's new stamp, report the commit."""
        attr = self.commits.commit(finished, file_end, queued)
        self.inodes.maps.invalidate(finished.ino)
        state = self.inodes.get(finished.ino)
        if state is not None:
            with self._stamping:  # commits of one batch return at once, in any order:
                # keep the latest (ctime never goes back from one commit to the next)
                if state.stamp is None or attr.ctime_ns >= state.stamp[1]:
                    state.stamp = (attr.mtime_ns, attr.ctime_ns, attr.size)
            self._on_commit(state, finished.chunk_index)

    def writer_of(self, h: FileHandle) -> FileWriter:
        """The writer of an open handle's inode (there while the handle is)."""
        writer = self.inodes.writer(h.ino)
        if writer is None:
            raise KeyError(h.ino)
        return writer

    def with_buffered_size(self, attr: InodeAttr) -> InodeAttr:
        """``attr`` with ``size`` grown to cover this client's buffered writes."""
        writer = self.inodes.writer(attr.ino)
        if writer is not None:
            end = writer.buffered_end()
            if end > attr.size:
                return dataclasses.replace(attr, size=end)
        return attr

    def flush(self, ino: int, *, wait: bool = True) -> None:
        """Commit ``ino``'s buffered writes, if this client has it open (``FileWriter.flush``;
        ``wait=False``: or raise ``Declined``)."""
        writer = self.inodes.writer(ino)
        if writer is not None:
            writer.flush(wait=wait)

    def write(self, h: FileHandle, offset: int, data: bytes | memoryview, *,
              wait: bool = True, from_kernel: bool = False) -> int:
        """Buffer ``data`` at ``offset`` (O_APPEND: at the end of the file).

        ``from_kernel``: the caller is the kernel (the mount), which also writes
        the dirty pages of a shared mapping back through the handle that mapped
        the file, O_APPEND or not. On an O_APPEND handle a write at a page
        boundary inside the file is such a page and goes to its offset; a
        write(2) comes at the kernel's end of the file, which is this client's
        end of the file too unless another client appended since the kernel
        last asked (then, at a page boundary, it lands where the kernel put it:
        appends of several clients are not atomic anyway, docs/client.md).

        ``wait=False``: ``FileWriter.write(wait=False)``; always ``Declined`` for
        O_APPEND (the end of the file is a metadata question)."""
        writer = self.writer_of(h)
        if h.append:
            if not wait:
                raise Declined("O_APPEND asks the metadata for the end of the file")
            with writer.lock:
                size = max(self.meta.getattr(h.ino).size, writer.buffered_end())
                if from_kernel and offset % PAGE_SIZE == 0 and offset < size:
                    return writer.write(offset, data)  # a mapped page written back
                return writer.write(size, data)
        return writer.write(offset, data, wait=wait)

    def after_commit(self, ino: int, change: Callable[[], InodeAttr]) -> InodeAttr:
        """Run ``change`` (a change of ``ino`` in meta that buffered bytes must not
        outlive: its size, or its mtime, which their commit would set to "now")
        after this client's buffered writes of ``ino`` are committed and with
        none admitted until it returns; returns its attributes."""
        state = self.inodes.get(ino)
        if state is None:
            attr = change()
        else:
            with state.writer.lock:
                state.writer.flush()
                attr = change()
                state.writer.note_committed_size(attr.size)
        self.inodes.maps.invalidate(ino)
        return attr

    def allocate(self, h: FileHandle, new_size: int) -> None:
        """Grow the file to ``new_size`` if below, counting buffered writes (ENOSPC
        when the drives could not hold the difference)."""
        writer = self.writer_of(h)
        with writer.lock:
            current = max(self.meta.getattr(h.ino).size, writer.buffered_end())
            if new_size <= current:
                return
            if new_size - current > self.node.stats().free_bytes:
                raise NodeFull(0, None, f"fallocate of {new_size - current} bytes")
            writer.flush()
            attr = self.meta.truncate(h.ino, new_size)
            writer.note_committed_size(attr.size)
        self.inodes.maps.invalidate(h.ino)

    def abandon(self) -> None:
        """Drop every writer's buffered bytes without storing them (process death)."""
        for writer in self.inodes.writers():
            writer.abandon()

    def close(self) -> None:
        """Stop the settle pool (after every writer was flushed or abandoned)."""
        self._settler.shutdown(wait=True, cancel_futures=True)
