"""The FUSE mount: a thin pyfuse3 operations class over the client.

Owns: translating kernel requests to client calls, typed errors to errno,
keeping blocking work off the trio event loop in large units, and the life of
a mount (``mount.py``: checks, the background daemon, state files,
unmounting; its errors in ``errors.py``).

May call: ``shinglefs.client``.
"""
