"""What a client host does in the multi-host tests: one job per process.

Run inside a test host's namespace (``Cluster.spawn``) as
``python hostjob.py JOB --secret-file F ...``; it prints one JSON object per
line on stdout (the test reads them) and exits 0 when the job ran to its end,
whatever it observed — the test judges. Every loop is bounded (a count, a
byte cap or a deadline): a job stops by itself.

Jobs:
- ``write``: slices of deterministic content (``content``) to every server,
  made durable (``flush``); prints ``{"written": [[server, slice, drive], ...]}``.
- ``read``: reads those slices back and compares them byte for byte with
  ``content``; prints ``{"read": [[server, slice, ok, first_bad_offset], ...]}``.
- ``stream``: pipelined pieces to ``--victim`` until it fails (the test kills
  it), printing ``{"streaming": ...}`` after the first acknowledgment, then
  ``{"victim_error": TYPE, ...}``; then writes and reads back a slice on
  every ``--other`` server (``{"others": ...}``) and asks the victim again.
- ``hostile``: a ``RemoteNode`` holding the wrong secret (``--wrong-secret-file``),
  a raw handshake that ignores the server's proof and sends a wrong one, a
  recorded good handshake replayed on a new connection, a frame with a bad
  magic after a good handshake, then a good client (``{"hostile": ...}``).
- ``meta URL``: opens the metadata with ``open_meta`` and prints its format.
- ``meta-partition URL``: opens the metadata, prints ``{"ready": true}``, then
  asks it something every 0.2 s; a call that fails ends the watch (the test
  cut the host off meanwhile): ``{"partition": {"error": TYPE, "blocked_s":
  how long that call took}}``, or ``{"partition": {"error": null, ...}}`` when
  nothing failed within ``--max-seconds`` (a call still blocked then is
  abandoned). It then waits for a call to succeed again (the test restores
  the link) and prints ``{"recovered_s": ...}`` or ``{"recovered_s": null}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

MiB = 1024 * 1024
PIECE = MiB


def content(seed: int, slice_id: int, size: int) -> bytes:
    """The bytes of slice ``slice_id`` in a run with ``seed`` (a misplaced piece shows)."""
    return random.Random(f"{seed}:{slice_id}").randbytes(size)


def slice_ids(address: str, count: int, seed: int) -> list[int]:
    """The slices a run with ``seed`` keeps on the server at ``address`` (by its host)."""
    host_byte = int(address.rpartition(":")[0].rsplit(".", 1)[1])
    return [seed * 1_000_000 + host_byte * 1000 + j for j in range(count)]


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def remote(address: str, secret: bytes, timeout: float = 10.0) -> Any:
    from shinglefs.server.remote import RemoteNode

    return RemoteNode(address, secret, connections=2, timeout=timeout, connect_timeout=5.0)


def job_write(args: argparse.Namespace, secret: bytes) -> None:
    written = []
    for address in args.server:
        with remote(address, secret) as node:
            futures = []
            for sid in slice_ids(address, args.slices, args.seed):
                blob = memoryview(content(args.seed, sid, args.size))
                futures += [(sid, node.submit_write(sid, off, blob[off:off + PIECE], group=1))
                            for off in range(0, len(blob), PIECE)]
            drives = {sid: f.result() for sid, f in futures}
            node.flush()
            written += [[address, sid, drive] for sid, drive in drives.items()]
    say(written=written)


def first_difference(got: bytes | bytearray, want: bytes) -> int | None:
    if got == want:
        return None
    n = min(len(got), len(want))
    return next((i for i in range(n) if got[i] != want[i]), n)


def job_read(args: argparse.Namespace, secret: bytes) -> None:
    results = []
    for address in args.server:
        with remote(address, secret) as node:
            for sid in slice_ids(address, args.slices, args.seed):
                got = node.read(sid, 0, args.size + 1)  # one more: an overlong slice shows
                bad = first_difference(got, content(args.seed, sid, args.size))
                results.append([address, sid, bad is None, bad])
    say(read=results)


def job_stream(args: argparse.Namespace, secret: bytes) -> None:
    from shinglefs.server.errors import NodeError

    piece = os.urandom(args.piece)
    window: deque[Future[int]] = deque()
    sent = acked = 0
    last_ack = time.monotonic()
    deadline = time.monotonic() + args.max_seconds
    error: NodeError | None = None
    with remote(args.victim, secret, timeout=args.timeout) as node:
        try:
            while sent < args.max_bytes and time.monotonic() < deadline:
                sid, off = 900_000_000 + sent // (16 * MiB), sent % (16 * MiB)
                window.append(node.submit_write(sid, off, piece, group=2))
                sent += len(piece)
                if len(window) >= 8 or sent >= args.max_bytes:
                    window.popleft().result()
                    acked += 1
                    last_ack = time.monotonic()
                    if acked == 1:
                        say(streaming=True)
        except NodeError as exc:
            error = exc
    say(victim_error=type(error).__name__ if error else None, message=str(error),
        acked_pieces=acked, after_last_ack_s=round(time.monotonic() - last_ack, 3))
    others = {}
    for address in args.other:
        with remote(address, secret) as node:
            blob = os.urandom(4 * MiB)
            node.write(800_000_000, 0, blob, group=2, durable=True)
            others[address] = node.read(800_000_000, 0, len(blob)) == blob
    say(others=others)
    with remote(args.victim, secret, timeout=args.timeout) as node:
        try:
            node.ping()
            again = "answered"
        except NodeError as exc:
            again = type(exc).__name__
    say(victim_again=again)


def _answer_or_close(sock: socket.socket) -> str:
    """What the server does next on ``sock``: an answer's kind, or closing it."""
    from shinglefs.server.errors import NodeError
    from shinglefs.server.wire import HEADER_SIZE, Kind, Limits, read_frame

    try:
        answer, _ = read_frame(sock, bytearray(HEADER_SIZE), Limits())
        kinds = {int(k): k.name for k in Kind}
        return f"answered {kinds.get(answer.kind, answer.kind)}"
    except (NodeError, OSError) as exc:
        return f"closed ({type(exc).__name__})"


def _raw_handshake(address: str, secret: bytes, replay: tuple[bytes, bytes] | None = None
                   ) -> tuple[socket.socket, bytes, bytes]:
    """HELLO, CHALLENGE, PROOF by hand, ignoring the server's proof; ``replay``:
    send these recorded (hello, proof) frames instead of fresh ones. Returns the
    socket and the frames sent."""
    from shinglefs.server.auth import client_proof
    from shinglefs.server.wire import (
        HEADER_SIZE,
        NONCE_SIZE,
        PROOF_SIZE,
        Header,
        Kind,
        Limits,
        read_frame,
    )

    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    nc = os.urandom(NONCE_SIZE)
    hello = replay[0] if replay else Header(Kind.HELLO, payload_len=NONCE_SIZE).pack() + nc
    sock.sendall(hello)
    _, body = read_frame(sock, bytearray(HEADER_SIZE), Limits())
    proof = replay[1] if replay else (Header(Kind.PROOF, payload_len=PROOF_SIZE).pack()
                                      + client_proof(secret, nc, bytes(body[:NONCE_SIZE])))
    sock.sendall(proof)
    return sock, hello, proof


def job_hostile(args: argparse.Namespace, secret: bytes) -> None:
    """Wrong secret, replayed handshake, malformed frame; then a good client."""
    from shinglefs.server.auth import client_handshake
    from shinglefs.server.errors import NodeError
    from shinglefs.server.wire import HEADER_SIZE, Limits

    address = args.server[0]
    with open(args.wrong_secret_file, "rb") as f:
        wrong = f.read()
    seen: dict[str, str] = {}
    try:
        with remote(address, wrong) as node:
            node.ping()
            seen["wrong_secret_client"] = "answered"
    except NodeError as exc:
        seen["wrong_secret_client"] = type(exc).__name__
    # A client that ignores the server's proof and sends one of the wrong secret.
    sock, _, _ = _raw_handshake(address, wrong)
    with sock:
        seen["wrong_proof"] = _answer_or_close(sock)
    # A good handshake recorded, then replayed verbatim on a new connection.
    sock, hello, proof = _raw_handshake(address, secret)
    with sock:
        seen["recorded"] = _answer_or_close(sock)
    sock, _, _ = _raw_handshake(address, secret, replay=(hello, proof))
    with sock:
        seen["replayed"] = _answer_or_close(sock)
    # An authenticated connection that sends a frame with a bad magic.
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        client_handshake(sock, secret, Limits())
        sock.sendall(b"JUNK" + bytes(HEADER_SIZE - 4))
        seen["malformed"] = _answer_or_close(sock)
    with remote(address, secret) as node:
        node.ping()
        seen["good_client"] = "answered"
    say(hostile=seen)


def job_meta(url: str) -> None:
    from shinglefs.meta import open_meta

    meta = open_meta(url)
    try:
        info = meta.format_info()
    finally:
        meta.close()
    say(meta={"name": info.name, "uuid": info.uuid, "chunk_size": info.chunk_size})


def job_meta_partition(url: str, max_seconds: float) -> None:
    import threading

    from shinglefs.meta import open_meta
    from shinglefs.meta.api import ROOT_INO

    meta = open_meta(url)
    meta.getattr(ROOT_INO)
    say(ready=True)

    def call() -> tuple[str | None, float]:
        """One question, in a thread: (error type or None, seconds), bounded."""
        box: list[str | None] = []

        def ask() -> None:
            try:
                meta.getattr(ROOT_INO)
                box.append(None)
            except Exception as exc:  # reported to the test as is
                box.append(type(exc).__name__)

        started = time.monotonic()
        t = threading.Thread(target=ask, daemon=True)
        t.start()
        t.join(max(0.0, deadline - started))
        return (box[0] if box else "still blocked"), time.monotonic() - started

    deadline = time.monotonic() + max_seconds
    error, took = None, 0.0
    while time.monotonic() < deadline and error is None:
        error, took = call()
        time.sleep(0.2)
    say(partition={"error": error, "blocked_s": round(took, 1)})
    if error is None or error == "still blocked":
        return
    cut_off = time.monotonic()
    deadline = cut_off + max_seconds
    while time.monotonic() < deadline:
        again, _ = call()
        if again is None:
            say(recovered_s=round(time.monotonic() - cut_off, 1))
            return
        time.sleep(0.5)
    say(recovered_s=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one client host's job")
    parser.add_argument("job", choices=["write", "read", "stream", "hostile", "meta",
                                        "meta-partition"])
    parser.add_argument("url", nargs="?", help="meta: the metadata URL")
    parser.add_argument("--secret-file")
    parser.add_argument("--wrong-secret-file")
    parser.add_argument("--server", action="append", default=[])
    parser.add_argument("--slices", type=int, default=2)
    parser.add_argument("--size", type=int, default=3 * MiB + 4321)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--victim")
    parser.add_argument("--other", action="append", default=[])
    parser.add_argument("--piece", type=int, default=256 * 1024)
    parser.add_argument("--max-bytes", type=int, default=256 * MiB)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.job == "meta":
        job_meta(args.url)
        return 0
    if args.job == "meta-partition":
        job_meta_partition(args.url, args.max_seconds)
        return 0
    with open(args.secret_file, "rb") as f:
        secret = f.read()
    {"write": job_write, "read": job_read, "stream": job_stream,
     "hostile": job_hostile}[args.job](args, secret)
    return 0


if __name__ == "__main__":
    sys.exit(main())
