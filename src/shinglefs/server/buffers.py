"""Payload buffers a storage server reuses (``BufferPool``): a request's payload
is received straight into one (server/service.py), and the buffer comes back
once the request is answered."""

from __future__ import annotations

import threading


class BufferPool:
    """Payload buffers kept for reuse, by power-of-two size from ``POOL_MIN`` up.

    A fresh MiB-sized buffer costs page faults on every byte's page (the
    allocator hands large blocks back to the kernel); reusing one costs
    nothing. A buffer comes back once its request is answered — for a PUT,
    after ``StorageNode.write`` returned, when the store no longer holds it.
    At most ``keep_bytes`` are kept idle."""

    POOL_MIN = 64 * 1024

    def __init__(self, keep_bytes: int) -> None:
        self._keep = keep_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[bytearray]] = {}
        self._kept = 0

    def take(self, nbytes: int) -> tuple[memoryview, bytearray | None]:
        """A view of exactly ``nbytes`` and the buffer to ``give`` back (None: not pooled)."""
        if nbytes < self.POOL_MIN:
            return memoryview(bytearray(nbytes)), None
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            free = self._free.get(size)
            buf = free.pop() if free else None
            if buf is not None:
                self._kept -= size
        if buf is None:
            buf = bytearray(size)
        return memoryview(buf)[:nbytes], buf

    def give(self, buf: bytearray | None) -> None:
        if buf is None:
            return
        with self._lock:
            if self._kept + len(buf) <= self._keep:
                self._free.setdefault(len(buf), []).append(buf)
                self._kept += len(buf)
