"""The compact slice index against a dict model, and its memory per extent."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shinglefs.store.index import SliceIndex

ZS = 1 << 20
NZ = 64

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 30), st.integers(1, 5), st.integers(0, 3)),
        st.tuples(st.just("remove"), st.integers(0, 30)),
        st.tuples(st.just("relocate"), st.integers(0, 30), st.integers(0, 4)),
        st.tuples(st.just("group"), st.integers(0, 3)),
        st.tuples(st.just("truncate"), st.integers(0, 30), st.integers(0, 4)),
        st.tuples(st.just("merge")),
        st.tuples(st.just("reload")),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from([4096, 1]))
def test_index_matches_a_dict_model(program, labels_kept):
    """``labels_kept`` 1: dead group labels are dropped at every merge that can."""
    index = SliceIndex(ZS, NZ, tail_limit=4, labels_kept=labels_kept)
    model: dict[int, list[list[int]]] = {}  # sid -> [[off, len, dev, group]]
    next_dev = [3 * ZS]

    def new_dev() -> int:
        next_dev[0] = (next_dev[0] + 8192) % (NZ * ZS)
        return next_dev[0]

    for op in program:
        if op[0] == "add":
            _, sid, n, group = op
            exts = model.setdefault(sid, [])
            off = exts[-1][0] + exts[-1][1] if exts else 0
            dev = new_dev()
            exts.append([off, n * 100, dev, group])
            index.add(sid, off, n * 100, dev, group)
        elif op[0] == "remove":
            freed = index.remove(op[1])
            assert freed == sum(e[1] for e in model.pop(op[1], []))
        elif op[0] == "relocate":
            _, sid, k = op
            exts = model.get(sid, [])
            dev = new_dev()
            if k < len(exts):
                assert index.relocate(sid, exts[k][0], exts[k][2], dev)
                assert not index.relocate(sid, exts[k][0], exts[k][2] + 1, dev)
                exts[k][2] = dev
            else:
                assert not index.relocate(sid, 10**6, None, dev)
        elif op[0] == "group":
            victims = sorted(s for s, ex in model.items() if any(e[3] == op[1] for e in ex))
            assert index.remove_group(op[1]) == victims
            for s in victims:
                del model[s]
        elif op[0] == "truncate":
            _, sid, k = op
            exts = model.get(sid)
            if exts and k < len(exts):
                index.truncate(sid, exts[k][0])
                del exts[k:]
                if not exts:
                    del model[sid]
        elif op[0] == "merge":
            index.merge()
        elif op[0] == "reload":
            cols = {k: v.copy() for k, v in index.columns().items()}
            fresh = SliceIndex(ZS, NZ, tail_limit=4, labels_kept=labels_kept)
            fresh.load_columns(cols, index.group_labels)
            index = fresh
        # Invariants after every step.
        assert index.slices == len(model)
        assert len(index) == sum(len(e) for e in model.values())
        for sid in range(31):
            exts = model.get(sid)
            assert index.contains(sid) == bool(exts)
            assert index.extents(sid) == [(e[0], e[1], e[2]) for e in (exts or [])]
            assert index.length(sid) == (exts[-1][0] + exts[-1][1] if exts else None)
            for e in exts or []:
                assert index.location(sid, e[0]) == e[2]
            assert index.location(sid, 10**7) is None
        assert sorted(index.slice_ids()) == sorted(model)
        live = np.zeros(NZ, np.int64)
        for exts in model.values():
            for e in exts:
                live[e[2] // ZS] += e[1]
        assert (index.zone_live == live).all()
        assert index.live_bytes == int(live.sum())
        in_zones = sorted((x.slice_id, x.offset, x.dev, x.group)
                          for z in range(NZ) for x in index.extents_in_zone(z))
        assert in_zones == sorted((sid, e[0], e[2], e[3])
                                  for sid, exts in model.items() for e in exts)


def test_labels_of_groups_without_extents_are_dropped_at_a_merge():
    index = SliceIndex(ZS, NZ, tail_limit=8, labels_kept=4)
    for sid in range(100):  # a large file each: a group each, deleted whole later
        index.add(sid, 0, 100, (sid * 8192) % (NZ * ZS), 1000 + sid)
        if sid >= 2:
            index.remove_group(1000 + sid - 2)
    index.merge()
    assert sorted(index.group_labels) == [1098, 1099]
    assert index.remove_group(1099) == [99]
    assert [x.group for x in index.extents_in_zone((98 * 8192) // ZS)] == [1098]


def test_extents_in_zone_lists_base_and_tail_with_their_group():
    index = SliceIndex(ZS, NZ, tail_limit=1000)
    index.add(1, 0, 10, 5 * ZS, 77)
    index.merge()
    index.add(2, 0, 20, 5 * ZS + 8192, 78)
    index.add(3, 0, 30, 6 * ZS, 79)
    assert index.extents_in_zone(5) == [(1, 0, 10, 5 * ZS, 77), (2, 0, 20, 5 * ZS + 8192, 78)]


def test_columns_cost_28_bytes_an_extent():
    index = SliceIndex(1 << 28, 1000, tail_limit=1024)
    for i in range(10_000):
        index.add(i, 0, 8 << 20, (i % 900) * (1 << 28), i % 7)
    index.merge()
    assert index.memory_bytes() == 28 * 10_000 + 28 * index.tail_limit
