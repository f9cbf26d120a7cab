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

Hook for retention directories (a later step): a :class:`GroupPolicy`
subclass overrides :meth:`GroupPolicy.group_for` to return the group of the
retention directory's child that contains the file (one checkpoint step), e.g.
by walking parents and asking meta for ``get_policy(ino).retention``.
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
