"""Background work of a client: the policy layer beside the file operations.

Owns the jobs a client runs on its own, off the callers' threads, and the
scheduler that runs them (one thread, passes in a fixed order):

- ``closes``: deferred closes, group-committed to meta one transaction a session;
- ``deletions``: the deletion consumer, freeing on the drives what meta queued;
- ``compaction``: fragmented chunks rewritten as one sequential slice;
- ``janitor``: slices of crashed writers queued for deletion;
- ``retention``: keep-last-N directories, their older entries retired and removed;
- ``sessions``: this client's session kept alive, crashed clients' expired;
- ``scheduler``: the thread, its passes and intervals;
- ``jobs``: every job of one client, registered in pass order (``ClientJobs``).

A tier mover (existing slices to a directory's new tier) would join here as another
job; placement by tier is the nodes' (server/tiers.py). The VFS makes
one ``ClientJobs``, starts it and stops it.

May call: ``shinglefs.meta``, ``shinglefs.server``, and the client's own
modules below the VFS (``commit``, ``inodes``, ``reader``, ``writer``,
``groups``, ``config``, ``recovery``); never the VFS.
"""

from shinglefs.client.background.closes import CLOSE_BATCH, CloseQueue
from shinglefs.client.background.compaction import Compactor
from shinglefs.client.background.deletions import DeletionConsumer
from shinglefs.client.background.janitor import Janitor
from shinglefs.client.background.jobs import ClientJobs
from shinglefs.client.background.scheduler import BackgroundScheduler
from shinglefs.client.background.sessions import HEARTBEAT_INTERVAL, ClientSession

__all__ = [
    "CLOSE_BATCH",
    "HEARTBEAT_INTERVAL",
    "BackgroundScheduler",
    "ClientJobs",
    "ClientSession",
    "CloseQueue",
    "Compactor",
    "DeletionConsumer",
    "Janitor",
]
