"""Readers of records other versions wrote (issue 10): a STATS answer
(``RemoteNode.stats``) and a heartbeat's drive record (``list_servers``)
with a key this version does not know and without an optional one.

Real ``shinglefs server`` processes on loopback, metadata in SQLite.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import asdict
from pathlib import Path

import pytest
from tests.server.test_honest_space import start
from tests.server.test_server_process import TIMEOUT_S, Server

from shinglefs.meta.api import MetaStore
from shinglefs.server.errors import FrameError
from shinglefs.server.process import cluster_key
from shinglefs.server.remote import RemoteNode, node_stats_of


def test_a_stats_answer_with_a_new_key_and_without_an_optional_one_is_read(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        caplog: pytest.LogCaptureFixture) -> None:
    start(meta_url, tmp_path, servers, [128], meta)
    (record,) = meta.list_servers(TIMEOUT_S)
    with RemoteNode(record.address, cluster_key(meta), timeout=30) as remote:
        stats = remote.stats()
    answer = json.loads(json.dumps(asdict(stats)))  # as the server sent it
    answer["rebalance"] = {"state": "idle"}  # keys of a newer server, at every level
    drive = answer["drives"][0]
    drive["zone_health"] = [1, 2]
    drive["store"]["trim_bytes"] = 7
    drive["writes"]["stalls"] = 3
    del drive["runs"]  # fields an older server did not send
    del drive["writes"]["queued_bytes"]
    del drive["store"]["zones_collecting"]
    caplog.set_level(logging.DEBUG, logger="shinglefs.server.remote")
    read = node_stats_of(json.loads(json.dumps(answer)))
    node_stats_of(json.loads(json.dumps(answer)))
    assert read.free_bytes == stats.free_bytes and read.capacity_bytes == stats.capacity_bytes
    (got,) = read.drives
    assert got.runs == [] and got.writes.queued_bytes == 0 and got.store.zones_collecting == 0
    assert got.writes.runs == stats.drives[0].writes.runs
    assert got.store.live_bytes == stats.drives[0].store.live_bytes
    ignored = [r.getMessage() for r in caplog.records if "ignores" in r.getMessage()]
    assert len(ignored) == 4, ignored  # once each, not at every answer
    del answer["drives"][0]["spec"]  # a field without a default: not a node
    with pytest.raises(FrameError, match="spec"):
        node_stats_of(answer)


def test_a_drive_record_with_a_new_key_and_without_an_optional_one_is_read(
        tmp_path: Path, meta_url: str, meta: MetaStore, servers: list[Server],
        caplog: pytest.LogCaptureFixture) -> None:
    """A newer server's heartbeat (a drive record with a field this version does
    not know) and an older one's (no uuid, no tier) both list."""
    start(meta_url, tmp_path, servers, [128, 128], meta)
    for server in servers:
        server.kill()  # no heartbeat rewrites the records from here on
    before = {s.id: s for s in meta.list_servers(TIMEOUT_S)}
    db = sqlite3.connect(meta_url.removeprefix("sqlite3://"))
    try:
        rows = dict(db.execute("SELECT id, drives FROM servers").fetchall())
        newer, older = sorted(rows)
        (drive,) = json.loads(rows[newer])
        drive["smart"] = {"reallocated": 0}
        db.execute("UPDATE servers SET drives = ? WHERE id = ?",
                   (json.dumps([drive]), newer))
        (drive,) = json.loads(rows[older])
        del drive["uuid"], drive["tier"]
        db.execute("UPDATE servers SET drives = ? WHERE id = ?",
                   (json.dumps([drive]), older))
        db.commit()
    finally:
        db.close()
    caplog.set_level(logging.DEBUG, logger="shinglefs.meta.engine.servers")
    after = {s.id: s for s in meta.list_servers(3600)}
    meta.list_servers(3600)
    assert after[newer].drives == before[newer].drives
    (old,) = after[older].drives
    assert old.uuid is None and old.tier == "cold"  # an emulated SMR drive
    assert (old.drive_id, old.spec, old.capacity_bytes, old.free_bytes) == (
        before[older].drives[0].drive_id, before[older].drives[0].spec,
        before[older].drives[0].capacity_bytes, before[older].drives[0].free_bytes)
    ignored = [r.getMessage() for r in caplog.records if "ignores" in r.getMessage()]
    assert len(ignored) == 1, ignored  # once per key, not at every read
