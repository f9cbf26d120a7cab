"""The client: file operations as metadata transactions plus slice I/O.

Owns: open handles, write buffers streaming slices, readahead, slice overlay
resolution, lifetime-group choice, close-to-open consistency, locks; the Python
API (``shinglefs.connect``) and the fsspec ``shinglefs://`` protocol.

May call: ``shinglefs.meta``, ``shinglefs.server``.
"""
