"""Several processes at once, and processes killed mid-operation.

Workers are separate PROCESSES (multiprocessing, spawn) with their own store,
as mounted clients are. Afterwards ``check_consistency`` must find nothing:
nlink matches entries, no orphans or dangling entries, no directory cycles,
counters exact, slice refcounts match references.
"""

from __future__ import annotations

import errno as E
import multiprocessing as mp
import os
import random
import signal
import time
import traceback

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO, SessionInfo, SliceRef
from shinglefs.meta.errors import FsError

EXPECTED = {E.ENOENT, E.EEXIST, E.ENOTEMPTY, E.EISDIR, E.ENOTDIR, E.EINVAL, E.EPERM}
SPAWN = mp.get_context("spawn")


def _find(store, dirs, name):
    for d in dirs:
        try:
            return d, store.lookup(d, name)
        except FsError:
            continue
    return None, None


def churn(url: str, dirs: list[int], seed: int, n_ops: int, out) -> None:
    """Random creates, mkdirs, renames (files and directories, across and into
    each other), links, unlinks and rmdirs over a shared name pool."""
    store = open_meta(url)
    rnd = random.Random(seed)
    names = [b"n%d" % i for i in range(12)]
    done, unexpected = 0, []
    for _ in range(n_ops):
        op = rnd.choice(
            [
                "create",
                "mkdir",
                "rename",
                "rename",
                "nest",
                "unnest",
                "link",
                "unlink",
                "rmdir",
            ]
        )
        parent, name = rnd.choice(dirs), rnd.choice(names)
        try:
            if op == "create":
                f = store.create(parent, name, 0o644)
                sid = store.next_slice_id()
                store.commit_slice(f.ino, 0, SliceRef(sid, 0, 4096), 4096)
            elif op == "mkdir":
                store.mkdir(parent, name, 0o755)
            elif op == "rename":
                store.rename(parent, name, rnd.choice(dirs), rnd.choice(names))
            elif op == "nest":
                # move one pool directory into another (cycles must fail with EINVAL)
                _, a = _find(store, dirs, name)
                bname = rnd.choice(names)
                pb, b = _find(store, dirs, bname)
                if a is not None and b is not None and a.is_dir and b.is_dir:
                    store.rename(pb, bname, a.ino, b"x")
            elif op == "unnest":
                _, a = _find(store, dirs, name)
                if a is not None and a.is_dir:
                    store.rename(a.ino, b"x", rnd.choice(dirs), rnd.choice(names))
            elif op == "link":
                _, a = _find(store, dirs, name)
                if a is not None:
                    store.link(a.ino, rnd.choice(dirs), rnd.choice(names))
            elif op == "unlink":
                store.unlink(parent, name)
            else:
                store.rmdir(parent, name)
            done += 1
        except FsError as exc:
            if exc.errno not in EXPECTED:
                unexpected.append(f"{op}: {exc!r}")
        except Exception:
            unexpected.append(f"{op}: {traceback.format_exc()}")
    store.close()
    out.put((seed, done, unexpected))


def test_two_processes_churning_the_same_directories_stay_consistent(meta, meta_url, check):
    dirs = [meta.mkdir(ROOT_INO, b"d%d" % i, 0o777).ino for i in range(3)]
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=churn, args=(meta_url, dirs, seed, 250, out)) for seed in (1, 2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for seed, done, unexpected in results:
        assert unexpected == [], f"worker {seed}: {unexpected[:3]}"
        assert done > 20, f"worker {seed} achieved almost nothing ({done} ops)"
    check()
    # The counters are exact: statfs equals a recount of the namespace.
    stat = meta.statfs()
    seen, used, stack = {ROOT_INO}, 0, [ROOT_INO]
    while stack:
        for e in meta.readdir(stack.pop(), 0, 10_000):
            if e.ino not in seen:
                seen.add(e.ino)
                used += e.attr.size
                if e.attr.is_dir:
                    stack.append(e.ino)
    assert (stat.inodes, stat.used_bytes) == (len(seen), used)


def swap_nesting(url: str, a: int, b: int, first: bool, rounds: int, out) -> None:
    """Move directory ``a`` into ``b`` and back (or ``b`` into ``a``), racing a peer."""
    store = open_meta(url)
    errors: list[str] = []
    for _ in range(rounds):
        try:
            if first:
                store.rename(ROOT_INO, b"A", b, b"A")
                store.rename(b, b"A", ROOT_INO, b"A")
            else:
                store.rename(ROOT_INO, b"B", a, b"B")
                store.rename(a, b"B", ROOT_INO, b"B")
        except FsError as exc:
            if exc.errno not in (E.EINVAL, E.ENOENT):
                errors.append(repr(exc))
    store.close()
    out.put(errors)


def test_racing_directory_moves_never_make_a_cycle(meta, meta_url, check):
    a = meta.mkdir(ROOT_INO, b"A", 0o755).ino
    b = meta.mkdir(ROOT_INO, b"B", 0o755).ino
    out = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=swap_nesting, args=(meta_url, a, b, first, 60, out))
        for first in (True, False)
    ]
    for p in procs:
        p.start()
    errors = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert errors == [[], []]
    check()


def crashy_worker(url: str, started, seed: int) -> None:
    """Loop the atomic-replace pattern (write tmp, rename over 'current') and
    other operations until killed."""
    store = open_meta(url)
    session = store.register_session(SessionInfo(host="crashy", pid=os.getpid()))
    rnd = random.Random(seed)
    i = 0
    while True:
        i += 1
        tmp = b"tmp%d-%d" % (seed, i)
        f = store.create(ROOT_INO, tmp, 0o644, session=session)
        for k in range(rnd.randint(1, 3)):
            sid = store.next_slice_id()
            store.commit_slice(f.ino, 0, SliceRef(sid, k * 100, 100), (k + 1) * 100)
        store.setxattr(f.ino, b"user.step", b"%d" % i)
        store.rename(ROOT_INO, tmp, ROOT_INO, b"current")
        store.close_file(session, f.ino)
        try:
            store.mkdir(ROOT_INO, b"dir%d" % (i % 5), 0o755)
        except FsError:
            store.rmdir(ROOT_INO, b"dir%d" % (i % 5))
        if i == 3:
            started.set()


def test_a_process_killed_mid_operation_leaves_old_or_new_state(meta, meta_url, check):
    for round_ in range(3):
        started = SPAWN.Event()
        proc = SPAWN.Process(target=crashy_worker, args=(meta_url, started, round_))
        proc.start()
        assert started.wait(60), "worker never got going"
        time.sleep(random.uniform(0.05, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        check()
        current = meta.lookup(ROOT_INO, b"current")
        pieces = meta.read_map(current.ino, 0, current.size)
        assert pieces and all(p.slice_id is not None for p in pieces)
        step = int(meta.getxattr(current.ino, b"user.step"))
        assert step >= 3
        # The dead client's session still pins what it held; expiring it frees that.
        meta.expire_sessions(0)
        check()
        assert meta.list_sessions() == []
