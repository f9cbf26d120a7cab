"""The FUSE mount: a thin pyfuse3 operations class over the client.

Owns: translating kernel requests to client calls, typed errors to errno, and
keeping blocking work off the trio event loop in large units.

May call: ``shinglefs.client``.
"""
