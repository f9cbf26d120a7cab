"""The client: file operations as metadata transactions plus slice I/O.

Owns: the VFS's file operations (``vfs``), open handles (``handles``), the
per-inode state and map windows (``inodes``), open/close and close-to-open
consistency (``openfiles``), write buffers streaming slices and their
ordered commits (``writepath``, ``writer``, ``settling``, ``commit``),
readahead and slice overlay resolution (``readpath``, ``reader``),
lifetime-group choice (``groups``), the background jobs and their scheduler
(``background``: deferred closes, deletions, compaction, janitor, session);
the Python API (``shinglefs.connect``) and the fsspec ``shinglefs://``
protocol.

May call: ``shinglefs.meta``, ``shinglefs.server``.
"""
