"""Inline slices: bytes committed into meta with their reference (schema 4)."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

from shinglefs.meta import open_meta
from shinglefs.meta.api import INLINE_SLICE_BIT, SliceCommit, SliceRef, is_inline_slice
from shinglefs.meta.engine import SqlMetaStore
from shinglefs.meta.errors import FsError
from shinglefs.meta.schema import SCHEMA_VERSION


def _new_file(meta: SqlMetaStore, name: bytes) -> int:
    return meta.mknod(1, name, 0o100644).ino


def _inline(meta: SqlMetaStore, ino: int, data: bytes, at: int = 0) -> int:
    sid = meta.next_slice_id() | INLINE_SLICE_BIT
    meta.commit_slices([SliceCommit(ino, 0, SliceRef(sid, at, len(data), 0), at + len(data),
                                    slice_length=len(data), inline=data)])
    return sid


def _rows(meta: SqlMetaStore, table: str) -> int:
    return int(meta.backend.run(lambda tx: tx.one(f"SELECT COUNT(*) FROM {table}")[0], "read"))


def test_read_map_hands_over_inline_bytes_cut_to_each_piece(
        meta: SqlMetaStore, check: Callable[[], None]) -> None:
    ino = _new_file(meta, b"f")
    sid = _inline(meta, ino, b"0123456789")
    [piece] = meta.read_map(ino, 0, 100)
    assert is_inline_slice(piece.slice_id or 0) and piece.inline == b"0123456789"
    # A later regular slice over the middle leaves two inline runs around it.
    meta.commit_slice(ino, 0, SliceRef(5, 3, 4, 0), 10, slice_length=4)
    pieces = meta.read_map(ino, 1, 8)
    assert [(p.file_offset, p.length, p.slice_id, p.inline) for p in pieces] == [
        (1, 2, sid, b"12"), (3, 4, 5, None), (7, 2, sid, b"78")]
    check()


def test_an_inline_slice_is_deleted_with_its_last_reference_not_queued(
        meta: SqlMetaStore, check: Callable[[], None]) -> None:
    ino = _new_file(meta, b"f")
    _inline(meta, ino, b"abc")
    assert _rows(meta, "inline_slices") == 1
    meta.truncate(ino, 0)
    assert _rows(meta, "inline_slices") == 0
    assert _rows(meta, "deletions") == 0  # nothing for the drives' deletion queue
    assert meta.pop_deletions() == []
    _inline(meta, ino, b"xyz")
    meta.unlink(1, b"f")
    assert _rows(meta, "inline_slices") == 0
    check()


@pytest.mark.parametrize("commit", [
    lambda sid: SliceCommit(2, 0, SliceRef(sid, 0, 3, 0), 3, slice_length=3),  # no bytes
    lambda sid: SliceCommit(2, 0, SliceRef(sid & ~INLINE_SLICE_BIT, 0, 3, 0), 3,
                            inline=b"abc"),  # bytes for a regular id
    lambda sid: SliceCommit(2, 0, SliceRef(sid, 0, 4, 0), 4, inline=b"abc"),  # too short
])
def test_inline_commits_that_do_not_add_up_are_refused(
        meta: SqlMetaStore, commit: Callable[[int], SliceCommit]) -> None:
    ino = _new_file(meta, b"f")
    assert ino == 2
    with pytest.raises(FsError) as err:
        meta.commit_slices([commit(meta.next_slice_id() | INLINE_SLICE_BIT)])
    assert err.value.errno == errno.EINVAL
    assert meta.getattr(ino).size == 0 and _rows(meta, "inline_slices") == 0


def test_check_finds_inline_bytes_missing_or_orphaned(meta: SqlMetaStore) -> None:
    from shinglefs.meta.check import check_consistency

    ino = _new_file(meta, b"f")
    sid = _inline(meta, ino, b"abcdef")
    meta.backend.run(lambda tx: tx.run("UPDATE inline_slices SET data = ? WHERE slice_id = ?",
                                       (b"ab", sid)), "write")
    meta.backend.run(lambda tx: tx.run("INSERT INTO inline_slices VALUES (?, ?)",
                                       (INLINE_SLICE_BIT | 999, b"zz")), "write")
    details = [p.detail for p in check_consistency(meta) if p.check == "inline_slices"]
    assert any("files reference 6 bytes, meta holds 2" in d for d in details)
    assert any("inline bytes of unknown slice" in d for d in details)


def test_a_version_3_database_gains_the_inline_table_when_opened(meta_url: str,
                                                                 meta: SqlMetaStore) -> None:
    def downgrade(tx) -> None:  # type: ignore[no-untyped-def]
        tx.run("DROP TABLE inline_slices")
        tx.run("UPDATE format SET schema_version = 3")

    meta.backend.run(downgrade, "write")
    meta.close()
    again = open_meta(meta_url)
    try:
        assert again.format_info().schema_version == SCHEMA_VERSION == 7
        ino = _new_file(again, b"f")  # type: ignore[arg-type]
        _inline(again, ino, b"after migration")  # type: ignore[arg-type]
        assert again.read_map(ino, 0, 100)[0].inline == b"after migration"
    finally:
        again.close()
