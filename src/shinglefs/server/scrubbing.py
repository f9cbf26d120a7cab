"""A storage server scrubs its own drives when asked over the slice protocol (SCRUB).

``shinglefs scrub`` of a file system on storage servers (client/recovery.py)
cannot open the drives: each server holds its own. It asks every live server
in turn, drive by drive, in steps (``scrub_server``), and the server runs
store/scrub.py's ``scrub_drive`` on the drive named:

- A SCRUB request names one drive (header ``drive``), a rate limit (``arg``:
  bytes per second; 0: none, else at least ``MIN_RATE_BYTES``) and a time
  budget (``offset``: milliseconds; 0: ``DEFAULT_STEP_S``, at most
  ``MAX_STEP_S``). ``serve_scrub`` verifies that drive's slices until the
  budget is spent (one extent at least, so that every step moves on) or the
  drive is done, and answers with a ``ScrubStep`` as JSON (``arg``: the bytes
  verified in this step).
- The scrub's position and the damage found so far are the drive's state file
  beside the drive (``scrub_state_path``: ``DRIVE_FILE.scrub``, under
  /var/lib/shinglefs/scrub for a block device), saved as for a local scrub:
  the next step continues where this one stopped, and so does a scrub asked
  again after its client went away. A finished scrub removes it.
- The rate holds across steps: the server keeps one ``RateLimit`` per drive
  while the requests' rate stays the same (a step starts no read before the
  last step's reads are paid for).
- One scrub per drive at a time: a SCRUB of a drive another one is scrubbing
  is answered with ``ScrubBusy`` (EBUSY).

Why steps: a whole drive takes hours, far beyond any request timeout. A step
is answered within its budget (or one extent's turn at the rate and its
read, ``STEP_SLACK_S`` at most beyond the budget), the client shows
progress between steps, and a server that is stopped waits for one step at
most.

Security: a SCRUB is a request like any other — only a holder of the cluster
secret gets a connection (server/auth.py) — and its parameters are in the
header, which the connection's MAC covers. It reads the drive and writes
nothing but the state file; damaged slices stay where they are.
"""

from __future__ import annotations

import errno as _errno
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shinglefs.server.errors import FrameError, NodeError, UnknownDrive, WireError
from shinglefs.server.node import StorageNode, drive_path
from shinglefs.server.wire import NO_DRIVE, Header, encode_json
from shinglefs.store.scrub import RateLimit, scrub_drive
from shinglefs.store.slice_store import SliceStore

if TYPE_CHECKING:
    from shinglefs.server.remote import RemoteNode

log = logging.getLogger(__name__)

DEFAULT_STEP_S = 5.0  # a step's budget when the request gives none
MAX_STEP_S = 10.0  # the longest step a server runs, whatever the request asks
# a client's wait beyond the budget: a step's one extent waiting for its turn at
# the lowest rate (a 64 MiB slice at 1 MiB/s) and its read on a slow drive
STEP_SLACK_S = 120.0
MIN_RATE_BYTES = 1 << 20  # a rate limit below 1 MiB/s is refused (a drive would take months)
MAX_REPORTED = 500  # damaged slices listed in one answer (all are counted): < 1 MiB of JSON
MAX_WHY = 300  # characters of one damaged slice's reason in an answer
SCRUB_DIR_FOR_DEVICES = Path("/var/lib/shinglefs/scrub")


class ScrubBusy(NodeError):
    """Another scrub of this drive is running on the server."""

    errno = _errno.EBUSY

    def __init__(self, drive_id: int) -> None:
        super().__init__(f"drive {drive_id} is being scrubbed already (another `shinglefs "
                         "scrub` is running)")
        self.drive_id = drive_id


class ScrubUnsupported(NodeError):
    """The drive (or the node serving it) has no slice log to scrub."""

    errno = _errno.EOPNOTSUPP


class BadScrubRequest(NodeError):
    """A SCRUB that names no drive, or asks for a rate below ``MIN_RATE_BYTES``."""

    errno = _errno.EINVAL


class ScrubStateError(NodeError):
    """The drive's scrub state file cannot be written."""


def scrub_state_path(spec: str) -> Path:
    """Where a drive's scrub position is kept: beside a drive file, or under
    /var/lib/shinglefs/scrub for a block device (the directory is made)."""
    path = drive_path(spec)
    if path.startswith("/dev/"):
        base = SCRUB_DIR_FOR_DEVICES
        base.mkdir(parents=True, exist_ok=True)
        return base / (path.strip("/").replace("/", "_") + ".scrub")
    return Path(path.rstrip("/") + ".scrub")


@dataclass(frozen=True, slots=True)
class ScrubStep:
    """Where one drive's scrub stands after a step (a SCRUB's answer).

    ``bytes_read``: verified in this scrub of the drive so far (a resumed
    scrub counts the steps before); ``read``: in this step. ``damaged``: the
    slices found damaged so far (id -> what failed), at most ``MAX_REPORTED``
    of them; ``damaged_total`` counts them all. ``rate_bytes``: the limit the
    server applied (0: none)."""

    drive_id: int
    finished: bool
    position: int
    bytes_read: int
    read: int
    damaged: dict[int, str] = field(default_factory=dict)
    damaged_total: int = 0
    rate_bytes: int = 0

    @property
    def complete(self) -> bool:
        """The drive was scrubbed to its end and every damaged slice is listed."""
        return self.finished and self.damaged_total == len(self.damaged)

    def to_json(self) -> bytes:
        body = asdict(self)
        body["damaged"] = {str(k): v for k, v in self.damaged.items()}
        return encode_json(body)

    @classmethod
    def from_json(cls, info: Any) -> ScrubStep:
        """A SCRUB answer's JSON (a key this client does not know, a newer
        server's, is left out); ``FrameError`` when it does not describe a step."""
        try:
            damaged = {int(k): str(v) for k, v in info.pop("damaged").items()}
            known = {k: v for k, v in info.items() if k in cls.__dataclass_fields__}
            step = cls(damaged=damaged, **known)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise FrameError(f"a SCRUB answer does not describe a scrub step: {exc}") from None
        for name in ("drive_id", "position", "bytes_read", "read", "damaged_total",
                     "rate_bytes"):
            if not isinstance(getattr(step, name), int):
                raise FrameError(f"a SCRUB answer's {name} is not an integer")
        return step


# ---- the server's side ----------------------------------------------------------------


@dataclass
class _DriveScrub:
    """A drive's scrub on this server: one at a time, and the rate across steps."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    limit: RateLimit | None = None


_drives: dict[Path, _DriveScrub] = {}
_drives_lock = threading.Lock()


def _drive_scrub(state_path: Path) -> _DriveScrub:
    with _drives_lock:
        return _drives.setdefault(state_path, _DriveScrub())


def _store_and_spec(node: object, drive_id: int) -> tuple[SliceStore, str]:
    if not isinstance(node, StorageNode):
        raise ScrubUnsupported(f"this server's node ({type(node).__name__}) has no drives "
                               "of its own to scrub")
    if drive_id not in node.drive_ids:
        raise UnknownDrive(drive_id, node.drive_ids)
    store = node.store(drive_id)
    if not isinstance(store, SliceStore):
        raise ScrubUnsupported(f"drive {drive_id} is not a slice log ({type(store).__name__})")
    (spec,) = [d.spec for d in node.stats().drives if d.drive_id == drive_id]
    return store, spec


def serve_scrub(node: object, header: Header) -> tuple[int, bytes]:
    """Carry out a SCRUB (the module docstring): ``(bytes verified in this step,
    the ``ScrubStep`` as JSON)``. Blocks for the step's budget at most, or for
    its one extent's turn at the rate and its read. Raises ``BadScrubRequest`` (no drive named, a rate below
    ``MIN_RATE_BYTES``), ``UnknownDrive``, ``ScrubUnsupported``, ``ScrubBusy``,
    ``ScrubStateError``."""
    if header.drive == NO_DRIVE:
        raise BadScrubRequest("a SCRUB names the drive to scrub")
    if 0 < header.arg < MIN_RATE_BYTES:
        raise BadScrubRequest(f"a scrub's rate limit is at least {MIN_RATE_BYTES} bytes/s "
                              f"(or none), not {header.arg}")
    store, spec = _store_and_spec(node, header.drive)
    state_path = scrub_state_path(spec)
    drive = _drive_scrub(state_path)
    if not drive.lock.acquire(blocking=False):
        raise ScrubBusy(header.drive)
    try:
        rate = header.arg
        if drive.limit is None or drive.limit.rate != (rate or None):
            drive.limit = RateLimit(rate or None)
        budget = min(header.offset / 1000 or DEFAULT_STEP_S, MAX_STEP_S)
        deadline = time.monotonic() + budget
        read = [0]

        def count(nbytes: int) -> None:
            read[0] += nbytes

        try:
            state = scrub_drive(store, state_path, limit=drive.limit, progress=count,
                                stop=lambda: read[0] > 0 and time.monotonic() >= deadline)
        except OSError as exc:
            error = ScrubStateError(f"drive {header.drive}: the scrub state {state_path} "
                                    f"cannot be written: {exc.strerror or exc}")
            error.errno = exc.errno or _errno.EIO
            raise error from None
    finally:
        drive.lock.release()
    log.info("scrub of drive %d (%s): %d bytes verified in %.1f s at %s, %s, %d damaged",
             header.drive, spec, read[0], budget - max(0.0, deadline - time.monotonic()),
             f"{rate / 2**20:.1f} MiB/s" if rate else "no rate limit",
             "finished" if state.finished else f"at {state.position}", len(state.damaged))
    listed = dict(sorted(state.damaged.items())[:MAX_REPORTED])
    step = ScrubStep(header.drive, state.finished, state.position, state.bytes_read, read[0],
                     {sid: why[:MAX_WHY] for sid, why in listed.items()},
                     len(state.damaged), rate)
    return read[0], step.to_json()


# ---- the client's side ----------------------------------------------------------------


@dataclass
class ServerScrub:
    """One storage server's part of a scrub: each drive's last step, the drives
    whose scrub the server refused (``failed``: why), or why the server was not
    scrubbed at all (``error``: down, stopped, unreachable, the connection lost)."""

    server_id: int
    address: str
    drives: dict[int, ScrubStep] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.server_id} ({self.address})"

    @property
    def finished(self) -> bool:
        return self.error is None and not self.failed and all(
            d.finished for d in self.drives.values())

    @property
    def bytes_read(self) -> int:
        return sum(d.bytes_read for d in self.drives.values())


def scrub_timeout(step_s: float) -> float:
    """How long a client waits for a step's answer (its ``RemoteNode`` timeout)."""
    return min(step_s or DEFAULT_STEP_S, MAX_STEP_S) + STEP_SLACK_S


def scrub_server(remote: RemoteNode, outcome: ServerScrub, *, rate_bytes: int = 0,
                 step_s: float = DEFAULT_STEP_S, progress: Callable[[int], None] | None = None,
                 stop: Callable[[], bool] | None = None) -> None:
    """Scrub every drive of the server behind ``remote``, one after another, in
    steps until each is finished (or ``stop()``), into ``outcome``: a drive the
    server refuses to scrub (busy, not a slice log...) goes to ``failed``.
    ``progress(bytes)`` after each step. Raises ``WireError`` when the server
    cannot be reached or the connection breaks (the steps done stay in
    ``outcome``; the server keeps the position for the next scrub)."""
    for drive_id in remote.drive_ids:
        while True:
            try:
                step = remote.scrub_step(drive_id, rate_bytes=rate_bytes, budget_s=step_s)
            except WireError:
                raise
            except NodeError as exc:
                outcome.failed[drive_id] = str(exc)
                break
            outcome.drives[drive_id] = step
            if progress is not None and step.read:
                progress(step.read)
            if step.finished or (stop is not None and stop()):
                break
