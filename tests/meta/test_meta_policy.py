"""A directory's replication goal and tier, and drive states, on every metadata backend."""

from __future__ import annotations

import errno
import uuid

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import ROOT_INO, Ctx, DirPolicy, ServerDrive
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import FsError
from shinglefs.meta.schema import SCHEMA_VERSION

GiB = 1024**3


def errno_of(fn, *args) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(FsError) as info:
        fn(*args)
    return info.value.errno


def test_a_goal_is_stored_with_the_policy_and_kept_apart_from_tier(meta: SqlMetaStore) -> None:
    d = meta.mkdir(ROOT_INO, b"ckpt", 0o755)
    assert meta.get_policy(d.ino) == DirPolicy()
    meta.set_policy(d.ino, DirPolicy(tier="cold", replicas=3))
    assert meta.get_policy(d.ino) == DirPolicy("cold", None, 3)
    meta.set_policy(d.ino, DirPolicy(tier="cold"))
    assert meta.get_policy(d.ino).replicas is None


def test_files_and_subdirectories_take_the_goal_of_the_nearest_directory_that_sets_one(
        meta: SqlMetaStore) -> None:
    top = meta.mkdir(ROOT_INO, b"data", 0o755)
    mid = meta.mkdir(top.ino, b"v1", 0o755)
    low = meta.mkdir(mid.ino, b"shards", 0o755)
    deep = meta.create(low.ino, b"part-0", 0o644)
    beside = meta.create(ROOT_INO, b"loose", 0o644)
    inos = [top.ino, mid.ino, low.ino, deep.ino, beside.ino, ROOT_INO]
    assert meta.replica_goals(inos) == {}  # none set: the caller's default
    meta.set_policy(top.ino, DirPolicy(replicas=3))
    assert meta.replica_goals(inos) == {top.ino: 3, mid.ino: 3, low.ino: 3, deep.ino: 3}
    meta.set_policy(mid.ino, DirPolicy(replicas=1))  # the nearest wins
    assert meta.replica_goals(inos) == {top.ino: 3, mid.ino: 1, low.ino: 1, deep.ino: 1}
    meta.set_policy(ROOT_INO, DirPolicy(replicas=2))
    assert meta.replica_goals(inos) == {top.ino: 3, mid.ino: 1, low.ino: 1, deep.ino: 1,
                                        beside.ino: 2, ROOT_INO: 2}
    assert meta.replica_goals([10**9]) == {}  # gone: no goal, no error
    # A file keeps the goal of the tree it was created in (moving it copies nothing).
    meta.rename(low.ino, b"part-0", ROOT_INO, b"moved")
    assert meta.replica_goals([deep.ino]) == {deep.ino: 1}
    # A directory moved under another tree takes that tree's goal.
    meta.rename(mid.ino, b"shards", ROOT_INO, b"shards")
    assert meta.replica_goals([low.ino]) == {low.ino: 2}


def test_many_inodes_are_answered_in_pages(meta: SqlMetaStore) -> None:
    d = meta.mkdir(ROOT_INO, b"many", 0o755)
    meta.set_policy(d.ino, DirPolicy(replicas=2))
    files = [meta.create(d.ino, f"f{i}".encode(), 0o644).ino for i in range(1200)]
    assert meta.replica_goals(files) == dict.fromkeys(files, 2)


def test_new_slices_take_the_tier_of_their_directory(meta: SqlMetaStore) -> None:
    """The tier of the nearest directory that sets one, at or above a directory,
    at or above the directory a file was made in; unknown inodes, none."""
    hot = meta.mkdir(ROOT_INO, b"hot", 0o755)
    before = meta.mkdir(hot.ino, b"old-sub", 0o755)
    deep = meta.create(before.ino, b"deep", 0o644)
    f = meta.create(hot.ino, b"f", 0o644)
    loose = meta.create(ROOT_INO, b"loose", 0o644)
    inos = [hot.ino, before.ino, deep.ino, f.ino, loose.ino, ROOT_INO, 10**9]
    assert meta.placement_tiers(inos) == {}
    meta.set_policy(hot.ino, DirPolicy(tier="hot"))
    new_sub = meta.mkdir(hot.ino, b"new-sub", 0o755)
    g = meta.create(new_sub.ino, b"g", 0o644)
    assert meta.placement_tiers([*inos, new_sub.ino, g.ino]) == {
        hot.ino: "hot", before.ino: "hot", deep.ino: "hot", f.ino: "hot",
        new_sub.ino: "hot", g.ino: "hot"}
    meta.set_policy(before.ino, DirPolicy(tier="cold"))  # the nearest wins
    assert meta.placement_tiers([deep.ino, f.ino]) == {deep.ino: "cold", f.ino: "hot"}
    meta.set_policy(before.ino, DirPolicy())
    meta.rename(hot.ino, b"f", ROOT_INO, b"moved")  # a file keeps its tree's tier
    assert meta.placement_tiers([f.ino]) == {f.ino: "hot"}
    files = [meta.create(new_sub.ino, f"p{i}".encode(), 0o644).ino for i in range(700)]
    assert meta.placement_tiers(files) == dict.fromkeys(files, "hot")  # in pages


@pytest.mark.parametrize("tier", ["warm", "HOT", ""])
def test_a_tier_that_is_not_hot_or_cold_is_einval(meta: SqlMetaStore, tier: str) -> None:
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.set_policy, d.ino, DirPolicy(tier=tier)) == errno.EINVAL
    assert meta.get_policy(d.ino) == DirPolicy()


def test_a_tier_stored_before_tiers_were_checked_does_not_block_the_rest(
        meta: SqlMetaStore) -> None:
    """Any string was stored as a tier once: a policy change keeping it works,
    changing it to another unknown one does not."""
    d = meta.mkdir(ROOT_INO, b"legacy", 0o755)
    meta.backend.run(lambda tx: tx.run("UPDATE inodes SET tier = 'ssd' WHERE ino = ?",
                                       (d.ino,)), "write")
    meta.set_policy(d.ino, DirPolicy(tier="ssd", replicas=2))
    assert meta.get_policy(d.ino) == DirPolicy("ssd", None, 2)
    assert errno_of(meta.set_policy, d.ino, DirPolicy(tier="warm")) == errno.EINVAL
    meta.set_policy(d.ino, DirPolicy(tier="cold"))
    assert meta.get_policy(d.ino).tier == "cold"


@pytest.mark.parametrize("goal", [0, 17, -1, True])
def test_a_goal_outside_1_to_16_is_einval(meta: SqlMetaStore, goal: int) -> None:
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    assert errno_of(meta.set_policy, d.ino, DirPolicy(replicas=goal)) == errno.EINVAL
    assert meta.get_policy(d.ino) == DirPolicy()


def test_only_the_owner_sets_a_goal_and_only_on_a_directory(meta: SqlMetaStore) -> None:
    d = meta.mkdir(ROOT_INO, b"d", 0o755)
    f = meta.create(ROOT_INO, b"f", 0o644)
    assert errno_of(meta.set_policy, d.ino, DirPolicy(replicas=2), Ctx(uid=5, gid=5)) \
        == errno.EPERM
    assert errno_of(meta.set_policy, f.ino, DirPolicy(replicas=2)) == errno.ENOTDIR


def test_a_version_5_database_gains_goals_and_drive_states_when_opened(
        meta_url: str, meta: SqlMetaStore) -> None:
    d = meta.mkdir(ROOT_INO, b"d", 0o755)

    def downgrade(tx) -> None:  # type: ignore[no-untyped-def]
        tx.run("ALTER TABLE inodes DROP COLUMN replicas")
        tx.run("DROP TABLE drive_states")
        tx.run("UPDATE format SET schema_version = 5")

    meta.backend.run(downgrade, "write")
    meta.close()
    again = open_meta(meta_url)
    try:
        assert again.format_info().schema_version == SCHEMA_VERSION == 7
        assert again.get_policy(d.ino) == DirPolicy()
        again.set_policy(d.ino, DirPolicy(replicas=2))
        assert again.replica_goals([d.ino]) == {d.ino: 2}
        assert again.drive_states() == {}
    finally:
        again.close()


def server_drives(n: int) -> list[ServerDrive]:
    return [ServerDrive(i, f"emulated:/srv/d{i}.img:4G", str(uuid.uuid4()), "cold", 4 * GiB,
                        GiB) for i in range(n)]


def test_a_drive_taken_offline_is_listed_until_it_is_online_again(meta: SqlMetaStore) -> None:
    sid = meta.register_server("h1:7070", server_drives(2))
    assert meta.drive_states() == {}
    meta.set_drive_state(sid, 1, "offline")
    meta.set_drive_state(sid, 1, "offline")  # idempotent
    assert meta.drive_states() == {(sid, 1): "offline"}
    meta.heartbeat_server(sid, server_drives(2))  # a heartbeat leaves the state alone
    assert meta.drive_states() == {(sid, 1): "offline"}
    meta.set_drive_state(sid, 1, None)
    assert meta.drive_states() == {}


def test_a_drive_state_names_a_known_drive_and_a_known_state(meta: SqlMetaStore) -> None:
    sid = meta.register_server("h1:7070", server_drives(1))
    assert errno_of(meta.set_drive_state, sid + 1, 0, "offline") == errno.ENOENT
    assert errno_of(meta.set_drive_state, sid, 5, "offline") == errno.ENOENT
    assert errno_of(meta.set_drive_state, sid, 0, "broken") == errno.EINVAL
    assert meta.drive_states() == {}


def test_forgetting_a_server_forgets_its_drive_states(meta: SqlMetaStore) -> None:
    kept = meta.register_server("h1:7070", server_drives(1))
    gone = meta.register_server("h2:7070", server_drives(2))
    meta.set_drive_state(kept, 0, "offline")
    meta.set_drive_state(gone, 1, "offline")
    meta.unregister_server(gone)  # a clean stop keeps them
    assert set(meta.drive_states()) == {(kept, 0), (gone, 1)}
    meta.unregister_server(gone, forget=True)
    assert meta.drive_states() == {(kept, 0): "offline"}
