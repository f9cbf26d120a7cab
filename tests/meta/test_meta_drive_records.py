"""The drives table keeps each drive's uuid (schema 3), and a version-2 database migrates."""

from __future__ import annotations

import errno

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import DriveRecord
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import FsError
from shinglefs.meta.schema import SCHEMA_VERSION


def test_drive_records_keep_spec_and_uuid_by_drive_id(meta: SqlMetaStore) -> None:
    meta.set_drives(["emulated:smr0.img:1G", "linux:/dev/sdb"], ["u-0", None])
    assert meta.drive_records() == [DriveRecord("emulated:smr0.img:1G", "u-0"),
                                    DriveRecord("linux:/dev/sdb", None)]
    assert meta.drives() == ["emulated:smr0.img:1G", "linux:/dev/sdb"]
    with pytest.raises(FsError) as err:
        meta.set_drives(["emulated:a.img:1G"], ["u-0", "u-1"])
    assert err.value.errno == errno.EINVAL
    assert meta.drive_records()[0].uuid == "u-0"  # unchanged by the refused call


def test_a_version_2_database_gains_drive_uuids_when_opened(meta_url: str,
                                                           meta: SqlMetaStore) -> None:
    # Make it look like version 2: the drives table without its uuid column.
    def downgrade(tx) -> None:  # type: ignore[no-untyped-def]
        tx.run("DROP TABLE drives")
        tx.run("CREATE TABLE drives (id INTEGER PRIMARY KEY, spec TEXT NOT NULL)")
        tx.run("INSERT INTO drives (id, spec) VALUES (0, 'emulated:/x/smr0.img:1G')")
        tx.run("UPDATE format SET schema_version = 2")

    meta.backend.run(downgrade, "write")
    meta.close()

    again = open_meta(meta_url)
    try:
        assert again.format_info().schema_version == SCHEMA_VERSION == 7
        assert again.drive_records() == [DriveRecord("emulated:/x/smr0.img:1G", None)]
        again.set_drives(["emulated:/x/smr0.img:1G"], ["u-0"])
        assert again.drive_records()[0].uuid == "u-0"
    finally:
        again.close()
