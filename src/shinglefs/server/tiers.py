"""The tier a lifetime group's new slices go to (``StorageNode.tier_of``), read
from the directory policies in meta (``MetaStore.placement_tiers``: the
nearest directory's ``DirPolicy.tier``) and remembered per group for
``ttl_s``: a policy set with ``shinglefs policy DIR --tier hot`` applies to
slices placed from at most ``ttl_s`` later (at once for the data
``--move`` rewrites: it ``forget``s). Slices placed before stay where they
are unless moved (docs/cluster.md, "Tiers").

Whoever owns a node and can read meta installs one: the client of an
embedded file system (client/filesystem.py) and a storage server process
(server/process.py), whose node places the slices clients send it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from shinglefs.meta.api import MetaStore

TIER_TTL_S = 5.0
TIER_ENTRIES = 4096


class TierLookup:
    """``lookup(group)``: the tier of ``group``'s directory, or None. Thread-safe.
    A failed read raises once and is then remembered as "no tier" for the
    TTL, so that placements while meta is unreachable do not each wait for it
    (the node places such slices anywhere)."""

    def __init__(self, meta: MetaStore, ttl_s: float = TIER_TTL_S,
                 entries: int = TIER_ENTRIES) -> None:
        self._meta = meta
        self._ttl = ttl_s
        self._entries = entries
        self._known: OrderedDict[int, tuple[str | None, float]] = OrderedDict()
        self._lock = threading.Lock()

    def known(self, group: int) -> bool:
        """Whether ``lookup(group)`` would answer from memory (no meta read):
        a caller that may not block (the FUSE event loop) asks first."""
        with self._lock:
            entry = self._known.get(group)
            return entry is not None and time.monotonic() - entry[1] < self._ttl

    def forget(self, group: int) -> None:
        """Drop what is remembered of ``group``: its next lookup reads meta (a
        tier just set, data about to be moved to it)."""
        with self._lock:
            self._known.pop(group, None)

    def __call__(self, group: int) -> str | None:
        now = time.monotonic()
        with self._lock:
            entry = self._known.get(group)
            if entry is not None and now - entry[1] < self._ttl:
                return entry[0]
        try:
            tier = self._meta.placement_tiers([group]).get(group)  # not under the lock
        except Exception:
            self._remember(group, None, now)
            raise
        self._remember(group, tier, now)
        return tier

    def _remember(self, group: int, tier: str | None, now: float) -> None:
        with self._lock:
            self._known[group] = (tier, now)
            self._known.move_to_end(group)
            while len(self._known) > self._entries:
                self._known.popitem(last=False)
