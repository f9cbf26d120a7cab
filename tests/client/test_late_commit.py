"""A writer that went silent past the abandoned age never commits deleted bytes.

The pause is made deterministic: a file is open through ``connect()`` with a
slice registered (its first piece stored, the rest not yet committed); then,
as another client's janitor and deletion consumer would while this writer
was paused, the slice is discarded through the meta API, its bytes deleted
and the deletion acked -- its record is gone. The writer then goes on: its
commit must be refused and the user told (at close or fsync), never a
successful close whose file reads EIO later.
"""

from __future__ import annotations

import errno

import pytest
from fsfixtures import FsFactory, MiB, pattern

from shinglefs.client.api import ShingleFS, connect
from shinglefs.client.config import ClientConfig
from shinglefs.meta.api import SliceState
from shinglefs.meta.check import check_consistency

PIECE = 4 * MiB


def paused_writer_loses_its_slice(fs: ShingleFS) -> int:
    """What happens elsewhere while this client's writer is paused: its one WRITING
    slice is discarded, its bytes deleted and the deletion acked. Returns its id."""
    (writer,) = fs.vfs.inodes.writers()
    s = writer.open_slice
    assert s is not None and s.registered
    for future, _n in list(s.inflight):  # the stored piece is on the drive first
        future.result()
    (info,) = fs.vfs.meta.abandoned_slices(0.0)
    assert (info.id, info.state) == (s.slice_id, SliceState.WRITING)
    assert fs.vfs.meta.discard_slices([info.id]) == [info.id]
    assert fs.vfs.run_deletions() == 1  # bytes deleted, then acked: the record is gone
    assert not fs.vfs.node.contains(info.id)
    return info.id


def config() -> ClientConfig:
    # No background janitor, compaction or deletion consumer: the test plays the
    # other client (a background consumer could take the deletion it runs).
    return ClientConfig(piece_size=PIECE, janitor_interval=0, compaction_scan_interval=0,
                        deletion_consumer=False)


@pytest.mark.parametrize("ending", ["close", "fsync"])
def test_a_late_commit_of_a_deleted_slice_reaches_the_user(
    fs_factory: FsFactory, ending: str,
) -> None:
    fs_factory.format()
    data = pattern(91, PIECE)  # one whole piece: stored and registered while writing
    with connect(fs_factory.meta_url, config=config()) as fs:
        f = fs.open("/late.bin", "wb", buffering=0)
        f.write(data)
        sid = paused_writer_loses_its_slice(fs)
        with pytest.raises(OSError) as refused:
            if ending == "fsync":
                f.fsync()
            else:
                f.close()
        assert refused.value.errno == errno.ESTALE
        f.close()  # after the reported error, closing is quiet
        # Nothing points at the deleted bytes: the file is empty, never EIO.
        assert fs.read_bytes("/late.bin") == b""
        assert fs.vfs.meta.slice_records([sid]) == {}
        assert check_consistency(fs.vfs.meta) == []
        # The user writes again; those bytes read back exactly.
        fs.write_bytes("/late.bin", data)
        assert fs.read_bytes("/late.bin") == data
