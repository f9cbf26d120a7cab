"""Keep-last-N retention: a directory that keeps only its N newest entries.

A directory's policy ``retention`` (``shinglefs policy URL /ckpt --retention
keep-last=3``) of the form ``keep-last=N`` keeps the N newest of the
directory's *counted* entries and deletes the older ones, each whole (a
checkpoint step's directory with everything below it). Counted: every entry
(or, with ``keep-last=N,match=GLOB``, every entry whose name matches the
shell pattern) but hidden ones (a name starting with ``.``) and those still
being written under a temporary name (ending in ``.tmp``): ``step-7.tmp/`` does not count
until it is renamed to ``step-7/``, so a save that fails never pushes out a
good checkpoint. *Newest* is the order in which entries took their current
name in this directory — create, mkdir, link, or rename into it, i.e. the
directory's cookie order (``MetaStore.readdir``) — not their names or times.
The rule applies to the directory it is set on, not to subdirectories (they
do not inherit it: ``step-7/`` of a DCP save holds files that must all stay).

Who enforces it: every client, for the directories it made an entry arrive
in (``note``, called by the VFS's namespace operations; a cheap set insert),
on its next background pass (``run``), so that no FUSE request waits for a
deletion, and once more when it closes (a short-lived ``connect()`` process
ends with its pass done). The pass reads each noted directory's policy (a rule set or
changed by ``shinglefs policy`` in another process applies at most
``POLICY_TTL_S`` after it was set, to every directory with an arrival since
then) and its entries, and retires each entry older than the N newest:

1. rename it out of its final name to ``.shinglefs-retired.<inode>`` in the same
   directory (one metadata transaction, RENAME_NOREPLACE): from here on no
   reader finds it under its name, and a crash leaves it retired, never half
   deleted under its name;
2. remove it: a file is unlinked, a directory emptied depth first and removed.

Retired entries that a crash left behind are removed the next time the
directory is enforced. Removal is ``rm -r`` as root in the metadata: open
files stay readable and writable until their last close, and the space comes
back through the deletion queue as for any unlink. Two clients enforcing one
directory at once are harmless: whatever one has already moved or removed
the other skips (ENOENT, ENOTEMPTY for a directory still being filled
somewhere: retried on a later pass). A pass removes at most
``MAX_REMOVALS_PER_PASS`` entries and keeps the rest of its work for the
next, so a huge old tree never holds up the client's other background jobs.

What it never does: delete anything in a directory without a rule, delete a
counted entry among the N newest, delete a read-only snapshot (immutable: an
old checkpoint pinned with ``shinglefs snapshot --read-only`` stays beyond the
N and is not one of them, so pinning a step keeps N others; an old entry
holding one anywhere below it stays too, but counts), follow a symlink
out of the directory, or delete hidden or ``.tmp`` entries other than its own
``.shinglefs-retired.*``.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from shinglefs.errors import UsageError
from shinglefs.meta.api import MetaStore
from shinglefs.meta.errors import FsError
from shinglefs.meta.records import ROOT_CTX

log = logging.getLogger(__name__)

__all__ = ["RETIRED_PREFIX", "Retention", "RetentionRule"]

RETIRED_PREFIX = b".shinglefs-retired."
"""Name prefix of an entry retention took out of its final name, before removal."""
TEMPORARY_SUFFIX = b".tmp"
"""Entries named ``*.tmp`` are still being written: never counted, never deleted."""
MAX_REMOVALS_PER_PASS = 2000
"""Inodes one pass removes at most; the rest waits for the next pass."""
POLICY_TTL_S = 5.0
"""How long a pass trusts a directory's policy it read (a rule set or changed
elsewhere applies within this long), so that busy directories without a rule
cost one policy read per ``POLICY_TTL_S``, not one per pass."""
POLICY_MEMO_ENTRIES = 4096
RENAME_NOREPLACE = 1

_RULE = re.compile(r"keep[-_]last=([0-9]+)(?:,match=(.+))?")


@dataclass(frozen=True, slots=True)
class RetentionRule:
    """A parsed ``retention`` policy: keep the ``keep_last`` newest counted
    entries; with ``match`` (a shell pattern, ``fnmatch``), only entries whose
    name matches count, and only they can be deleted."""

    keep_last: int
    match: str | None = None

    @classmethod
    def parse(cls, text: str) -> RetentionRule:
        """``keep-last=N`` or ``keep-last=N,match=GLOB`` (N >= 1; ``keep_last``
        is read too). Raises ``UsageError`` for anything else, naming what is
        accepted."""
        found = _RULE.fullmatch(text.strip())
        if found is None or int(found.group(1)) < 1:
            raise UsageError(f"retention {text!r} is not a rule ShingleFS knows",
                             hint="--retention keep-last=N (N >= 1) keeps the N newest entries, "
                                  "keep-last=N,match='step-*' only among names matching; "
                                  "an empty value clears it")
        return cls(int(found.group(1)), found.group(2))

    @classmethod
    def of(cls, text: str | None) -> RetentionRule | None:
        """The rule of a stored policy; None when there is none or it is not
        one this version knows (stored by a newer one: left alone, logged)."""
        if not text:
            return None
        try:
            return cls.parse(text)
        except UsageError:
            log.warning("retention %r is not a rule this version knows; ignored", text)
            return None

    def __str__(self) -> str:
        return f"keep-last={self.keep_last}" + (f",match={self.match}" if self.match else "")

    def counts(self, name: bytes) -> bool:
        """Does an entry named ``name`` count towards (and may it fall to) the rule?"""
        if name.startswith(b".") or name.endswith(TEMPORARY_SUFFIX):
            return False
        return self.match is None or fnmatch.fnmatchcase(os.fsdecode(name), self.match)


class Retention:
    """The retention job of one client (module docstring).

    ``note`` is thread-safe and never touches meta; ``run`` is the background
    pass (one thread). ``retired`` counts the entries this client retired.
    """

    def __init__(self, meta: MetaStore, *, freed: Callable[[], None],
                 changed: Callable[[], None]) -> None:
        self.meta = meta
        self._freed = freed  # wake the deletion consumer: slices were dereferenced
        self._changed = changed  # forget this client's memos of directories
        self._lock = threading.Lock()
        self._noted: set[int] = set()
        self._rules: dict[int, tuple[float, RetentionRule | None]] = {}  # ino -> (until, rule)
        # Directories with arrivals that a remembered "no rule" answered: asked
        # again when that memo ends, so a rule set meanwhile still applies.
        self._recheck: dict[int, float] = {}
        self.retired = 0

    def note(self, parent: int) -> None:
        """An entry arrived in directory ``parent``: enforce its rule, if any, soon."""
        if parent not in self._noted:  # unlocked peek: a miss only costs the lock
            with self._lock:
                self._noted.add(parent)

    def run(self) -> int:
        """Enforce every noted directory's rule; returns the entries removed.
        A directory whose work did not finish (the per-pass bound, a race with
        another client) stays noted for the next pass."""
        now = time.monotonic()
        with self._lock:
            todo, self._noted = self._noted, set()
        for ino, until in list(self._recheck.items()):
            if until <= now:
                del self._recheck[ino]
                todo.add(ino)
        budget = [MAX_REMOVALS_PER_PASS]
        removed = 0
        pending, failed, i = list(todo), [], 0
        try:
            while i < len(pending) and budget[0] > 0:
                ino = pending[i]
                try:
                    removed += self._enforce(ino, budget)
                except FsError as exc:
                    log.warning("retention of directory %d: %s; retried later", ino, exc)
                    failed.append(ino)
                if budget[0] > 0:  # else its work may not be done: it stays in pending[i:]
                    i += 1
        finally:  # what is left (the bound, an error, meta unreachable) waits for a pass
            left = failed + pending[i:]
            if left:
                with self._lock:
                    self._noted.update(left)
            if removed:
                self._changed()
                self._freed()
        return removed

    def _rule(self, ino: int) -> RetentionRule | None:
        """The directory's rule, read at most ``POLICY_TTL_S`` ago."""
        now = time.monotonic()
        memo = self._rules.get(ino)
        if memo is not None and memo[0] > now:
            if memo[1] is None:
                self._recheck[ino] = memo[0]
            return memo[1]
        rule = RetentionRule.of(self.meta.get_policy(ino).retention)
        if len(self._rules) >= POLICY_MEMO_ENTRIES:
            self._rules.clear()
            self._recheck.clear()  # everything is read afresh at its next arrival
        self._rules[ino] = (now + POLICY_TTL_S, rule)
        return rule

    def _enforce(self, ino: int, budget: list[int]) -> int:
        try:
            rule = self._rule(ino)
            entries = self._entries(ino) if rule is not None else []
        except FsError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):  # the directory went
                return 0
            raise
        if rule is None:
            return 0
        # A read-only snapshot (a pinned checkpoint) is kept and does not
        # count among the N: pinning step-1 never costs the newest step.
        keep = [(name, child) for name, child, immutable in entries
                if rule.counts(name) and not immutable]
        removed = 0
        for name, child in keep[: max(0, len(keep) - rule.keep_last)]:
            if self._pinned(child):
                log.debug("retention %s of directory %d: %r holds a read-only snapshot, kept",
                          rule, ino, name.decode(errors="replace"))
                continue
            retired = RETIRED_PREFIX + str(child).encode()
            try:
                self.meta.rename(ino, name, ino, retired, RENAME_NOREPLACE, ROOT_CTX)
            except FsError as exc:
                if exc.errno in (errno.ENOENT, errno.EEXIST):  # another client has it
                    continue
                if exc.errno == errno.EPERM:  # a read-only snapshot: pinned, kept
                    log.debug("retention %s of directory %d: %r is read-only, kept",
                              rule, ino, name.decode(errors="replace"))
                    continue
                raise
            self.retired += 1
            self._changed()
            log.info("retention %s of directory %d: retired %r (inode %d)",
                     rule, ino, name.decode(errors="replace"), child)
        for name, _child, _immutable in self._entries(ino):
            if name.startswith(RETIRED_PREFIX) and budget[0] > 0:
                removed += self._remove(ino, name, budget)
        return removed

    def _pinned(self, ino: int) -> bool:
        """Does the tree at ``ino`` hold an inode of a read-only snapshot (one
        pinned inside an old checkpoint keeps that whole checkpoint)? False
        for one that is gone (its rename then finds nothing)."""
        try:
            top = self.meta.getattr(ino)
            if top.immutable:
                return True
            dirs = [ino] if top.is_dir else []
            while dirs:
                cookie = 0
                parent = dirs.pop()
                while True:
                    batch = self.meta.readdir(parent, cookie, 1024, ROOT_CTX)
                    for e in batch:
                        if e.attr.immutable:
                            return True
                        if stat.S_ISDIR(e.attr.mode):
                            dirs.append(e.ino)
                    if len(batch) < 1024:
                        break
                    cookie = batch[-1].cookie
        except FsError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise
        return False

    def _entries(self, ino: int) -> list[tuple[bytes, int, bool]]:
        """(name, inode, immutable) of every entry of ``ino``, oldest arrival first."""
        out: list[tuple[bytes, int, bool]] = []
        cookie = 0
        while True:
            batch = self.meta.readdir(ino, cookie, 1024, ROOT_CTX)
            out.extend((e.name, e.ino, e.attr.immutable) for e in batch)
            if len(batch) < 1024:
                return out
            cookie = batch[-1].cookie

    def _remove(self, parent: int, name: bytes, budget: list[int]) -> int:
        """Remove ``name`` in ``parent`` and, for a directory, everything below it,
        within ``budget`` (decremented per inode removed); returns the inodes
        removed. What is already gone is skipped; a directory that is not empty
        in the end (someone still writes into it, or the budget ran out) stays
        for a later pass."""
        try:
            attr = self.meta.lookup(parent, name, ROOT_CTX)
            if not stat.S_ISDIR(attr.mode):
                self.meta.unlink(parent, name, ROOT_CTX)
                budget[0] -= 1
                return 1
        except FsError as exc:
            if exc.errno in (errno.ENOENT, errno.EPERM):  # gone, or read-only: kept
                return 0
            raise
        removed = 0
        try:
            children = self._entries(attr.ino)
        except FsError as exc:
            if exc.errno == errno.ENOENT:  # another client removed it meanwhile
                return 0
            raise
        for child_name, _child, _immutable in children:
            if budget[0] <= 0:
                return removed
            removed += self._remove(attr.ino, child_name, budget)
        try:
            self.meta.rmdir(parent, name, ROOT_CTX)
        except FsError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTEMPTY, errno.EPERM):
                return removed
            raise
        budget[0] -= 1
        return removed + 1
