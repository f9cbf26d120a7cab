"""The client side of the slice protocol: a storage server used like a ``StorageNode``.

``RemoteNode`` keeps ``connections`` authenticated TCP (optionally TLS)
connections to one server and pipelines requests on them: ``submit_write``
and ``submit_read`` return futures at once, and many requests are in flight
per connection. All requests naming one slice go over the same connection
(chosen by a hash of the slice id), so a slice's pieces reach the server in order;
other slices spread over the others. The blocking methods (``write``,
``read``, ``flush``, ``delete``, ``length``, ``stats``, ``drive_ids``,
``place``, ``ping``) mirror ``StorageNode``'s and wait for the answer;
``scrub_step`` asks the server to scrub one of its drives for a while.

Errors, all typed (``server.errors``): the node's own (``SliceMissing``,
``NodeFull``, ``UnknownDrive``; any other as ``RemoteNodeError`` with the
server's errno) when the server answered with one; ``ServerUnreachable`` when
no connection could be made; ``ConnectionLost`` for every request outstanding
on a connection that broke (the server died or closed it); ``RequestTimeout``
when no answer came within ``timeout`` seconds — that connection is then
dropped with its other requests (``ConnectionLost``), since an answer that
comes later could no longer be matched; a request nobody waits on with a
timeout (a pipelined PUT's future), or a send blocked on a server that stopped
reading, is ended the same way by the watch (``_Watch``) after ``timeout``
plus ``WATCH_GRACE_S``. So a caller waits at most ``timeout`` (and the grace)
for any request, and a dead server is noticed as soon as its kernel resets
the connection. A broken connection is opened anew by the next request.

Durability as on the server: ``write`` returns when the piece is readable
there (``durable=True``: durable on its drive); ``flush`` covers the writes
already answered.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import os
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from shinglefs.server.auth import check_secret, client_handshake
from shinglefs.server.errors import (
    ConnectionLost,
    FrameError,
    NodeError,
    NodeFull,
    PeerClosed,
    RemoteNodeError,
    RequestTimeout,
    ServerUnreachable,
    SliceMissing,
    UnknownDrive,
    WireError,
)
from shinglefs.server.node import DriveStats, NodeStats
from shinglefs.server.scrubbing import ScrubStep
from shinglefs.server.wire import (
    HEADER_SIZE,
    NO_DRIVE,
    Flag,
    Header,
    Kind,
    Limits,
    decode_header,
    decode_json,
    encode_json,
    recv_exactly,
    send_frame,
    until,
)
from shinglefs.store.api import StoreStats
from shinglefs.store.zonerun import WriteFigures
from shinglefs.zoned.fileio import Payload

log = logging.getLogger(__name__)

_GOLDEN = 0x9E3779B97F4A7C15
_U64 = (1 << 64) - 1

Answer = tuple[Header, bytearray | memoryview]
Finish = Callable[[Header, Any], Any]  # an answer's (header, body) -> the future's result
Pick = Callable[[Header, Any], Any]  # a checked answer's (header, body) -> the caller's value


def _settle(future: Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    """Complete a request's future, unless its caller cancelled it (the answer is
    then dropped: never an error in the reader thread)."""
    try:
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass


@dataclasses.dataclass(slots=True)
class _Request:
    """One outstanding request, as its connection's reader thread sees it."""

    future: Future[Any]
    finish: Finish | None  # what the reader makes of the answer (None: the answer)
    into: memoryview | None  # readinto: the caller's buffer, written only once claimed
    room: int | None  # READ: the longest answer payload it accepts (its length)
    kind: int  # its frame kind
    since: float  # time.monotonic() when it was made: the watch times it out


def _arg(header: Header, _body: Any) -> int:
    return header.arg


def _body(_header: Header, body: Any) -> Any:
    return body


def _received(header: Header, _body: Any) -> int:
    return header.payload_len


_unknown_logged: set[tuple[str, str]] = set()


def _known(cls: type, record: dict[str, Any]) -> dict[str, Any]:
    """``record``'s keys that are fields of the dataclass ``cls``; the others
    (a newer server's) logged once per key at debug and left out."""
    names = {f.name for f in dataclasses.fields(cls)}
    for key in record.keys() - names:
        if (cls.__name__, key) not in _unknown_logged:
            _unknown_logged.add((cls.__name__, key))
            log.debug("a STATS answer's %s has a key this client ignores: %r",
                      cls.__name__, key)
    return {k: v for k, v in record.items() if k in names}


def node_stats_of(info: Any) -> NodeStats:
    """A STATS answer's JSON as ``NodeStats``, as any version wrote it: a key
    this client does not know is ignored (logged once per key at debug), a
    field with a default here that the server did not send (an older one)
    takes it; ``FrameError`` when one without a default is missing."""
    try:
        drives = []
        for d in info.pop("drives"):
            store = d.pop("store")
            store["live_bytes_per_zone"] = {
                int(k): v for k, v in store.get("live_bytes_per_zone", {}).items()}
            if isinstance(d.get("writes"), dict):
                d["writes"] = WriteFigures(**_known(WriteFigures, d["writes"]))
            drives.append(DriveStats(store=StoreStats(**_known(StoreStats, store)),
                                     **_known(DriveStats, d)))
        return NodeStats(drives=drives, **_known(NodeStats, info))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise FrameError(f"a STATS answer does not describe a node: {exc}") from None


def remote_error(body: bytearray | memoryview) -> NodeError:
    """The typed error an ERROR answer describes."""
    info = decode_json(body)
    if not isinstance(info, dict):
        raise FrameError("an ERROR answer's body is not a JSON object")
    kind, message = str(info.get("type", "")), str(info.get("message", ""))
    slice_id, drive_id = info.get("slice_id"), info.get("drive_id")
    if kind == "SliceMissing" and isinstance(slice_id, int):
        return SliceMissing(slice_id, drive_id if isinstance(drive_id, int) else None)
    if kind == "NodeFull" and isinstance(slice_id, int):
        full = NodeFull(slice_id, drive_id if isinstance(drive_id, int) else None)
        full.args = (message,)  # the server's message already names slice and drive
        return full
    if kind == "UnknownDrive" and isinstance(drive_id, int):
        return UnknownDrive(drive_id, [])
    errno = info.get("errno")
    return RemoteNodeError(kind or "error", message, errno if isinstance(errno, int) else 5)


# A request whose payload is at least this large is handed to its connection's
# sender thread instead of being sent by its caller; see ``_Channel.call``.
HANDOFF_BYTES = 256 * 1024
# The bytes of payload a connection's sender holds before callers wait for room.
OUTBOX_BYTES = 16 * 1024 * 1024
# The watch fails a connection whose oldest request has waited the client's
# timeout plus this grace (a caller waiting with that timeout hears first).
WATCH_GRACE_S = 0.5
WATCH_TICK_S = 0.25


class _Watch:
    """One thread for every connection of the process, started while there are
    any: each ``WATCH_TICK_S`` it fails a connection whose oldest outstanding
    request is older than its client's ``timeout`` plus ``WATCH_GRACE_S``
    (``_Channel.expire``). So the timeout holds for a request nobody waits on
    with a timeout (a pipelined PUT's future) and for a caller blocked in
    sending to a server that stopped reading: failing the connection shuts
    its socket down, which ends the send."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: set[_Channel] = set()
        self._thread: threading.Thread | None = None

    def forget(self) -> None:
        """In a forked child: no thread runs, and the parent's connections are
        not this process's to watch (or fail)."""
        self._lock = threading.Lock()
        self._channels = set()
        self._thread = None

    def add(self, channel: _Channel) -> None:
        with self._lock:
            self._channels.add(channel)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="slice-watch",
                                                daemon=True)
                self._thread.start()

    def discard(self, channel: _Channel) -> None:
        with self._lock:
            self._channels.discard(channel)

    def _loop(self) -> None:
        while True:
            time.sleep(WATCH_TICK_S)
            with self._lock:
                channels = list(self._channels)
                if not channels:
                    self._thread = None
                    return
            now = time.monotonic()
            for channel in channels:
                channel.expire(now)


_watch = _Watch()
os.register_at_fork(after_in_child=_watch.forget)


class _Channel:
    """One authenticated connection: requests sent in order, answers matched by id.

    A small request is sent by its caller's thread; a large one (``HANDOFF_BYTES``)
    goes to the connection's sender thread, so that one caller feeding several
    connections keeps them all busy at once (measured: one thread sending 4 MiB
    pieces over 4 loopback connections, bench wire).
    """

    def __init__(self, address: tuple[str, int], label: str, secret: bytes, limits: Limits,
                 connect_timeout: float, ssl_context: ssl.SSLContext | None,
                 server_hostname: str | None, timeout: float | None = None) -> None:
        self.label = label
        self._limits = limits
        self._timeout = timeout
        deadline = time.monotonic() + connect_timeout  # connect, TLS and handshake together
        try:
            sock = socket.create_connection(address, timeout=connect_timeout)
        except OSError as exc:
            raise ServerUnreachable(label, str(exc) or type(exc).__name__) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if ssl_context is not None:
                until(sock, deadline)  # do_handshake counts the timeout for the whole of it
                sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname)
            self._sealer, self._opener, self.max_piece = client_handshake(
                sock, secret, limits, deadline)
        except (PeerClosed, ConnectionError) as exc:
            sock.close()
            # It proved the secret (or never got that far): not a refusal of ours.
            raise ServerUnreachable(
                label, f"it closed the connection during the handshake ({exc}): at its "
                "max_connections, stopping, or it timed the handshake out",
                hint="retry later; if it persists, check the server's log and its "
                     "max_connections") from None
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise ServerUnreachable(label, f"handshake failed: {exc}") from None
        except FrameError as exc:
            sock.close()
            raise ServerUnreachable(label, f"not a slice server (or not speaking TLS as "
                                           f"asked): {exc}") from None
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        self._sock = sock
        self._lock = threading.Lock()
        # Guards the sealer, the outbox and the socket's send side: frames leave
        # in the order they were sealed, whoever sends them.
        self._send_lock = threading.Lock()
        self._outbox: deque[tuple[bytes, Any, int]] = deque()  # (sealed header, payload, size)
        self._outbox_bytes = 0
        self._sender_busy = False  # the sender thread is sending a frame it took
        self._outbox_changed = threading.Condition(self._send_lock)
        self._sender: threading.Thread | None = None
        self._pending: dict[int, _Request] = {}  # by request id
        self._failure: WireError | None = None
        self._reader = threading.Thread(target=self._read_loop, name=f"slice-recv {label}",
                                        daemon=True)
        self._reader.start()
        if timeout is not None:
            _watch.add(self)

    @property
    def alive(self) -> bool:
        return self._failure is None

    def call(self, header: Header, payload: Any = b"",
             into: memoryview | None = None, finish: Finish | None = None) -> Future[Any]:
        """Send one request; the future gets its answer (``finish``: what
        ``finish(header, body)`` returns or raises, run by the reader thread) or a
        ``WireError``. A READ answer longer than the request's length is a
        ``FrameError`` (that future gets it; the connection fails).

        ``into`` (a READ of ``len(into)`` bytes): its answer's payload is received
        straight into it, but only if the reader claims the future first
        (``set_running_or_notify_cancel``): a future cancelled before its answer
        came has the payload drained into a scratch buffer and dropped, so
        ``into`` is never written after a successful ``cancel()``."""
        future: Future[Any] = Future()
        room = header.arg if header.kind == Kind.READ else None
        with self._lock:
            if self._failure is not None:
                raise self._failure
            self._pending[header.request_id] = _Request(future, finish, into, room,
                                                        header.kind, time.monotonic())
        size = header.payload_len
        try:
            with self._send_lock:
                if size < HANDOFF_BYTES and not self._outbox and not self._sender_busy:
                    send_frame(self._sock, self._sealer.seal(header), payload)
                    return future
                while (self._outbox_bytes > OUTBOX_BYTES and self._failure is None):
                    self._outbox_changed.wait()
                if self._failure is not None:
                    return future  # fail() settled it
                self._outbox.append((self._sealer.seal(header), payload, size))
                self._outbox_bytes += size
                if self._sender is None:
                    self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                                    name=f"slice-send {self.label}")
                    self._sender.start()
                self._outbox_changed.notify_all()
        except (OSError, ssl.SSLError) as exc:
            self.fail(ConnectionLost(self.label, f"sending failed: {exc}"))
        return future

    def _send_loop(self) -> None:
        """The sender thread: send the outbox's frames in order, outside the lock
        (callers queue more meanwhile; none sends while a frame is under way)."""
        try:
            while True:
                with self._send_lock:
                    self._sender_busy = False
                    self._outbox_changed.notify_all()
                    while not self._outbox and self._failure is None:
                        self._outbox_changed.wait()
                    if self._failure is not None:
                        return
                    sealed, payload, size = self._outbox.popleft()
                    self._outbox_bytes -= size
                    self._sender_busy = True
                send_frame(self._sock, sealed, payload)
        except (OSError, ssl.SSLError) as exc:
            self.fail(ConnectionLost(self.label, f"sending failed: {exc}"))

    def _read_loop(self) -> None:
        """Receive answers until the connection breaks. A request taken out of
        ``_pending`` is always settled here (its answer, or the connection's
        error when the stream breaks in the middle of its payload)."""
        header_buf = bytearray(HEADER_SIZE)
        request: _Request | None = None
        try:
            while True:
                request = None
                recv_exactly(self._sock, header_buf)
                header = decode_header(header_buf, self._limits)
                self._opener.check(header, header_buf)
                with self._lock:
                    request = self._pending.pop(header.request_id, None)
                if request is None:
                    raise FrameError(f"an answer to request {header.request_id}, "
                                     "which is not outstanding")
                if (request.room is not None and header.kind == Kind.READ.response
                        and header.payload_len > request.room):
                    error = FrameError(f"a READ answer of {header.payload_len} bytes to a "
                                       f"request for {request.room}")
                    _settle(request.future, error=error)
                    raise error
                payload = self._payload_of(request, header)
                if header.payload_len:
                    recv_exactly(self._sock, payload)
                if request.finish is None:
                    _settle(request.future, (header, payload))
                    continue
                try:
                    value = request.finish(header, payload)
                except BaseException as exc:
                    _settle(request.future, error=exc)
                else:
                    _settle(request.future, value)
        except WireError as exc:
            self._broken(request, ConnectionLost(self.label, f"{type(exc).__name__}: {exc}"))
        except (OSError, ssl.SSLError) as exc:
            self._broken(request, ConnectionLost(self.label, str(exc) or type(exc).__name__))

    @staticmethod
    def _payload_of(request: _Request, header: Header) -> bytearray | memoryview:
        """Where an answer's payload goes: the caller's buffer when the request has
        one, the answer is its READ's and the reader claims the future before its
        caller cancels it; else a fresh buffer (a cancelled request's: dropped)."""
        if (request.into is not None and header.kind == Kind.READ.response
                and request.future.set_running_or_notify_cancel()):
            return request.into[:header.payload_len]
        return bytearray(header.payload_len)

    def _broken(self, request: _Request | None, error: WireError) -> None:
        """The stream broke (``request``: the one whose answer was being received).
        The connection fails before that request's caller hears of it: a caller
        woken by its error must find the connection failed, never send on it."""
        self.fail(error)
        if request is not None:
            _settle(request.future, error=error)

    def expire(self, now: float) -> None:
        """The watch's check (``_Watch``): when the oldest outstanding request has
        waited ``timeout`` plus ``WATCH_GRACE_S``, the connection fails; the
        requests older than ``timeout`` get ``RequestTimeout``, the others
        ``ConnectionLost``."""
        assert self._timeout is not None
        with self._lock:
            oldest = next(iter(self._pending.values()), None)  # in the order made: oldest first
            if (self._failure is not None or oldest is None
                    or now - oldest.since <= self._timeout + WATCH_GRACE_S):
                return
            late = {rid: r for rid, r in self._pending.items()
                    if now - r.since > self._timeout}
            for rid in late:
                del self._pending[rid]
        error = RequestTimeout(self.label, Kind(oldest.kind).name, self._timeout)
        self.fail(ConnectionLost(self.label, str(error)))  # first: see _broken
        for request in late.values():
            _settle(request.future, error=RequestTimeout(self.label, Kind(request.kind).name,
                                                         self._timeout))
        log.warning("%s (%d requests timed out)", error, len(late))

    def fail(self, error: WireError) -> None:
        """Break the connection: every outstanding request gets ``error``. Idempotent."""
        _watch.discard(self)
        with self._lock:
            if self._failure is not None:
                return
            self._failure = error
            pending, self._pending = self._pending, {}
        try:  # first: a send blocked on a full socket (holding the send lock) returns
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._send_lock:  # the sender thread stops; callers waiting for room return
            self._outbox.clear()
            self._outbox_bytes = 0
            self._outbox_changed.notify_all()
        for request in pending.values():
            _settle(request.future, error=error)
        if pending:
            log.warning("%s (%d requests outstanding)", error, len(pending))

    def close(self) -> None:
        self.fail(ConnectionLost(self.label, "closed by this client"))
        self._reader.join()
        if self._sender is not None:
            self._sender.join()


class RemoteNode:
    """A storage server reached over the slice protocol (see the module docstring).

    ``address``: ``(host, port)`` or ``"host:port"``. ``secret``: the cluster
    secret. ``timeout``: the longest wait for any answer. ``ssl_context``: a
    client-side context to speak TLS (``server_hostname`` checked against the
    server's certificate when the context asks for it). ``retry_after``: how
    long a refused connection is remembered (see ``_channel``). Thread-safe.
    """

    retry_after = 1.0

    def __init__(self, address: tuple[str, int] | str, secret: bytes, *,
                 connections: int = 4, timeout: float = 60.0, connect_timeout: float = 5.0,
                 limits: Limits | None = None, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None) -> None:
        if isinstance(address, str):
            host, _, port = address.rpartition(":")
            address = (host.strip("[]"), int(port))
        if connections < 1:
            raise ValueError("a remote node needs at least one connection")
        self.address = address
        self.label = f"{address[0]}:{address[1]}"
        self.timeout = timeout
        self._secret = check_secret(secret)
        self._limits = limits or Limits()
        self._connect_timeout = connect_timeout
        self._ssl = ssl_context
        self._server_hostname = server_hostname or address[0]
        self._channels: list[_Channel | None] = [None] * connections
        self._connecting = [threading.Lock() for _ in range(connections)]
        self._refused_at: float | None = None  # when a connection was last refused
        self._refused_why = ""
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._spread = itertools.count()
        self._closed = False

    # ------------------------------------------------------------------ plumbing
    def _channel(self, index: int) -> _Channel:
        """Connection ``index``, opened anew if it is missing or broken.

        Connections open in parallel (a lock each). After a refused connection,
        callers within ``retry_after`` seconds get ``ServerUnreachable`` at once
        instead of each waiting ``connect_timeout`` in turn for a dead server."""
        channel = self._channels[index]
        if channel is not None and channel.alive:
            return channel
        with self._connecting[index]:
            if self._closed:
                raise ConnectionLost(self.label, "this client was closed")
            channel = self._channels[index]
            if channel is not None and channel.alive:
                return channel
            refused_at = self._refused_at
            if refused_at is not None and time.monotonic() - refused_at < self.retry_after:
                raise ServerUnreachable(self.label, f"{self._refused_why} (refused "
                                        f"{time.monotonic() - refused_at:.1f} s ago)")
            try:
                channel = _Channel(self.address, self.label, self._secret, self._limits,
                                   self._connect_timeout, self._ssl, self._server_hostname,
                                   self.timeout)
            except ServerUnreachable as exc:
                self._refused_at, self._refused_why = time.monotonic(), str(exc)
                raise
            self._refused_at = None
            with self._lock:
                if self._closed:
                    channel.close()
                    raise ConnectionLost(self.label, "this client was closed")
                self._channels[index] = channel
            return channel

    def connection_of(self, slice_id: int) -> int:
        """The connection (0 .. ``connections`` - 1) every request naming
        ``slice_id`` goes over: Fibonacci hashing, so ids with a common stride
        still spread."""
        return (((slice_id * _GOLDEN) & _U64) >> 32) % len(self._channels)

    def _submit(self, kind: Kind, *, slice_id: int | None = None, offset: int = 0,
                arg: int = 0, drive_id: int | None = None, flags: int = 0,
                payload: Any = b"", into: memoryview | None = None,
                pick: Pick | None = None) -> tuple[_Channel, Future[Any]]:
        """Send a request on its slice's connection: its future gets the answer,
        or (``pick``) what ``pick`` takes from it once checked (``_checked``)."""
        if slice_id is None:
            index, sid = next(self._spread) % len(self._channels), 0
        else:
            index, sid = self.connection_of(slice_id), slice_id
        channel = self._channel(index)
        header = Header(kind, flags=flags, request_id=next(self._ids), slice_id=sid,
                        offset=offset, arg=arg,
                        drive=NO_DRIVE if drive_id is None else drive_id,
                        payload_len=payload.nbytes if isinstance(payload, Payload)
                        else memoryview(payload).nbytes)
        finish = None if pick is None else functools.partial(self._picked, channel, kind, pick)
        return channel, channel.call(header, payload, into, finish)

    def _answer(self, channel: _Channel, future: Future[Answer], kind: Kind,
                give_up_after: float | None = None) -> Answer:
        """Wait for an answer (at most ``timeout``); raise the error it carries.

        ``give_up_after`` (shorter than ``timeout``): stop waiting then with
        ``RequestTimeout`` but keep the connection and its other requests (a
        server that is only slow answers them; this answer, if it comes, is
        dropped)."""
        if give_up_after is not None and give_up_after < self.timeout:
            try:
                header, body = future.result(give_up_after)
            except concurrent.futures.TimeoutError:
                raise RequestTimeout(self.label, kind.name, give_up_after) from None
            return self._checked(channel, kind, header, body)
        try:
            header, body = future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            error = RequestTimeout(self.label, kind.name, self.timeout)
            channel.fail(ConnectionLost(self.label, str(error)))
            raise error from None
        return self._checked(channel, kind, header, body)

    def _checked(self, channel: _Channel, kind: Kind, header: Header, body: Any) -> Answer:
        if header.kind == Kind.ERROR.response:
            raise remote_error(body)
        if header.kind != kind.response:
            error2 = FrameError(f"answer of kind {header.kind} to a {kind.name}")
            channel.fail(ConnectionLost(self.label, str(error2)))
            raise error2
        return header, body

    def _call(self, kind: Kind, **fields: Any) -> Answer:
        channel, future = self._submit(kind, **fields)
        return self._answer(channel, future, kind)

    def _picked(self, channel: _Channel, kind: Kind, pick: Pick, header: Header,
                body: Any) -> Any:
        """``pick`` of a checked answer (the channel's reader calls it: no
        second future, no hand-off)."""
        return pick(*self._checked(channel, kind, header, body))

    # ------------------------------------------------------------------ pipelined I/O
    def submit_write(self, slice_id: int, offset: int, data: Any, group: int, *,
                     drive_id: int | None = None, durable: bool = False) -> Future[int]:
        """Send a piece now; the future gives its drive id once stored (see ``write``).
        ``data`` must not change until the future completes."""
        return self._submit(Kind.PUT, slice_id=slice_id, offset=offset, arg=group,
                            drive_id=drive_id, payload=data,
                            flags=Flag.DURABLE if durable else 0, pick=_arg)[1]

    def submit_read(self, slice_id: int, offset: int, length: int,
                    drive_id: int | None = None) -> Future[bytearray]:
        """Ask for a range now; the future gives its bytes (see ``read``)."""
        return self._submit(Kind.READ, slice_id=slice_id, offset=offset, arg=length,
                            drive_id=drive_id, pick=_body)[1]

    def submit_readinto(self, slice_id: int, offset: int, buffer: Any,
                        drive_id: int | None = None) -> Future[int]:
        """Ask for ``len(buffer)`` bytes at ``offset``, received straight into ``buffer``
        (no copy, no allocation); the future gives how many came (short at the
        slice's end). ``buffer`` belongs to the request until the future is done,
        or until its ``cancel()`` returns True: from then on it is never written
        (the answer, if it comes, is drained and dropped). A ``cancel()`` that
        returns False means the answer is landing in ``buffer``: wait for the
        future. No timeout of its own (``readinto`` has the client's)."""
        return self._submit_readinto(slice_id, offset, buffer, drive_id)[1]

    def _submit_readinto(self, slice_id: int, offset: int, buffer: Any,
                         drive_id: int | None) -> tuple[_Channel, Future[int]]:
        view = memoryview(buffer).cast("B")
        return self._submit(Kind.READ, slice_id=slice_id, offset=offset, arg=view.nbytes,
                            drive_id=drive_id, into=view, pick=_received)

    # ------------------------------------------------------------------ StorageNode's calls
    def write(self, slice_id: int, offset: int, data: Any, group: int, *,
              drive_id: int | None = None, durable: bool = False) -> int:
        """Store a piece of ``slice_id`` at ``offset`` (== its length so far); returns
        the drive id. Readable on the server on return; durable when ``durable``."""
        header, _ = self._call(Kind.PUT, slice_id=slice_id, offset=offset, arg=group,
                               drive_id=drive_id, payload=data,
                               flags=Flag.DURABLE if durable else 0)
        return header.arg

    def read(self, slice_id: int, offset: int, length: int,
             drive_id: int | None = None, *, give_up_after: float | None = None) -> bytearray:
        """Bytes ``[offset, offset+length)`` of a slice (short at its end).
        ``give_up_after``: ``RequestTimeout`` after that long, the connection kept
        (a caller with another replica to try; see ``_answer``)."""
        channel, future = self._submit(Kind.READ, slice_id=slice_id, offset=offset, arg=length,
                                       drive_id=drive_id)
        body = self._answer(channel, future, Kind.READ, give_up_after)[1]
        assert isinstance(body, bytearray)
        return body

    def readinto(self, slice_id: int, offset: int, buffer: Any,
                 drive_id: int | None = None) -> int:
        """``read`` straight into ``buffer``; returns the bytes that came.

        Raises as ``read`` does, ``RequestTimeout`` after ``timeout`` seconds
        without the answer (the connection is then dropped with its other
        requests, as for every call). Once it returns or raises, ``buffer`` is
        never written again by this client."""
        channel, future = self._submit_readinto(slice_id, offset, buffer, drive_id)
        try:
            n: int = future.result(self.timeout)
            return n
        except concurrent.futures.TimeoutError:
            pass
        error = RequestTimeout(self.label, Kind.READ.name, self.timeout)
        claimed = not future.cancel()  # else cancelled first: the reader never writes buffer
        channel.fail(ConnectionLost(self.label, str(error)))
        if claimed:  # the reader is receiving into buffer: the broken stream stops it
            concurrent.futures.wait([future])
        raise error from None

    def length(self, slice_id: int, drive_id: int | None = None) -> int:
        return self._call(Kind.LENGTH, slice_id=slice_id, drive_id=drive_id)[0].arg

    def delete(self, slice_id: int, drive_id: int | None = None) -> None:
        """Delete a slice on the server (idempotent)."""
        self._call(Kind.DELETE, slice_id=slice_id, drive_id=drive_id)

    def flush(self, drive_ids: Iterable[int] | None = None) -> None:
        """Make the writes already answered durable on the given drives (default all)."""
        body = b"" if drive_ids is None else encode_json(list(drive_ids))
        self._call(Kind.FLUSH, payload=body)

    def place(self, slice_id: int, group: int, size_hint: int = 0) -> int:
        return self._call(Kind.PLACE, slice_id=slice_id, arg=group, offset=size_hint)[0].arg

    @property
    def drive_ids(self) -> list[int]:
        ids = decode_json(self._call(Kind.DRIVES)[1])
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                for i in ids):
            raise FrameError("a DRIVES answer is not a list of drive ids")
        return ids

    def stats(self) -> NodeStats:
        """The server's ``StorageNode.stats`` (``node_stats_of`` its answer:
        any version's)."""
        return node_stats_of(decode_json(self._call(Kind.STATS)[1]))

    def scrub_step(self, drive_id: int, *, rate_bytes: int = 0,
                   budget_s: float = 0.0) -> ScrubStep:
        """One step of the server's scrub of drive ``drive_id`` (SCRUB,
        server/scrubbing.py): it verifies that drive's slices for about
        ``budget_s`` (0: the server's default step) at no more than ``rate_bytes``
        per second (0: no limit), from where the last step stopped, and answers
        where the scrub stands. Give this client a ``timeout`` longer than the
        budget (``scrubbing.scrub_timeout``). Raises ``ScrubBusy`` and the others
        as ``RemoteNodeError``, ``UnknownDrive``, and the ``WireError``s."""
        _, body = self._call(Kind.SCRUB, drive_id=drive_id, arg=max(0, int(rate_bytes)),
                             offset=max(0, int(budget_s * 1000)))
        return ScrubStep.from_json(decode_json(body))

    def ping(self) -> None:
        """One round trip on one connection (opening it if needed)."""
        self._call(Kind.PING)

    def close(self) -> None:
        """Close every connection; outstanding requests fail with ``ConnectionLost``."""
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, [None] * len(self._channels)
        for channel in channels:
            if channel is not None:
                channel.close()

    def __enter__(self) -> RemoteNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
