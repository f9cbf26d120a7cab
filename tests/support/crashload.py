"""A crash workload and its verifier, shared by the SIGKILL and power-cut loops.

The workload runs in a child process against a file system (a FUSE mount
through ``os``, or the Python API) and writes a *journal* of what the file
system acknowledged to a local file outside it, one line per acknowledgment,
before going on. The process serving the file system is then killed at a
random instant (or loses power). ``verify`` reads everything back and checks
the promises of docs/architecture.md ("Ordered commits"):

- a file whose ``close()`` returned reads back exactly (``closed``; for the
  power-cut loop only what was fsynced is promised, the rest is intact,
  absent or shorter);
- a file being written (or fsynced) is absent, or a prefix of its content;
- an fsynced file and an fsynced rename survive; a name replaced by an
  fsynced rename (``ckpt/latest``) holds the last one replaced, or the one
  replacing it at the crash;
- the O_APPEND corpus holds every acknowledged record, whole and in order,
  followed at most by a prefix of the next;
- no file anywhere reads EIO.

Usage (child): ``python crashload.py posix MOUNT JOURNAL TAG``,
``python crashload.py api-power-cut META_URL JOURNAL TAG SECONDS`` or
``python crashload.py api-shared META_URL JOURNAL TAG`` (``run_shared``: the
workload through ``connect()`` in a process that does not own the drives).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

RECORD = 4096 + 17  # corpus records straddle blocks on purpose


def content(name: str, size: int) -> bytes:
    """Deterministic bytes of file ``name`` (a misplaced block shows)."""
    return random.Random(name).randbytes(size)


def record(seq: int) -> bytes:
    head = f"rec{seq:08d}:".encode()
    return head + content(f"rec{seq}", RECORD - len(head))


class PosixOps:
    """The workload's file operations through a mount (plain ``os`` calls)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def p(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def makedirs(self, rel: str) -> None:
        os.makedirs(self.p(rel), exist_ok=True)

    def write(self, rel: str, data: bytes, *, fsync: bool, chunk: int = 1 << 20,
              on_progress: Callable[[], None] | None = None) -> None:
        fd = os.open(self.p(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for i in range(0, len(data), chunk):
                os.write(fd, data[i:i + chunk])
                if on_progress is not None:
                    on_progress()
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def append(self, rel: str, data: bytes) -> None:
        fd = os.open(self.p(rel), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(self.p(src), self.p(dst))

    def size(self, rel: str) -> int:
        try:
            return os.stat(self.p(rel)).st_size
        except FileNotFoundError:
            return 0

    def truncate(self, rel: str, size: int) -> None:
        os.truncate(self.p(rel), size)

    def fsync_dir(self, rel: str) -> None:
        fd = os.open(self.p(rel), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ApiOps(PosixOps):
    """The same operations through ``shinglefs.connect`` (no FUSE)."""

    def __init__(self, fs) -> None:  # type: ignore[no-untyped-def]
        super().__init__("/")
        self.fs = fs

    def p(self, rel: str) -> str:
        return "/" + rel

    def makedirs(self, rel: str) -> None:
        self.fs.makedirs(self.p(rel), exist_ok=True)

    def write(self, rel: str, data: bytes, *, fsync: bool, chunk: int = 1 << 20,
              on_progress: Callable[[], None] | None = None) -> None:
        with self.fs.open(self.p(rel), "wb", buffering=0) as f:
            for i in range(0, len(data), chunk):
                f.write(data[i:i + chunk])
                if on_progress is not None:
                    on_progress()
            if fsync:
                f.fsync()

    def append(self, rel: str, data: bytes) -> None:
        with self.fs.open(self.p(rel), "ab", buffering=0) as f:
            f.write(data)

    def rename(self, src: str, dst: str) -> None:
        self.fs.replace(self.p(src), self.p(dst))

    def size(self, rel: str) -> int:
        try:
            return int(self.fs.stat(self.p(rel)).st_size)
        except FileNotFoundError:
            return 0

    def truncate(self, rel: str, size: int) -> None:
        self.fs.truncate(self.p(rel), size)

    def fsync_dir(self, rel: str) -> None:
        self.fs.vfs.meta.sync()  # the API's directory fsync: meta's commits made durable


def run(ops: PosixOps, journal_path: str, tag: str, *, progress: Callable[[], None] | None = None
        ) -> None:
    """The workload, forever (until killed). Each acknowledgment is journaled first."""
    journal = open(journal_path, "a", buffering=1)  # noqa: SIM115 - lives until killed

    def note(*words: object) -> None:
        journal.write(" ".join(str(w) for w in words) + "\n")

    for d in ("closed", "big", "synced", "ckpt"):
        ops.makedirs(f"{d}")
    rng = random.Random(tag)
    # An appender restarting after a crash drops a torn last record, as a real
    # corpus writer would, and goes on from there.
    seq, torn = divmod(ops.size("corpus.bin"), RECORD)
    if torn:
        ops.truncate("corpus.bin", seq * RECORD)
    n = 0
    while True:
        n += 1
        name = f"{tag}-{n}"
        small = rng.choice([0, 1, 100, 4096, 70_000, 300_000])
        ops.write(f"closed/{name}", content(name, small), fsync=False)
        note("closed", f"closed/{name}", small)
        if n % 3 == 0:
            size = rng.choice([5, 9, 17]) * (1 << 20) + rng.randrange(4096)
            note("begin", f"big/{name}", size)
            ops.write(f"big/{name}", content(name, size), fsync=False, on_progress=progress)
            note("closed", f"big/{name}", size)
        if n % 4 == 0:
            size = rng.choice([10, 5000, 3 << 20])
            note("begin", f"synced/{name}", size)  # mid-write or mid-fsync: a prefix
            ops.write(f"synced/{name}", content(name, size), fsync=True)
            note("synced", f"synced/{name}", size)
        ops.append("corpus.bin", record(seq))
        note("appended", seq)
        seq += 1
        if n % 5 == 0:
            size = rng.choice([1 << 20, 6 << 20])
            ops.write(f"ckpt/.tmp-{name}", content(name, size), fsync=True)
            ops.rename(f"ckpt/.tmp-{name}", f"ckpt/step-{name}")
            ops.fsync_dir("ckpt")
            note("committed", f"ckpt/step-{name}", size)
            # The checkpoint commit over a name that exists: ckpt/latest is
            # replaced, the previous one freed.
            size = rng.choice([4096, 70_000, 1 << 20])
            ops.write("ckpt/.latest.tmp", content(f"latest-{name}", size), fsync=True)
            note("replacing", f"latest-{name}", size)
            ops.rename("ckpt/.latest.tmp", "ckpt/latest")
            ops.fsync_dir("ckpt")
            note("replaced", f"latest-{name}", size)
        if progress is not None:
            progress()


# ---------------------------------------------------------------------------------- verify
@dataclass
class Verdict:
    """What a verification found; ``problems`` empty means every promise held."""

    files_checked: int = 0
    closed_ok: int = 0
    partial_ok: int = 0
    problems: list[str] = field(default_factory=list)


def journal_lines(path: Path) -> Iterator[list[str]]:
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        words = line.split()
        if words:
            yield words


def verify(read: Callable[[str], bytes | None], journal: Path, *, closed_promised: bool
           ) -> Verdict:
    """Check every journaled file with ``read(rel)`` (None when absent; raises
    OSError for EIO). ``closed_promised``: closed-but-not-fsynced files must
    read back exactly (process crash); else they may be absent or shorter
    (power cut) but never unreadable."""
    v = Verdict()
    expected_closed: dict[str, int] = {}
    durable: dict[str, int] = {}
    begun: dict[str, int] = {}
    appended = -1
    # ckpt/latest may hold: the last one replaced, or one whose rename a crash
    # interrupted since (absent while none was ever replaced).
    latest: list[tuple[str, int]] = []
    replaced = False
    for words in journal_lines(journal):
        kind = words[0]
        if kind == "closed":
            expected_closed[words[1]] = int(words[2])
            begun.pop(words[1], None)
        elif kind in ("synced", "committed"):
            durable[words[1]] = int(words[2])
            begun.pop(words[1], None)
        elif kind == "begin":
            begun[words[1]] = int(words[2])
        elif kind == "appended":
            appended = int(words[1])
        elif kind == "replacing":
            latest.append((words[1], int(words[2])))
        elif kind == "replaced":
            latest, replaced = [(words[1], int(words[2]))], True

    def load(rel: str) -> bytes | None:
        v.files_checked += 1
        try:
            return read(rel)
        except OSError as exc:
            v.problems.append(f"{rel}: {errno.errorcode.get(exc.errno or 0, exc.errno)} {exc}")
            return None

    for rel, size in durable.items():
        data = load(rel)
        if data != content(rel.split("/", 1)[1].removeprefix("step-"), size):
            v.problems.append(f"{rel}: fsynced, reads {None if data is None else len(data)} "
                              f"bytes that differ (expected {size})")
    for rel, size in expected_closed.items():
        if rel in durable:
            continue
        data = load(rel)
        want = content(rel.split("/", 1)[1], size)
        if data == want:
            v.closed_ok += 1
        elif closed_promised:
            v.problems.append(f"{rel}: closed, reads {None if data is None else len(data)} "
                              f"bytes, expected {size} exactly")
        elif data is not None and not want.startswith(data):
            v.problems.append(f"{rel}: after a power cut neither intact nor a prefix")
    for rel, size in begun.items():  # being written at the crash
        data = load(rel)
        name = rel.split("/", 1)[1]
        if data is not None and not content(name, size).startswith(data):
            v.problems.append(f"{rel}: mid-write file is not a prefix ({len(data)} bytes)")
        else:
            v.partial_ok += 1
    if latest:
        data = load("ckpt/latest")
        allowed = [content(name, size) for name, size in latest]
        if data not in allowed and not (data is None and not replaced):
            v.problems.append(f"ckpt/latest: {None if data is None else len(data)} bytes, "
                              f"neither the last replaced checkpoint nor the one replacing it")
    corpus = load("corpus.bin") or b""
    whole, tail = divmod(len(corpus), RECORD)
    for seq in range(whole):
        if corpus[seq * RECORD:(seq + 1) * RECORD] != record(seq):
            v.problems.append(f"corpus.bin: record {seq} is damaged")
            break
    if tail and not record(whole).startswith(corpus[whole * RECORD:]):
        v.problems.append(f"corpus.bin: the tail after record {whole - 1} is not a prefix")
    if closed_promised and whole <= appended:
        v.problems.append(f"corpus.bin: {whole} records, {appended + 1} acknowledged")
    return v


def posix_reader(root: Path) -> Callable[[str], bytes | None]:
    def read(rel: str) -> bytes | None:
        try:
            return (root / rel).read_bytes()
        except FileNotFoundError:
            return None
    return read


def power_cut_after(fs, delay: float, seed: str) -> None:  # type: ignore[no-untyped-def]
    """In ``delay`` seconds: every drive loses power (a torn last write), and
    the process dies at once, as a machine does."""
    import threading

    def cut() -> None:
        rng = random.Random(seed)
        node = fs.vfs.node
        for drive_id in node.drive_ids:
            with contextlib.suppress(Exception):  # a drive may be mid-close
                node.store(drive_id).drive.simulate_power_cut(torn=True, rng=rng)
        os._exit(9)

    timer = threading.Timer(delay, cut)
    timer.daemon = True
    timer.start()


def run_shared(url: str, journal_path: str, tag: str) -> None:
    """The workload through ``shinglefs.connect(url)`` in a process beside the one
    that owns the drives (``shinglefs up``, server/share.py), which is killed.

    Journals ``connected TAG`` once open, then runs the workload until an
    operation fails (the owner died): ``failed TAG ERRNO``. While the owner is
    dead it probes the same handle once, a read of ``corpus.bin`` and a new
    300 KB file (``dead-read``/``dead-write TAG ok|ERRNO``; a write that
    returns is journaled ``closed``), then waits for ``JOURNAL.TAG.resume``
    (the owner is back) and writes ``after/TAG`` through the same handle
    (``closed`` or ``stale TAG ERRNO``). An exception that is not an
    ``OSError`` ends the process with a traceback (exit 1)."""
    import time

    import shinglefs

    journal = open(journal_path, "a", buffering=1)  # noqa: SIM115 - lives until exit

    def note(*words: object) -> None:
        journal.write(" ".join(str(w) for w in words) + "\n")

    def name(exc: OSError) -> str:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))

    fs = shinglefs.connect(url)
    ops = ApiOps(fs)
    note("connected", tag)
    try:
        run(ops, journal_path, tag)
    except OSError as exc:
        note("failed", tag, name(exc))
    try:
        fs.read_bytes("/corpus.bin")
        note("dead-read", tag, "ok")
    except OSError as exc:
        note("dead-read", tag, name(exc))
    try:
        ops.write(f"closed/{tag}-dead", content(f"{tag}-dead", 300_000), fsync=False)
        note("closed", f"closed/{tag}-dead", 300_000)
        note("dead-write", tag, "ok")
    except OSError as exc:
        note("dead-write", tag, name(exc))
    resume = Path(f"{journal_path}.{tag}.resume")
    while not resume.exists():
        time.sleep(0.05)
    try:
        ops.makedirs("after")
        ops.write(f"after/{tag}", content(tag, 3 << 20), fsync=False)
        note("closed", f"after/{tag}", 3 << 20)
    except OSError as exc:
        note("stale", tag, name(exc))
    fs.close()


def main(argv: list[str]) -> None:
    kind, where, journal, tag, *rest = argv
    if kind == "posix":
        run(PosixOps(where), journal, tag)
        return
    if kind == "api-shared":
        run_shared(where, journal, tag)
        return
    import shinglefs

    fs = shinglefs.connect(where)
    if kind == "api-power-cut":
        power_cut_after(fs, float(rest[0]), tag)
    run(ApiOps(fs), journal, tag)


if __name__ == "__main__":
    main(sys.argv[1:])
