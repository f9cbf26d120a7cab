"""Keep-last-N retention (client/background/retention.py, docs/client.md "Retention").

Through the Python API on a real file system (SQLite file, emulated SMR
drive). Most tests stop the client's background thread and run the
retention pass themselves, so that what a pass does is what they see; one
leaves the thread running and waits for it.
"""

from __future__ import annotations

import errno
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from fsfixtures import FsFactory, pattern

from shinglefs.client.api import ShingleFS
from shinglefs.client.background import retention as retention_module
from shinglefs.client.background.retention import RETIRED_PREFIX, RetentionRule
from shinglefs.client.filesystem import open_filesystem
from shinglefs.client.vfs import VFS
from shinglefs.errors import UsageError
from shinglefs.meta.api import ROOT_INO
from shinglefs.meta.records import DirPolicy

MiB = 1024 * 1024


def policy(vfs: VFS, path: str, rule: str | None) -> int:
    """Set ``rule`` on directory ``path`` as ``shinglefs policy`` does; its inode."""
    ino = ROOT_INO
    for name in (p for p in path.split("/") if p):
        ino = vfs.meta.lookup(ino, name.encode()).ino
    vfs.meta.set_policy(ino, DirPolicy(retention=rule))
    return ino


@pytest.fixture
def fs(vfs: VFS) -> ShingleFS:
    """The file system with its background thread stopped: passes run by hand."""
    vfs.jobs.stop()
    return ShingleFS(vfs)


def enforce(fs: ShingleFS) -> int:
    """The retention part of a background pass (deferred closes drain first)."""
    fs.vfs.jobs.closes.drain()
    return fs.vfs.jobs.retention.run()


def names(fs: ShingleFS, path: str) -> list[str]:
    return sorted(fs.listdir(path))


def save_step(fs: ShingleFS, step: int, files: int = 3) -> None:
    """A DCP-like save: files in ``step-N.tmp/``, then renamed to ``step-N/``."""
    tmp = f"/ckpt/step-{step}.tmp"
    fs.makedirs(tmp)
    for rank in range(files):
        fs.write_bytes(f"{tmp}/__{rank}_0.distcp", pattern(step * 10 + rank, 100_000))
    fs.makedirs(f"{tmp}/nested")
    fs.write_bytes(f"{tmp}/nested/.metadata", b"m%d" % step)
    fs.rename(tmp, f"/ckpt/step-{step}")


def test_a_directory_keeps_its_newest_files_and_deletes_older_ones(fs: ShingleFS) -> None:
    fs.makedirs("/ckpt")
    fs.makedirs("/other")
    policy(fs.vfs, "/ckpt", "keep-last=2")
    for step in range(5):
        fs.write_bytes(f"/ckpt/model-{step}.pt", pattern(step, 4096))
        fs.write_bytes(f"/other/model-{step}.pt", b"x")
    assert enforce(fs) == 3
    assert names(fs, "/ckpt") == ["model-3.pt", "model-4.pt"]
    assert fs.read_bytes("/ckpt/model-4.pt") == pattern(4, 4096)
    assert len(fs.listdir("/other")) == 5  # no rule: nothing deleted
    assert enforce(fs) == 0  # nothing new arrived


def test_checkpoint_directories_go_whole_and_temporary_names_do_not_count(
        fs: ShingleFS) -> None:
    fs.makedirs("/ckpt")
    policy(fs.vfs, "/ckpt", "keep-last=2")
    for step in range(1, 4):
        save_step(fs, step)
    fs.makedirs("/ckpt/step-4.tmp")  # a save in flight
    fs.write_bytes("/ckpt/step-4.tmp/__0_0.distcp", b"partial")
    fs.write_bytes("/ckpt/.lock", b"")  # hidden: not counted
    inodes_before = fs.vfs.statfs().inodes
    assert enforce(fs) == 6  # step-1: 3 shards, nested/.metadata, nested/ and step-1/
    assert names(fs, "/ckpt") == [".lock", "step-2", "step-3", "step-4.tmp"]
    # subdirectories do not inherit the rule: every file of a kept step stays
    assert names(fs, "/ckpt/step-3") == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "nested"]
    assert fs.read_bytes("/ckpt/step-3/__2_0.distcp") == pattern(32, 100_000)
    assert fs.vfs.statfs().inodes == inodes_before - 6
    fs.rename("/ckpt/step-4.tmp", "/ckpt/step-4")  # committed: now it counts
    assert enforce(fs) == 6
    assert names(fs, "/ckpt") == [".lock", "step-3", "step-4"]


def test_a_read_only_snapshot_among_old_checkpoints_is_kept(fs: ShingleFS) -> None:
    """Pinning a checkpoint (a read-only snapshot in the same directory) keeps
    it whatever its age; the others are retired around it, pass after pass."""
    fs.makedirs("/ckpt")
    policy(fs.vfs, "/ckpt", "keep-last=2")
    save_step(fs, 1)
    fs.snapshot("/ckpt/step-1", "/ckpt/step-1@best", read_only=True)
    for step in range(2, 5):
        save_step(fs, step)
    assert enforce(fs) == 12  # step-1 and step-2, 6 inodes each; the pinned copy stays
    assert names(fs, "/ckpt") == ["step-1@best", "step-3", "step-4"]
    save_step(fs, 5)
    assert enforce(fs) == 6
    assert names(fs, "/ckpt") == ["step-1@best", "step-4", "step-5"]
    assert fs.read_bytes("/ckpt/step-1@best/__2_0.distcp") == pattern(12, 100_000)
    fs.make_writable("/ckpt/step-1@best")
    save_step(fs, 6)
    assert enforce(fs) == 12  # unpinned: now the oldest, it goes too
    assert names(fs, "/ckpt") == ["step-5", "step-6"]


def test_a_pin_does_not_count_among_the_n_newest(fs: ShingleFS) -> None:
    """Pinning the older of two kept steps (its read-only copy is then the
    newest arrival) must not cost a recent checkpoint: N others stay."""
    fs.makedirs("/ckpt")
    policy(fs.vfs, "/ckpt", "keep-last=2")
    save_step(fs, 1)
    save_step(fs, 2)
    fs.snapshot("/ckpt/step-1", "/ckpt/step-1@pin", read_only=True)
    assert enforce(fs) == 0
    assert names(fs, "/ckpt") == ["step-1", "step-1@pin", "step-2"]
    save_step(fs, 3)
    assert enforce(fs) == 6
    assert names(fs, "/ckpt") == ["step-1@pin", "step-2", "step-3"]


def test_a_connected_process_that_closes_at_once_leaves_the_rule_enforced(
        fs_factory: FsFactory) -> None:
    """A ``connect()`` client that writes its checkpoints and closes before any
    background pass ran enforces the rule as it closes."""
    vfs = fs_factory.vfs()
    fs = ShingleFS(vfs)
    fs.makedirs("/ckpt")
    policy(vfs, "/ckpt", "keep-last=2")
    vfs.jobs.stop()  # no background pass will come
    for step in range(5):
        fs.makedirs(f"/ckpt/s{step}.tmp")
        fs.rename(f"/ckpt/s{step}.tmp", f"/ckpt/s{step}")
    fs.close()
    again = ShingleFS(fs_factory.vfs())
    assert names(again, "/ckpt") == ["s3", "s4"]


def test_a_read_only_copy_inside_an_old_checkpoint_keeps_that_checkpoint(
        fs: ShingleFS) -> None:
    """A file pinned inside step-1 (not step-1 itself) keeps step-1 whole and
    visible; retention goes on around it, pass after pass."""
    fs.makedirs("/ckpt")
    policy(fs.vfs, "/ckpt", "keep-last=1")
    save_step(fs, 1)
    fs.snapshot("/ckpt/step-1/__0_0.distcp", "/ckpt/step-1/best.distcp", read_only=True)
    save_step(fs, 2)
    save_step(fs, 3)
    assert enforce(fs) == 6  # step-2
    assert names(fs, "/ckpt") == ["step-1", "step-3"]
    assert len(fs.listdir("/ckpt/step-1")) == 5
    for step in (4, 5):
        save_step(fs, step)
        assert enforce(fs) == 6
    assert names(fs, "/ckpt") == ["step-1", "step-5"]


def test_newest_is_the_order_of_arrival_not_the_name(fs: ShingleFS) -> None:
    fs.makedirs("/ckpt")
    policy(fs.vfs, "/ckpt", "keep-last=2")
    for name in ("step-10", "step-9", "step-11"):
        fs.write_bytes(f"/ckpt/{name}", name.encode())
    enforce(fs)
    assert names(fs, "/ckpt") == ["step-11", "step-9"]
    fs.rename("/ckpt/step-9", "/ckpt/latest")  # renamed into its name: the newest
    fs.write_bytes("/ckpt/step-12", b"12")
    enforce(fs)
    assert names(fs, "/ckpt") == ["latest", "step-12"]


def test_match_limits_what_counts_and_what_can_be_deleted(fs: ShingleFS) -> None:
    fs.makedirs("/out/runs")
    policy(fs.vfs, "/out", "keep-last=1,match=checkpoint-*")
    fs.write_bytes("/out/config.json", b"{}")
    for step in (500, 1000, 1500):
        fs.makedirs(f"/out/checkpoint-{step}")
        fs.write_bytes(f"/out/checkpoint-{step}/model.safetensors", b"w")
    enforce(fs)
    assert names(fs, "/out") == ["checkpoint-1500", "config.json", "runs"]


def test_an_open_file_of_a_deleted_checkpoint_stays_readable_until_closed(
        fs: ShingleFS) -> None:
    fs.makedirs("/ckpt")
    policy(fs.vfs, "/ckpt", "keep-last=1")
    data = pattern(7, 3 * MiB)
    fs.write_bytes("/ckpt/a.pt", data)
    with fs.open("/ckpt/a.pt", "rb") as reader:
        fs.write_bytes("/ckpt/b.pt", b"b")
        enforce(fs)
        assert names(fs, "/ckpt") == ["b.pt"]
        assert reader.read() == data


def test_what_a_crash_left_retired_is_removed_at_the_next_arrival(fs: ShingleFS) -> None:
    fs.makedirs("/ckpt")
    ckpt = policy(fs.vfs, "/ckpt", "keep-last=3")
    save_step(fs, 1)
    enforce(fs)
    # a crash between the rename out of the final name and the removal (made
    # in meta directly, as the dead client did: this one noted no arrival)
    fs.vfs.meta.rename(ckpt, b"step-1", ckpt, RETIRED_PREFIX + b"99")
    assert enforce(fs) == 0
    assert names(fs, "/ckpt") == [".shinglefs-retired.99"]
    save_step(fs, 2)
    assert enforce(fs) == 6
    assert names(fs, "/ckpt") == ["step-2"]


def test_a_pass_removes_a_bounded_number_and_the_next_pass_goes_on(
        fs: ShingleFS, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention_module, "MAX_REMOVALS_PER_PASS", 4)
    fs.makedirs("/ckpt")
    policy(fs.vfs, "/ckpt", "keep-last=1")
    save_step(fs, 1, files=8)  # 11 inodes
    save_step(fs, 2, files=1)
    passes = []
    while len(names(fs, "/ckpt")) > 1 or fs.listdir("/ckpt") != ["step-2"]:
        passes.append(enforce(fs))
        assert len(passes) < 10, passes
    assert passes == [4, 4, 3], passes
    assert names(fs, "/ckpt/step-2") == ["__0_0.distcp", "nested"]


def test_a_rule_set_after_the_arrivals_applies_once_the_policy_memo_ends(
        fs: ShingleFS, monkeypatch: pytest.MonkeyPatch) -> None:
    # The memo's clock, moved by hand: a loaded machine cannot end the memo
    # between the two passes that must still see the remembered answer.
    now = [time.monotonic()]
    monkeypatch.setattr(retention_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    fs.makedirs("/ckpt")
    fs.write_bytes("/ckpt/a", b"a")
    enforce(fs)  # read: no rule (remembered)
    for name in ("b", "c"):
        fs.write_bytes(f"/ckpt/{name}", name.encode())
    policy(fs.vfs, "/ckpt", "keep-last=1")  # e.g. by `shinglefs policy` in a shell
    enforce(fs)  # still the remembered answer: nothing yet
    assert names(fs, "/ckpt") == ["a", "b", "c"]
    now[0] += retention_module.POLICY_TTL_S + 1
    enforce(fs)  # no new arrival, but the memo ended: read again, enforced
    assert names(fs, "/ckpt") == ["c"]


def test_no_rule_an_unknown_rule_and_a_cleared_rule_delete_nothing(fs: ShingleFS) -> None:
    fs.makedirs("/a")
    ino = policy(fs.vfs, "/a", "forever")  # stored by something else: not ours to read
    for i in range(3):
        fs.write_bytes(f"/a/f{i}", b"x")
    enforce(fs)
    assert len(fs.listdir("/a")) == 3
    fs.vfs.meta.set_policy(ino, DirPolicy(retention=None))
    enforce(fs)
    assert len(fs.listdir("/a")) == 3


def test_the_background_pass_enforces_the_rule_by_itself(vfs: VFS) -> None:
    fs = ShingleFS(vfs)
    fs.makedirs("/ckpt")
    policy(vfs, "/ckpt", "keep-last=2")
    for step in range(4):
        fs.write_bytes(f"/ckpt/step-{step}.pt", b"s")
    deadline = time.monotonic() + 20
    while names(fs, "/ckpt") != ["step-2.pt", "step-3.pt"]:
        assert time.monotonic() < deadline, names(fs, "/ckpt")
        time.sleep(0.05)
    assert vfs.jobs.retention.retired == 2


def test_two_clients_enforcing_one_directory_leave_exactly_the_newest(
        fs_factory: FsFactory) -> None:
    fs_factory.format()
    one = open_filesystem(fs_factory.meta_url, serve=True)
    two = open_filesystem(fs_factory.meta_url, join=True)  # through one's drive share
    fs_factory.opened += [two, one]
    for v in (one, two):
        v.jobs.stop()
    a, b = ShingleFS(one), ShingleFS(two)
    for r in range(5):  # both passes at once: each entry is removed exactly once
        a.makedirs(f"/ckpt{r}")
        policy(one, f"/ckpt{r}", "keep-last=2")
        for step in range(8):
            (a if step % 2 else b).makedirs(f"/ckpt{r}/s{step}/sub")
            (b if step % 2 else a).write_bytes(f"/ckpt{r}/s{step}/sub/f", b"s")
        for v in (one, two):
            v.jobs.closes.drain()
        with ThreadPoolExecutor(2) as pool:
            removed = [f.result() for f in [pool.submit(v.jobs.retention.run) for v in (one, two)]]
        assert sum(removed) == 6 * 3, removed
        assert sorted(a.listdir(f"/ckpt{r}")) == sorted(b.listdir(f"/ckpt{r}")) == ["s6", "s7"]


@pytest.mark.parametrize(("text", "rule"), [
    ("keep-last=3", RetentionRule(3)),
    ("keep_last=3", RetentionRule(3)),
    (" keep-last=1,match=step-* ", RetentionRule(1, "step-*")),
])
def test_rules_parse_and_print_canonically(text: str, rule: RetentionRule) -> None:
    assert RetentionRule.parse(text) == rule
    assert RetentionRule.parse(str(rule)) == rule


@pytest.mark.parametrize("text", ["keep-last=0", "keep-last=", "keep-last=x", "forever",
                                  "keep-last=3,match=", "keep-newest=3"])
def test_malformed_rules_are_refused_with_what_is_accepted(text: str) -> None:
    with pytest.raises(UsageError) as info:
        RetentionRule.parse(text)
    assert info.value.errno == errno.EINVAL and "keep-last=N" in (info.value.hint or "")


def test_symlinks_are_removed_not_followed(fs: ShingleFS) -> None:
    fs.makedirs("/keep")
    fs.write_bytes("/keep/precious", b"p")
    fs.makedirs("/ckpt/old")
    ckpt = policy(fs.vfs, "/ckpt", "keep-last=1")
    fs.vfs.symlink(fs.vfs.meta.lookup(ckpt, b"old").ino, b"to-keep", b"/keep")
    fs.write_bytes("/ckpt/new", b"n")
    enforce(fs)
    assert names(fs, "/ckpt") == ["new"]
    assert fs.listdir("/keep") == ["precious"] and fs.read_bytes("/keep/precious") == b"p"
