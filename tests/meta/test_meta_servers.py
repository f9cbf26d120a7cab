"""Storage-server membership and the cluster secret, on every metadata backend."""

from __future__ import annotations

import errno
import threading
import time
import uuid

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import ServerDrive
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import FsError
from shinglefs.meta.schema import SCHEMA_VERSION

GiB = 1024**3


def drives(*uuids: str | None, free: int = GiB) -> list[ServerDrive]:
    return [ServerDrive(i, f"emulated:/srv/d{i}.img:4G", u, "cold" if i else "hot", 4 * GiB, free)
            for i, u in enumerate(uuids)]


def test_a_registered_server_is_listed_live_with_its_drives_and_labels(
        meta: SqlMetaStore) -> None:
    mine = drives(str(uuid.uuid4()), str(uuid.uuid4()))
    sid = meta.register_server("10.0.0.1:7070", mine, {"rack": "a"})
    (server,) = meta.list_servers()
    assert (server.id, server.address, server.labels, server.live) == (
        sid, "10.0.0.1:7070", {"rack": "a"}, True)
    assert server.drives == tuple(mine) and server.stopped_ns == 0
    assert server.tiers() == {"hot": (4 * GiB, GiB), "cold": (4 * GiB, GiB)}


def test_servers_get_distinct_ids(meta: SqlMetaStore) -> None:
    a = meta.register_server("h1:7070", drives(str(uuid.uuid4())))
    b = meta.register_server("h2:7070", drives(str(uuid.uuid4())))
    assert a != b
    assert [s.address for s in meta.list_servers()] == (
        ["h1:7070", "h2:7070"] if a < b else ["h2:7070", "h1:7070"])


def test_a_restarted_server_rejoins_under_its_id_even_at_another_address(
        meta: SqlMetaStore) -> None:
    u0, u1 = str(uuid.uuid4()), str(uuid.uuid4())
    sid = meta.register_server("h1:7070", drives(u0, u1))
    meta.register_server("h2:7070", drives(str(uuid.uuid4())))
    meta.unregister_server(sid)
    again = meta.register_server("h9:7071", drives(u0, u1), {"rack": "b"})
    assert again == sid
    (server,) = [s for s in meta.list_servers() if s.id == sid]
    assert (server.address, server.labels, server.live) == ("h9:7071", {"rack": "b"}, True)


def test_drives_without_uuid_rejoin_by_address_and_specs(meta: SqlMetaStore) -> None:
    sid = meta.register_server("h1:7070", drives(None, None))
    assert meta.register_server("h1:7070", drives(None, None)) == sid
    assert meta.register_server("h2:7070", drives(None, None)) != sid  # another host's /srv


def test_heartbeat_records_free_space(meta: SqlMetaStore) -> None:
    sid = meta.register_server("h1:7070", drives(str(uuid.uuid4())))
    before = meta.list_servers()[0].heartbeat_ns
    fuller = drives(meta.list_servers()[0].drives[0].uuid, free=123)
    meta.heartbeat_server(sid, fuller)
    (server,) = meta.list_servers()
    assert server.drives[0].free_bytes == 123 and server.heartbeat_ns >= before


def test_a_server_without_recent_heartbeat_is_not_live(meta: SqlMetaStore) -> None:
    sid = meta.register_server("h1:7070", drives(str(uuid.uuid4())))
    time.sleep(0.05)
    assert not meta.list_servers(timeout_s=0.01)[0].live
    meta.heartbeat_server(sid, drives(str(uuid.uuid4())))
    assert meta.list_servers(timeout_s=10)[0].live


def test_unregister_stops_the_server_and_heartbeats_then_fail_stale(
        meta: SqlMetaStore) -> None:
    mine = drives(str(uuid.uuid4()))
    sid = meta.register_server("h1:7070", mine)
    meta.unregister_server(sid)
    meta.unregister_server(sid)  # idempotent
    (server,) = meta.list_servers()
    assert not server.live and server.stopped_ns > 0
    with pytest.raises(FsError) as err:
        meta.heartbeat_server(sid, mine)
    assert err.value.errno == errno.ESTALE


def test_forget_removes_the_server_for_good(meta: SqlMetaStore) -> None:
    mine = drives(str(uuid.uuid4()))
    sid = meta.register_server("h1:7070", mine)
    meta.unregister_server(sid, forget=True)
    assert meta.list_servers() == []
    assert meta.register_server("h1:7070", mine) != sid  # ids are never reused


@pytest.mark.parametrize("address, bad, labels", [
    ("", drives(None), {}),
    ("h:1", [], {}),
    ("h:1", [ServerDrive(0, "x:y", None, "lukewarm", 1, 1)], {}),
    ("h:1", drives(None) + drives(None), {}),
    ("h:1", drives(None), {"": "x"}),
])
def test_bad_registrations_are_einval(meta: SqlMetaStore, address: str,
                                     bad: list[ServerDrive], labels: dict[str, str]) -> None:
    with pytest.raises(FsError) as err:
        meta.register_server(address, bad, labels)
    assert err.value.errno == errno.EINVAL
    assert meta.list_servers() == []


def test_the_cluster_secret_is_the_one_given_at_format(meta: SqlMetaStore) -> None:
    assert meta.cluster_secret() == "s3cret"


def test_an_empty_secret_is_generated_once_for_concurrent_first_callers(
        meta_url: str, meta: SqlMetaStore) -> None:
    meta.backend.run(lambda tx: tx.run("UPDATE format SET secret = ''"), "write")
    stores = [open_meta(meta_url) for _ in range(4)]
    seen: list[str] = []
    try:
        threads = [threading.Thread(target=lambda s=s: seen.append(s.cluster_secret()))
                   for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for s in stores:
            s.close()
    assert len(seen) == 4 and len(set(seen)) == 1
    assert len(seen[0]) == 64 and meta.cluster_secret() == seen[0]


def test_a_version_4_database_gains_the_servers_table_when_opened(
        meta_url: str, meta: SqlMetaStore) -> None:
    def downgrade(tx) -> None:  # type: ignore[no-untyped-def]
        tx.run("DROP TABLE servers")
        tx.run("DELETE FROM ids WHERE name = 'server'")
        tx.run("UPDATE format SET schema_version = 4")

    meta.backend.run(downgrade, "write")
    meta.close()
    again = open_meta(meta_url)
    try:
        assert again.format_info().schema_version == SCHEMA_VERSION == 7
        sid = again.register_server("h1:7070", drives(str(uuid.uuid4())))
        assert [s.id for s in again.list_servers()] == [sid]
    finally:
        again.close()
