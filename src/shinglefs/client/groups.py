"""Lifetime groups: which data is expected to die together.

The default rule (docs/client.md): a *large* file is a group of its own (its
inode number); a *small* file joins the group of its parent directory (the
directory's inode number), so the many small files of one directory - a zarr
array, a checkpoint step's metadata files - share zones and die together.
A file is small when its first slice ends before ``small_file_bytes``
(4 MiB) at close/flush, i.e. it never filled a streamed piece.

The group also names the slice's replication goal: storage placement
(``server.cluster.ClusterNode.place``) and re-replication
(``server.repair``) both ask meta the goal of the group's inode
(``MetaStore.replica_goals``), so a group must stay an inode number.

Retention directories (``background/retention.py``) need no rule of their
own: what retention deletes is a checkpoint step's large files (groups of
their own) and small files (its directory's group). A :class:`GroupPolicy`
subclass can still override :meth:`GroupPolicy.group_for` to give every file
under one step directory that directory's group.
"""

from __future__ import annotations


class GroupPolicy:
    """Chooses the lifetime group of a file's writes (called once per open writer)."""

    def group_for(self, ino: int, parent: int | None, small: bool) -> int:
        """The group of file ``ino``; ``parent`` is the directory it was reached
        through (None when unknown, e.g. opened by inode after a restart)."""
        if small and parent is not None:
            return parent
        return ino
