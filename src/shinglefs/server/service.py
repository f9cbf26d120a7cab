"""The storage server's network side: one ``StorageNode`` served over the slice protocol.

``SliceServer`` listens on TCP (optionally TLS), authenticates every connection
(``auth.server_handshake``), and then serves pipelined requests: each
connection has a reader thread that reads frames (payloads with ``recv_into``
straight into a buffer of the server's ``BufferPool``), and shares the
server's pool of worker threads that call the node's blocking methods. A PUT
whose lane (below) is idle is submitted by the reader itself when its drive
takes it at once (no hand-off); the others go to a worker. Whichever thread
completes a request (a worker, a drive's writer, the reader for a PUT stored
at once) sends a small answer itself when the socket takes it at once; other
answers go out through the connection's writer thread, in the order they
are ready.

Ordering: requests of one connection naming the same slice (PUT, LENGTH,
DELETE, and READs of no named drive) run one after another in the order they
arrived (a slice's pieces must be appended in order); other requests, and
requests of other connections, run as workers are free, and answers may come
back out of order (the client matches them by ``request_id``). A READ naming
a drive goes to that drive's read scheduler (server/reads.py: each stream
served in long runs, adjacent READs merged), not to the slice's lane. A FLUSH covers the
writes that were answered before it was sent, not those still in flight,
and forces no other client's queued piece out (``flush_answered``).

Durability: a PUT is answered once the piece is readable (its
``StorageNode.submit`` future completed); with the DURABLE flag, once it is
durable on its drive. PUTs are submitted without urgency and answered when
they complete, so the drive's write scheduler gathers the pieces every client
sends into long zone runs per lifetime group (docs/slice-log.md) instead of
writing each piece alone; a PUT's payload buffer stays with the drive's queue
until then.

Back-pressure: a connection stops being read while it has
``Limits.max_in_flight`` requests or ``max_in_flight_bytes`` bytes (payloads
in and out) outstanding, or before a PUT's payload while the server holds
``held_bytes`` of PUTs for its drive not yet stored (``HeldBytes``, which
expedites the oldest held piece when a reader waits long with nothing
stored: the held pieces may linger for one unread behind it), so fast
clients, however many, are slowed by TCP, not by memory.

Failure isolation: whatever one connection does — a wrong secret, a
replayed handshake or frame, a malformed, oversized or truncated frame, a
handshake not finished within ``handshake_timeout`` (in all, TLS included),
a payload not arrived within ``payload_timeout`` of its header — closes that
connection only, logged as a warning naming the peer and the typed error.
The acceptor outlives any one connection's failure (``_accept_loop``). Node errors
(``SliceMissing``, ``NodeFull``...) are answered to the client as ERROR frames
and the connection stays open.
"""

from __future__ import annotations

import errno as _errno
import functools
import logging
import os
import resource
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, Protocol

from shinglefs.errors import ShingleError
from shinglefs.server.auth import FrameOpener, FrameSealer, check_secret, server_handshake
from shinglefs.server.buffers import BufferPool
from shinglefs.server.errors import (
    AuthFailed,
    FrameError,
    FrameRejected,
    NodeFull,
    PeerClosed,
    UnknownDrive,
)
from shinglefs.server.node import NodeStats, PieceFuture
from shinglefs.server.reads import RUN_BYTES, DriveReads, ReadRequest, ReadStats, SchedulerClosed
from shinglefs.server.scrubbing import serve_scrub
from shinglefs.server.wire import (
    HEADER_SIZE,
    NO_DRIVE,
    REQUESTS,
    RESPONSE_BIT,
    Flag,
    Header,
    Kind,
    Limits,
    decode_header,
    decode_json,
    encode_json,
    recv_exactly,
    send_frame,
)
from shinglefs.server.writes import HeldBytes, drive_scheduler, flush_answered
from shinglefs.store.api import Declined
from shinglefs.store.errors import StoreFull

log = logging.getLogger(__name__)

SLICE_KINDS = frozenset({Kind.PUT, Kind.READ, Kind.LENGTH, Kind.DELETE})
MAX_FLUSH_DRIVES = 4096
DISCARD_CHUNK = 64 * 1024  # a PUT for an unknown drive: its payload read and dropped in these
ACCEPT_BACKOFF_S = 0.1  # no descriptor (EMFILE/ENFILE) or memory for a connection: wait this long
COMPLAIN_EVERY_S = 5.0  # the acceptor logs a recurring failure once per this long
FD_RESERVE = 256  # descriptors kept for all but connections (drives, meta, peers), at most
# TCP keepalive of the server's connections: a peer whose host died is noticed in
# about KEEPIDLE + KEEPINTVL * KEEPCNT seconds (2 min), an idle live one never dropped
KEEPALIVE = (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6))


class ServedNode(Protocol):
    """What the server calls on its node: ``StorageNode``'s ``submit`` (PUT) and
    blocking methods."""

    @property
    def drive_ids(self) -> list[int]: ...

    def submit(self, slice_id: int, offset: int, data: Any, group: int, *,
               drive_id: int | None = None, durable: bool = False, urgent: bool = False,
               wait: bool = True) -> tuple[int, PieceFuture]: ...

    def write(self, slice_id: int, offset: int, data: Any, group: int, *,
              drive_id: int | None = None, durable: bool = False) -> int: ...

    def read_view(self, slice_id: int, offset: int, length: int,
                  drive_id: int | None = None) -> memoryview: ...

    def length(self, slice_id: int, drive_id: int | None = None) -> int: ...

    def delete(self, slice_id: int, drive_id: int | None = None) -> None: ...

    def flush(self, drive_ids: Iterable[int] | None = None) -> None: ...

    def stats(self) -> NodeStats: ...

    def place(self, slice_id: int, group: int, size_hint: int = 0) -> int: ...


def _drive(node: ServedNode, header: Header) -> int | None:
    """The drive a request names (None: any); ``UnknownDrive`` for one the node lacks."""
    if header.drive == NO_DRIVE:
        return None
    known = node.drive_ids
    if header.drive not in known:
        raise UnknownDrive(header.drive, known)
    return header.drive


def _flush_drives(payload: memoryview) -> list[int] | None:
    ids = decode_json(payload)
    if ids is None:
        return None
    if (not isinstance(ids, list) or len(ids) > MAX_FLUSH_DRIVES
            or not all(type(i) is int and 0 <= i < 2**31 for i in ids)):  # not bool
        raise FrameError("FLUSH names drives by a JSON list of small non-negative integers")
    return ids


def dispatch(node: ServedNode, header: Header, payload: memoryview) -> tuple[int, Any]:
    """Carry out one request on the node: ``(arg, body)`` of the answer.

    Raises the node's typed errors; ``FrameError`` for a body that does not parse."""
    kind = Kind(header.kind)
    if kind is Kind.PUT:
        return node.write(header.slice_id, header.offset, payload, header.arg,
                          drive_id=_drive(node, header),
                          durable=bool(header.flags & Flag.DURABLE)), b""
    if kind is Kind.READ:
        data = node.read_view(header.slice_id, header.offset, header.arg, _drive(node, header))
        return data.nbytes, data
    if kind is Kind.LENGTH:
        return node.length(header.slice_id, _drive(node, header)), b""
    if kind is Kind.DELETE:
        node.delete(header.slice_id, _drive(node, header))
        return 0, b""
    if kind is Kind.FLUSH:
        flush_answered(node, _flush_drives(payload))
        return 0, b""
    if kind is Kind.STATS:
        return 0, encode_json(asdict(node.stats()))
    if kind is Kind.DRIVES:
        return 0, encode_json(node.drive_ids)
    if kind is Kind.PLACE:
        return node.place(header.slice_id, header.arg, header.offset), b""
    if kind is Kind.SCRUB:  # a step of a scrub of one drive (server/scrubbing.py)
        return serve_scrub(node, header)
    return header.arg, b""  # PING echoes its arg


def error_body(exc: BaseException) -> bytes:
    """The JSON body of an ERROR answer: the error's class, errno, message and fields."""
    body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc),
                            "errno": getattr(exc, "errno", None) or _errno.EIO}
    for field in ("slice_id", "drive_id"):
        value = getattr(exc, field, None)
        if isinstance(value, int):
            body[field] = value
    return encode_json(body)


def _open_descriptors() -> int:
    """Descriptors this process holds now (Linux: /proc/self/fd; else a guess)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def fit_descriptors(max_connections: int) -> int:
    """``max_connections`` fitted to the descriptors this process may open: the
    soft ``RLIMIT_NOFILE`` is first raised towards the hard limit as far as
    the connections, the descriptors open now and a reserve (a quarter of the
    limit, at most ``FD_RESERVE``: drives, meta, connections to other servers)
    need; when even the hard limit is short, fewer connections (at least 1),
    with a warning. A full server then refuses a connection (accepted and
    closed) instead of failing ``accept`` with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = _open_descriptors()
    need = held + max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            log.info("raised the soft limit of open files from %d to %d", soft, raised)
            soft = raised
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the soft limit of open files (%d): %s", soft, exc)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = soft - held - min(FD_RESERVE, soft // 4)
    if max_connections > room:
        log.warning("serving at most %d connections, not %d: %d open files allowed "
                    "(RLIMIT_NOFILE), %d open now", max(1, room), max_connections, soft, held)
        return max(1, room)
    return max_connections


class _Complaints:
    """Logs a recurring failure (by key) at most once per ``every_s``, with a
    count of those left unlogged since: a failure repeated in a loop costs a
    line per interval, not a traceback per turn."""

    def __init__(self, every_s: float) -> None:
        self._every = every_s
        self._last: dict[str, float] = {}
        self._unsaid: dict[str, int] = {}

    def say(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._every:
            self._unsaid[key] = self._unsaid.get(key, 0) + 1
            return
        self._last[key] = now
        unsaid = self._unsaid.pop(key, 0)
        if unsaid:
            message += f" ({unsaid} more like it in the last %.0f s)"
            args = (*args, now - last if last is not None else 0.0)
        log.warning(message, *args)


class _SliceLanes:
    """Runs tasks on a pool so that tasks with one key (a connection's slice) run one
    at a time, in order; tasks of other keys run beside them."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._queued: dict[tuple[int, int], deque[Callable[[], None]]] = {}

    def run(self, slice_id: tuple[int, int] | None, task: Callable[[], None]) -> None:
        if slice_id is None:
            self._pool.submit(task)
            return
        with self._lock:
            waiting = self._queued.get(slice_id)
            if waiting is not None:
                waiting.append(task)
                return
            self._queued[slice_id] = deque()
        self._pool.submit(self._drain, slice_id, task)

    def idle(self, slice_id: tuple[int, int] | None) -> bool:
        """Has lane ``slice_id`` no task queued or running? Only the connection
        whose reader asks adds tasks to its lanes, so a True stays true until
        that reader runs one (read without the lock: a stale False only sends
        a task to the lane)."""
        return slice_id is not None and slice_id not in self._queued

    def _drain(self, slice_id: tuple[int, int], task: Callable[[], None]) -> None:
        while True:
            task()
            with self._lock:
                waiting = self._queued[slice_id]
                if not waiting:
                    del self._queued[slice_id]
                    return
                task = waiting.popleft()


class _Budget:
    """In-flight requests and bytes of one connection; ``take`` waits for room."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._cond = threading.Condition()
        self._count = 0
        self._bytes = 0
        self._closed = False

    def take(self, nbytes: int) -> bool:
        """Wait for room (one request may always run alone); False once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._count == 0 or (
                self._count < self._limits.max_in_flight
                and self._bytes + nbytes <= self._limits.max_in_flight_bytes))
            if self._closed:
                return False
            self._count += 1
            self._bytes += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._cond:
            self._count -= 1
            self._bytes -= nbytes
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


# (header to seal, body, budget bytes to give back); header None: body is the
# rest of a frame already sealed and partly sent, to go out before anything else
_Answer = tuple[Header | None, Any, int]
INLINE_ANSWER_MAX = 64 * 1024


class _Connection:
    """One authenticated client connection: a reader thread and a writer thread.

    A small answer is sent by the worker that made it when the socket takes it
    at once (non-blocking ``send``: a client that does not read never stalls a
    worker); the rest, and every large answer, goes through the writer thread.
    Frames are sealed and sent under ``_send_lock``, so ``seq`` follows the
    byte stream.

    ``payload_due``: while the reader receives a frame's payload, the
    ``time.monotonic`` by which all of it must have come (None otherwise);
    the server's watch closes the connection when it passes
    (``SliceServer.payload_timeout``)."""

    def __init__(self, server: SliceServer, sock: socket.socket, peer: str) -> None:
        self._server = server
        self._sock = sock
        self.peer = peer
        self._budget = _Budget(server.limits)
        self._outbox: deque[_Answer | None] = deque()
        self._outbox_ready = threading.Condition()
        self._send_lock = threading.Lock()
        self._sealer: FrameSealer | None = None
        self._inline = not isinstance(sock, ssl.SSLSocket)  # MSG_DONTWAIT is plain TCP only
        self._closed = threading.Event()
        self.payload_due: float | None = None
        self.thread = threading.Thread(target=self._run, name=f"slice-conn {peer}", daemon=True)

    def _run(self) -> None:
        server = self._server
        writer: threading.Thread | None = None
        try:
            # one deadline for the whole handshake, TLS included: a peer that sends
            # a byte now and then gets no more time than a silent one
            deadline = time.monotonic() + server.handshake_timeout
            self._sock.settimeout(server.handshake_timeout)
            if isinstance(self._sock, ssl.SSLSocket):
                self._sock.do_handshake()  # counts its timeout for the whole of it
            self._sealer, opener = server_handshake(self._sock, server.secret, server.limits,
                                                    deadline)
            self._sock.settimeout(None)
            writer = threading.Thread(target=self._write_loop,
                                      name=f"slice-send {self.peer}", daemon=True)
            writer.start()
            self._read_loop(opener)
        except PeerClosed as exc:
            if exc.truncated:
                log.warning("connection from %s closed: %s: %s", self.peer,
                            type(exc).__name__, exc)
        except (AuthFailed, FrameError, FrameRejected) as exc:
            log.warning("connection from %s refused and closed: %s: %s", self.peer,
                        type(exc).__name__, exc)
        except ssl.SSLError as exc:
            log.warning("connection from %s refused and closed: TLSError: %s", self.peer, exc)
        except TimeoutError:
            log.warning("connection from %s closed: AuthFailed: no handshake within %g s",
                        self.peer, server.handshake_timeout)
        except OSError as exc:
            if not self._closed.is_set():
                log.info("connection from %s closed: %s", self.peer, exc)
        except Exception:  # a bug must not take the server down with it
            log.exception("connection from %s failed", self.peer)
        finally:
            self.close()
            if writer is not None:
                writer.join()
            server.forget(self)

    def _read_loop(self, opener: FrameOpener) -> None:
        limits = self._server.limits
        header_buf = bytearray(HEADER_SIZE)
        while True:
            recv_exactly(self._sock, header_buf)
            header = decode_header(header_buf, limits)
            opener.check(header, header_buf)
            if header.kind not in REQUESTS:
                raise FrameError(f"a client sent frame kind {header.kind}, not a request")
            if header.kind == Kind.PUT and not self._known_drive(header.drive):
                if not self._refuse_put(header):
                    return
                continue
            cost = header.payload_len + (header.arg if header.kind == Kind.READ else 0)
            if not self._budget.take(cost):
                return
            if header.kind == Kind.PUT and not self._server.held.take(
                    header.payload_len, header.drive,
                    functools.partial(self._server.in_zone_run, header), self._closed):
                return
            payload, pooled = self._server.buffers.take(header.payload_len)
            if header.payload_len:
                try:
                    self._receive(payload)
                except BaseException:  # the connection is closing: no PUT to hold
                    if header.kind == Kind.PUT:
                        self._server.held.give(header.payload_len, header.drive)
                    raise
            reads = self._server.drive_reads.get(header.drive)
            if header.kind == Kind.READ and reads is not None:
                self._queue_read(reads, header, cost)
                continue
            # one connection's requests for a slice keep their order; other
            # connections (readers of the same slice) are not held behind them
            lane = (id(self), header.slice_id) if header.kind in SLICE_KINDS else None
            if (header.kind == Kind.PUT and self._server.lanes.idle(lane)
                    and self._submit(header, payload, pooled, cost, wait=False)):
                continue  # queued on its drive from here: no worker hand-off
            self._server.lanes.run(
                lane, functools.partial(self._serve, header, payload, pooled, cost))

    def _receive(self, payload: memoryview) -> None:
        """Receive a frame's payload, all of it within ``payload_timeout`` (the
        server's watch closes the connection otherwise: a client that stalls,
        or whose host died, mid-frame gives back what it holds). ``PeerClosed``
        (truncated) when the stream ends first."""
        self.payload_due = time.monotonic() + self._server.payload_timeout
        try:
            recv_exactly(self._sock, payload)
        except PeerClosed:
            raise PeerClosed(truncated=True) from None
        finally:
            self.payload_due = None

    def _known_drive(self, drive: int) -> bool:
        """Does a request's drive field name a drive of the node (or none: any)?"""
        return drive == NO_DRIVE or drive in self._server.node.drive_ids

    def _refuse_put(self, header: Header) -> bool:
        """A PUT for a drive the node lacks: its payload read in ``DISCARD_CHUNK``s
        and dropped (no bytes held, no buffer of its size), then answered with
        ``UnknownDrive``; the connection goes on. False once it is closed."""
        if not self._budget.take(0):
            return False
        scratch = memoryview(bytearray(min(header.payload_len, DISCARD_CHUNK)))
        left = header.payload_len
        try:
            while left:
                self._receive(scratch[:min(left, DISCARD_CHUNK)])
                left -= min(left, DISCARD_CHUNK)
        except BaseException:
            self._budget.give(0)
            raise
        error = UnknownDrive(header.drive, self._server.node.drive_ids)
        self._answer(header, Kind.ERROR | RESPONSE_BIT, 0, error_body(error), 0)
        return True

    def _queue_read(self, reads: DriveReads, header: Header, cost: int) -> None:
        """A READ of a drive: to its read scheduler (server/reads.py), not a lane,
        so a stream's READs wait together and are served in runs (clients READ
        only what was answered: readable)."""
        request = ReadRequest(header.offset, header.arg, header.slice_id,
                              functools.partial(self._read_done, header, cost),
                              self._closed.is_set)
        try:
            reads.submit(request)
        except SchedulerClosed as exc:
            self._read_done(header, cost, None, exc)

    def _read_done(self, header: Header, cost: int, data: memoryview | None,
                   exc: BaseException | None) -> None:
        """A scheduled READ's answer: its bytes, or the node's error."""
        if exc is None:
            assert data is not None
            self._answer(header, Kind.READ | RESPONSE_BIT, data.nbytes, data, cost)
            return
        if not isinstance(exc, ShingleError | SchedulerClosed):
            log.error("READ from %s failed: %s: %s", self.peer, type(exc).__name__, exc)
        self._answer(header, Kind.ERROR | RESPONSE_BIT, 0, error_body(exc), cost)

    def _serve(self, header: Header, payload: memoryview, pooled: bytearray | None,
               cost: int) -> None:
        """Worker thread: run one request, queue its answer (never raises)."""
        if self._closed.is_set():
            payload.release()
            self._server.buffers.give(pooled)
            self._budget.give(cost)
            if header.kind == Kind.PUT:
                self._server.held.give(header.payload_len, header.drive)
            return
        if header.kind == Kind.PUT:
            self._submit(header, payload, pooled, cost)
            return
        kind = header.kind | RESPONSE_BIT
        body: Any = b""
        arg = 0
        try:
            arg, body = dispatch(self._server.node, header, payload)
        except FrameError as exc:  # a body that does not parse: answered, the connection goes on
            log.warning("%s from %s refused: FrameError: %s", Kind(header.kind).name,
                        self.peer, exc)
            kind, body = Kind.ERROR | RESPONSE_BIT, error_body(exc)
        except ShingleError as exc:
            kind, body = Kind.ERROR | RESPONSE_BIT, error_body(exc)
        except Exception as exc:
            log.exception("request %s from %s failed", Kind(header.kind).name, self.peer)
            kind, body = Kind.ERROR | RESPONSE_BIT, error_body(exc)
        finally:
            payload.release()
            self._server.buffers.give(pooled)
        self._answer(header, kind, arg, body, cost)

    def _submit(self, header: Header, payload: memoryview, pooled: bytearray | None,
                cost: int, *, wait: bool = True) -> bool:
        """A PUT: queue the piece on its drive (in this slice's lane, or from the
        reader while the lane is idle: in order either way) and answer when it
        is stored; the payload is held until then. ``wait=False``: False, with
        nothing queued or answered, when the drive cannot take it at once
        (``Declined``: the caller hands it to the lane, whose worker waits)."""
        def done(drive_id: int, future: PieceFuture) -> None:
            exc = future.exception()
            self._let_go(payload, pooled)
            self._server.held.give(header.payload_len, header.drive, future)
            if exc is None:
                self._answer(header, header.kind | RESPONSE_BIT, drive_id, b"", cost)
                return
            if isinstance(exc, StoreFull):
                exc = NodeFull(header.slice_id, drive_id, str(exc))
            if not isinstance(exc, ShingleError):
                log.error("PUT from %s failed: %s", self.peer, exc)
            self._answer(header, Kind.ERROR | RESPONSE_BIT, 0, error_body(exc), cost)

        node = self._server.node
        try:
            drive_id, future = node.submit(
                header.slice_id, header.offset, payload, header.arg,
                drive_id=_drive(node, header), durable=bool(header.flags & Flag.DURABLE),
                wait=wait)
        except Exception as exc:
            if isinstance(exc, Declined) and not wait:
                return False
            self._let_go(payload, pooled)
            self._server.held.give(header.payload_len, header.drive)
            if not isinstance(exc, ShingleError):
                log.exception("PUT from %s failed", self.peer)
            self._answer(header, Kind.ERROR | RESPONSE_BIT, 0, error_body(exc), cost)
            return True
        self._server.held.submitted(header.drive, future)
        future.add_done_callback(functools.partial(done, drive_id))
        return True

    def _let_go(self, payload: memoryview, pooled: bytearray | None) -> None:
        """A request is done with its payload: release the view, reuse the buffer."""
        try:
            payload.release()
        except BufferError:  # a view of it is still referenced: the buffer is not reused
            return
        self._server.buffers.give(pooled)

    def _answer(self, header: Header, kind: int, arg: int, body: Any, cost: int) -> None:
        answer = Header(kind, request_id=header.request_id, slice_id=header.slice_id,
                        offset=header.offset, arg=arg, drive=header.drive, payload_len=len(body))
        if not self._send_now(answer, body, cost):
            with self._outbox_ready:
                self._outbox.append((answer, body, cost))
                self._outbox_ready.notify()

    def _send_now(self, answer: Header, body: Any, cost: int) -> bool:
        """Send a small answer from this worker if the socket takes it without
        waiting and nothing waits in the outbox; whatever it does not take is
        queued first for the writer. False: nothing sent (the caller queues the
        answer). While anything is queued the worker never sends: a queued item
        may be the unsent rest of a frame, and bytes sent before it would land
        inside that frame (the client would read them as its payload). The
        reader sends the answer of a PUT that completed as it submitted it:
        queueing it for the writer instead (one more wake-up, but no wake-up of the client's
        reader onto the reader's core mid-stream) measured the same (``bench
        wire``, 4 MiB pieces, 22 interleaved pairs: -6 % with 1 connection,
        +5 % with 4)."""
        if (not self._inline or len(body) > INLINE_ANSWER_MAX
                or not self._send_lock.acquire(blocking=False)):
            return False
        try:
            if self._closed.is_set() or self._sealer is None:
                return False
            if self._outbox:  # no lock needed: a rest is queued only under _send_lock
                return False
            raw = self._sealer.seal(answer) + bytes(body)
            try:
                sent = self._sock.send(raw, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                log.info("sending to %s failed: %s", self.peer, exc)
                self.close()
                self._budget.give(cost)
                return True
            if sent == len(raw):
                self._budget.give(cost)
            else:
                with self._outbox_ready:
                    self._outbox.appendleft((None, raw[sent:], cost))
                    self._outbox_ready.notify()
            return True
        finally:
            self._send_lock.release()

    def _write_loop(self) -> None:
        while True:
            with self._outbox_ready:
                self._outbox_ready.wait_for(lambda: bool(self._outbox))
            with self._send_lock:  # taken before popping: a frame's rest goes first
                with self._outbox_ready:
                    item = self._outbox.popleft()
                if item is None:
                    return
                header, body, cost = item
                try:
                    if not self._closed.is_set():
                        assert self._sealer is not None
                        if header is None:
                            self._sock.sendall(body)
                        else:
                            send_frame(self._sock, self._sealer.seal(header), body)
                except (OSError, ssl.SSLError) as exc:
                    log.info("sending to %s failed: %s", self.peer, exc)
                    self.close()
                finally:
                    self._budget.give(cost)

    def close(self) -> None:
        """Close the socket (unblocks the reader), stop the writer. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._budget.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._outbox_ready:
            self._outbox.append(None)
            self._outbox_ready.notify()


class SliceServer:
    """Serves one node over TCP to the clients that hold the cluster secret.

    ``start()`` binds and returns at once (threads serve); ``address`` is the
    bound ``(host, port)`` (port 0 picks a free one). ``close()`` stops
    accepting, closes every connection and waits for the workers; it does not
    close the node (its owner does). ``pool_bytes``: idle payload buffers kept
    for reuse (``BufferPool``). ``held_bytes``: PUT payloads held at once per drive,
    all connections together (``HeldBytes``; at most the drive's write
    queue), which a piece of the drive's zone run may exceed by
    ``zone_run_bytes`` (``StoreConfig.switch_bytes``). ``ssl_context``: a server-side context to
    wrap every connection in TLS (the HMAC handshake runs inside it). ``read_threads``
    per drive serve its READs in runs of ``read_run_bytes`` per stream (server/reads.py;
    0: READs go to the workers as they come).

    Time bounds: a connection must finish its handshake (TLS included) within
    ``handshake_timeout`` in all, and a frame's payload, once its header came,
    must arrive within ``payload_timeout`` (else that connection is closed and
    what it held given back); an idle authenticated connection is kept, a dead
    peer's noticed by TCP keepalive (``KEEPALIVE``). ``start`` fits
    ``max_connections`` to the descriptors the process may open
    (``fit_descriptors``), and the acceptor outlives any one connection's
    failure (descriptors or threads exhausted: it waits ``ACCEPT_BACKOFF_S``
    and logs once per ``COMPLAIN_EVERY_S``).
    """

    def __init__(self, node: ServedNode, secret: bytes, *, host: str = "127.0.0.1",
                 port: int = 0, limits: Limits | None = None, workers: int = 16,
                 max_connections: int = 1024, handshake_timeout: float = 5.0,
                 payload_timeout: float = 30.0, ssl_context: ssl.SSLContext | None = None,
                 pool_bytes: int = 128 * 1024 * 1024,
                 held_bytes: int = 256 * 1024 * 1024, zone_run_bytes: int = 0,
                 read_threads: int = 4, read_run_bytes: int = RUN_BYTES) -> None:
        self.node = node
        self.secret = check_secret(secret)
        self.limits = limits or Limits()
        self.handshake_timeout = handshake_timeout
        self.payload_timeout = payload_timeout
        self._bind = (host, port)
        self._max_connections = max_connections
        self._ssl = ssl_context
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="slice-worker")
        self.lanes = _SliceLanes(self._pool)
        self.buffers = BufferPool(pool_bytes)
        self.held = HeldBytes(held_bytes, zone_run_bytes)
        for drive_id in node.drive_ids:
            scheduler = drive_scheduler(node, drive_id)
            if scheduler is not None:
                scheduler.zone_run.on_switch = self.held.wake
        # READs of a drive served in runs per stream (server/reads.py); 0 threads: none
        self.drive_reads: dict[int, DriveReads] = {} if read_threads < 1 else {
            d: DriveReads(functools.partial(node.read_view, drive_id=d), name=str(d),
                          threads=read_threads, run_bytes=read_run_bytes)
            for d in node.drive_ids}
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._watch: threading.Thread | None = None
        self._closing = False
        self._stopping = threading.Event()  # close() began: the acceptor's and watch's waits end
        self._complaints = _Complaints(COMPLAIN_EVERY_S)

    @property
    def max_connections(self) -> int:
        """Connections served at once; more are accepted and closed at once
        (``start`` may have lowered it: ``fit_descriptors``)."""
        return self._max_connections

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None, "start() the server first"
        host, port = self._listener.getsockname()[:2]
        return host, port

    def start(self) -> SliceServer:
        self._max_connections = fit_descriptors(self._max_connections)
        family = socket.AF_INET6 if ":" in self._bind[0] else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self._bind)
        listener.listen(256)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept_loop, name="slice-accept",
                                          daemon=True)
        self._acceptor.start()
        self._watch = threading.Thread(target=self._watch_loop, name="slice-watch", daemon=True)
        self._watch.start()
        log.info("serving slices on %s:%d", *self.address)
        return self

    def _accept_loop(self) -> None:
        """Accept connections until ``close``. Nothing one connection does or
        lacks stops it: a failed ``accept`` (no descriptor, no memory) waits
        ``ACCEPT_BACKOFF_S`` before the next, a connection that cannot be set
        up (its socket options, TLS wrapping, its thread) is closed and its
        slot given back; each logged once per ``COMPLAIN_EVERY_S``, no traceback."""
        assert self._listener is not None
        while True:
            try:
                sock, addr = self._listener.accept()
            except OSError as exc:
                if self._closing:
                    return
                self._complaints.say("accept", "accepting connections failed: %s", exc)
                if exc.errno not in (_errno.ECONNABORTED, _errno.EPROTO, _errno.EPERM):
                    self._stopping.wait(ACCEPT_BACKOFF_S)  # EMFILE/ENFILE/ENOMEM...: no spin
                continue
            peer = f"{addr[0]}:{addr[1]}"
            try:
                self._admit(sock, peer)
            except Exception as exc:  # this connection only: the acceptor goes on
                sock.close()
                self._complaints.say("admit", "connection from %s dropped: cannot serve it: "
                                     "%s: %s", peer, type(exc).__name__, exc)

    def _admit(self, sock: socket.socket, peer: str) -> None:
        """Serve one accepted connection in a thread of its own, or refuse it
        (closed) when the server is full or closing. Raises what setting it up
        raised, with the connection closed and forgotten."""
        with self._lock:
            count = len(self._connections)
            refuse = self._closing or count >= self._max_connections
        if refuse:
            sock.close()
            self._complaints.say("full", "connection from %s refused: %d connections open "
                                 "(max_connections %d)", peer, count, self._max_connections)
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in KEEPALIVE:
                if hasattr(socket, name):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_side=True,
                                             do_handshake_on_connect=False)
            conn = _Connection(self, sock, peer)
        except BaseException:
            sock.close()  # the TLS socket once wrapped: the plain one is detached
            raise
        with self._lock:  # only this thread adds: the count checked above still holds
            if self._closing:
                sock.close()
                return
            self._connections.add(conn)
        try:
            conn.thread.start()
        except BaseException:
            self.forget(conn)  # first: its slot is free once its peer sees the close
            conn.close()
            raise

    def _watch_loop(self) -> None:
        """Close every connection whose payload is overdue (``payload_due``),
        checking about ten times per ``payload_timeout`` (at most every 0.5 s)."""
        tick = min(0.5, max(0.01, self.payload_timeout / 10))
        while not self._stopping.wait(tick):
            now = time.monotonic()
            with self._lock:
                conns = list(self._connections)
            for conn in conns:
                due = conn.payload_due
                if due is not None and due < now and conn.payload_due is due:
                    log.warning("connection from %s closed: a frame's payload did not come "
                                "within %g s", conn.peer, self.payload_timeout)
                    conn.close()

    def in_zone_run(self, header: Header) -> bool:
        """Is a PUT's group the one its drive's writer stays on (``ZoneRun``)?"""
        if header.drive == NO_DRIVE:
            return False
        try:
            scheduler = drive_scheduler(self.node, header.drive)
        except ShingleError:
            return False
        return scheduler is not None and scheduler.zone_run.group == header.arg

    def forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    def close(self) -> None:
        """Stop serving: no new connections, every open one closed, workers finished."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            conns = list(self._connections)
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        if self._acceptor is not None:
            self._acceptor.join()
        if self._watch is not None:
            self._watch.join()
        for conn in conns:
            conn.close()
        for conn in conns:
            if conn.thread.ident is not None:  # not one whose thread could not start
                conn.thread.join()
        self._pool.shutdown(wait=True)
        for reads in self.drive_reads.values():
            reads.close()

    def read_stats(self) -> dict[int, ReadStats]:
        """Each drive's read scheduler counters (``ReadStats``)."""
        return {d: reads.stats() for d, reads in self.drive_reads.items()}

    def __enter__(self) -> SliceServer:
        return self.start() if self._listener is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()
