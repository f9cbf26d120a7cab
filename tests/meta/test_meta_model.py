"""A differential test (the JuiceFS idea): random namespace operations run on the
engine and on a small in-memory model of Linux semantics; every result and
every errno must agree, and the listings must match after every step."""

from __future__ import annotations

import errno as E
import uuid

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shinglefs.meta import open_meta
from shinglefs.meta.api import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO
from shinglefs.meta.check import check_consistency
from shinglefs.meta.errors import FsError

NAMES = st.sampled_from([b"a", b"b", b"c"])
PICK = st.integers(0, 1000)


class Node:
    def __init__(self, ino: int, is_dir: bool, parent: Node | None = None) -> None:
        self.ino = ino
        self.is_dir = is_dir
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.nlink = 2 if is_dir else 1


class Refusal(Exception):
    def __init__(self, errno_: int) -> None:
        self.errno = errno_


class NamespaceMachine(RuleBasedStateMachine):
    store_cache: object = None

    def __init__(self) -> None:
        super().__init__()
        self.store = type(self).store_cache
        top = self.store.mkdir(ROOT_INO, uuid.uuid4().hex.encode(), 0o755)
        self.root = Node(top.ino, True)

    # -- model helpers -------------------------------------------------------------------

    def dirs(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            d = stack.pop()
            out.append(d)
            stack += [c for c in d.children.values() if c.is_dir]
        return sorted(out, key=lambda n: n.ino)

    def nodes(self) -> list[Node]:
        seen: dict[int, Node] = {}
        for d in self.dirs():
            for c in d.children.values():
                seen[c.ino] = c
        return sorted(seen.values(), key=lambda n: n.ino)

    def pick_dir(self, k: int) -> Node:
        dirs = self.dirs()
        return dirs[k % len(dirs)]

    def ancestor(self, node: Node, start: Node) -> bool:
        cur: Node | None = start
        while cur is not None:
            if cur is node:
                return True
            cur = cur.parent
        return False

    def both(self, real, model) -> None:
        """Run the real call and the model; they must both succeed or fail alike."""
        try:
            expected = model()
        except Refusal as refusal:
            try:
                real()
            except FsError as exc:
                assert exc.errno == refusal.errno, (
                    f"engine {E.errorcode[exc.errno]}, model {E.errorcode[refusal.errno]}"
                )
                return
            raise AssertionError(
                f"engine succeeded, model says {E.errorcode[refusal.errno]}"
            ) from None
        try:
            result = real()
        except FsError as exc:
            raise AssertionError(f"engine failed with {exc!r}, model succeeded") from None
        if expected is not None:
            expected(result)

    # -- rules -----------------------------------------------------------------------------

    @rule(k=PICK, name=NAMES, as_dir=st.booleans())
    def make(self, k, name, as_dir):
        parent = self.pick_dir(k)

        def model():
            if name in parent.children:
                raise Refusal(E.EEXIST)

            def record(attr):
                node = Node(attr.ino, as_dir, parent if as_dir else None)
                parent.children[name] = node
                if as_dir:
                    parent.nlink += 1

            return record

        if as_dir:
            self.both(lambda: self.store.mkdir(parent.ino, name, 0o755), model)
        else:
            self.both(lambda: self.store.create(parent.ino, name, 0o644), model)

    @rule(k=PICK, name=NAMES)
    def unlink(self, k, name):
        parent = self.pick_dir(k)

        def model():
            node = parent.children.get(name)
            if node is None:
                raise Refusal(E.ENOENT)
            if node.is_dir:
                raise Refusal(E.EISDIR)
            del parent.children[name]
            node.nlink -= 1

        self.both(lambda: self.store.unlink(parent.ino, name), model)

    @rule(k=PICK, name=NAMES)
    def rmdir(self, k, name):
        parent = self.pick_dir(k)

        def model():
            node = parent.children.get(name)
            if node is None:
                raise Refusal(E.ENOENT)
            if not node.is_dir:
                raise Refusal(E.ENOTDIR)
            if node.children:
                raise Refusal(E.ENOTEMPTY)
            del parent.children[name]
            parent.nlink -= 1

        self.both(lambda: self.store.rmdir(parent.ino, name), model)

    @rule(src=PICK, k=PICK, name=NAMES)
    def link(self, src, k, name):
        nodes = self.nodes()
        if not nodes:
            return
        node = nodes[src % len(nodes)]
        parent = self.pick_dir(k)

        def model():
            if name in parent.children:
                raise Refusal(E.EEXIST)
            if node.is_dir:
                raise Refusal(E.EPERM)
            parent.children[name] = node
            node.nlink += 1

        self.both(lambda: self.store.link(node.ino, parent.ino, name), model)

    @rule(
        k1=PICK,
        n1=NAMES,
        k2=PICK,
        n2=NAMES,
        flags=st.sampled_from([0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]),
    )
    def rename(self, k1, n1, k2, n2, flags):
        p1, p2 = self.pick_dir(k1), self.pick_dir(k2)
        exchange = flags == RENAME_EXCHANGE

        def model():
            src = p1.children.get(n1)
            if src is None:
                raise Refusal(E.ENOENT)
            dst = p2.children.get(n2)
            if exchange and dst is None:
                raise Refusal(E.ENOENT)
            if flags == RENAME_NOREPLACE and dst is not None:
                raise Refusal(E.EEXIST)
            if p1 is not p2 and src.is_dir and self.ancestor(src, p2):
                raise Refusal(E.EINVAL)
            if p1 is not p2 and dst is not None and dst.is_dir and self.ancestor(dst, p1):
                raise Refusal(E.EINVAL if exchange else E.ENOTEMPTY)
            if dst is src:
                return None
            if dst is not None and not exchange:
                if src.is_dir and not dst.is_dir:
                    raise Refusal(E.ENOTDIR)
                if not src.is_dir and dst.is_dir:
                    raise Refusal(E.EISDIR)
                if dst.is_dir and dst.children:
                    raise Refusal(E.ENOTEMPTY)
            if exchange:
                assert dst is not None
                p1.children[n1], p2.children[n2] = dst, src
                for node, new_parent, old_parent in ((src, p2, p1), (dst, p1, p2)):
                    if node.is_dir:
                        node.parent = new_parent
                        old_parent.nlink -= 1
                        new_parent.nlink += 1
                return None
            del p1.children[n1]
            if dst is not None:
                if dst.is_dir:
                    p2.nlink -= 1
                else:
                    dst.nlink -= 1
            p2.children[n2] = src
            if src.is_dir:
                src.parent = p2
                p1.nlink -= 1
                p2.nlink += 1
            return None

        self.both(lambda: self.store.rename(p1.ino, n1, p2.ino, n2, flags), model)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def listings_and_links_match(self):
        for d in self.dirs():
            entries = self.store.readdir(d.ino, 0, 100)
            assert {e.name: e.ino for e in entries} == {n: c.ino for n, c in d.children.items()}
            assert self.store.getattr(d.ino).nlink == d.nlink
            for e in entries:
                assert e.attr.nlink == d.children[e.name].nlink
                assert e.attr.is_dir == d.children[e.name].is_dir


def test_namespace_agrees_with_a_linux_model(meta_url):
    store = open_meta(meta_url)
    store.format("model", str(uuid.uuid4()))
    NamespaceMachine.store_cache = store
    try:
        run_state_machine_as_test(
            NamespaceMachine,
            settings=settings(max_examples=25, stateful_step_count=40, deadline=None),
        )
        assert check_consistency(store) == []
    finally:
        store.close()
