"""ShingleFS: an HDD-native file system for AI training on host-managed SMR drives.

Layers, bottom up (each depends only on the ones below it):

- ``zoned``  drives: emulated host-managed SMR, Linux zoned block devices, conventional.
- ``store``  the slice log, one per drive: records, index, recovery, zone GC, write scheduler.
- ``server`` a storage node: the drives of one process and slice placement across them.
- ``meta``   the metadata engine on SQLite or PostgreSQL.
- ``client`` file operations as metadata transactions plus slice I/O; the Python API and fsspec.
- ``fuse``   the pyfuse3 operations class over the client.
- ``bench``  benchmarks, each a command comparing against a baseline taken in the same run.
- ``cli``    the ``shinglefs`` command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shinglefs.client.api import ShingleFS

__version__ = "0.1.0"


def connect(meta_url: str, **kwargs: Any) -> ShingleFS:
    """Open a ShingleFS file system by its metadata URL without FUSE.

    See :func:`shinglefs.client.api.connect` for the contract.
    """
    from shinglefs.client.api import connect as _connect

    return _connect(meta_url, **kwargs)
