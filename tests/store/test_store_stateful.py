"""The slice log against a dict model, with random power cuts (torn or not) and reopens.

After every crash: every acknowledged durable slice reads back bit-exact, every
deleted-and-flushed slice stays deleted, and whatever else survived is a
prefix of what was written (never wrong bytes).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from storekit import MiB, crash, make_drive, payload

from shinglefs.store import SliceNotFound, SliceStore

CONFIG = {"gc_free_zones": 8, "gc_chunk_bytes": 128 * 1024, "gc_background": False}


class SliceLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="store-stateful-"))
        drive = make_drive(self.dir / "drive", zone_size=MiB, zone_count=24,
                           conventional_zones=2, max_open_zones=5)
        # GC runs as a rule (and inline when space runs out), so every run is deterministic.
        self.store = SliceStore.format(drive, **CONFIG)
        self.next_id = 1
        self.durable: dict[int, bytes] = {}  # acknowledged durable
        self.volatile: dict[int, bytes] = {}  # written, not yet covered by a flush
        self.deleted_durable: set[int] = set()
        # sid -> (durable content, unflushed content) before an unflushed delete
        self.deleted_pending: dict[int, tuple[bytes | None, bytes | None]] = {}

    def live_bytes(self) -> int:
        return sum(map(len, self.durable.values())) + sum(map(len, self.volatile.values()))

    def all_durable(self) -> None:
        self.durable.update(self.volatile)
        self.volatile.clear()
        self.deleted_durable.update(self.deleted_pending)
        self.deleted_pending.clear()

    @precondition(lambda self: self.live_bytes() < 7 * MiB)
    @rule(size=st.integers(1, 700_000), cuts=st.lists(st.integers(1, 699_999), max_size=3),
          group=st.integers(0, 3), durable=st.booleans())
    def write(self, size, cuts, group, durable):
        sid = self.next_id
        self.next_id += 1
        data = payload(sid, size)
        points = [*sorted({c for c in cuts if c < size}), size]
        pos = 0
        for i, end in enumerate(points):
            last = i == len(points) - 1
            self.store.write(sid, pos, data[pos:end], group=group, durable=durable and last)
            pos = end
        if durable:
            self.volatile[sid] = data
            self.all_durable()
        else:
            self.volatile[sid] = data

    @precondition(lambda self: self.durable or self.volatile)
    @rule(data=st.data())
    def delete(self, data):
        sid = data.draw(st.sampled_from(sorted([*self.durable, *self.volatile])))
        self.store.delete(sid)
        durable = self.durable.pop(sid, None)
        volatile = self.volatile.pop(sid, None)
        self.deleted_pending[sid] = (durable, volatile)

    @rule()
    def flush(self):
        self.store.flush()
        self.all_durable()

    @precondition(lambda self: self.durable or self.volatile)
    @rule(data=st.data())
    def read_range(self, data):
        model = {**self.durable, **self.volatile}
        sid = data.draw(st.sampled_from(sorted(model)))
        blob = model[sid]
        a = data.draw(st.integers(0, len(blob)))
        b = data.draw(st.integers(a, len(blob) + 10))
        assert self.store.read(sid, a, b - a) == blob[a:b]

    @rule()
    def collect_garbage(self):
        self.store.collect_garbage()

    @rule(torn=st.booleans(), keep=st.integers(0, 200))
    def power_cut(self, torn, keep):
        self.store = crash(self.store, torn=torn, keep_blocks=keep, **CONFIG)
        for sid, blob in self.durable.items():
            assert self.store.read(sid, 0, len(blob) + 1) == blob, sid
        for sid in self.deleted_durable:
            assert not self.store.contains(sid), sid
        # Unflushed slices: gone, or a prefix of what was written.
        for sid, blob in list(self.volatile.items()):
            if self.store.contains(sid):
                got = self.store.read(sid, 0, len(blob) + 1)
                assert blob.startswith(got) and got, sid
                self.durable[sid] = got
            del self.volatile[sid]
        for sid, (durable, volatile) in list(self.deleted_pending.items()):
            if self.store.contains(sid):  # the unflushed tombstone was lost
                if durable is not None:
                    assert self.store.read(sid, 0, len(durable) + 1) == durable
                    self.durable[sid] = durable
                else:  # never flushed either: what survived is a prefix
                    assert volatile is not None
                    got = self.store.read(sid, 0, len(volatile) + 1)
                    assert volatile.startswith(got) and got, sid
                    self.durable[sid] = got
            else:
                self.deleted_durable.add(sid)
            del self.deleted_pending[sid]
        known = set(self.durable) | set(self.volatile)
        assert set(self.store.slice_ids()) == known

    @invariant()
    def deleted_slices_are_not_found(self):
        for sid in list(self.deleted_durable)[:5]:
            try:
                self.store.length(sid)
            except SliceNotFound:
                continue
            raise AssertionError(f"deleted slice {sid} is back")

    def teardown(self):
        try:
            self.store.close()
            self.store.drive.close_drive()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


SliceLogMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_slice_log_against_a_model_with_power_cuts = SliceLogMachine.TestCase
