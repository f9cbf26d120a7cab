"""The snapshot request a process sends a mount (fuse/requests.py): what the
CLI makes parses back; anything else is refused with an errno, never run."""

from __future__ import annotations

import errno

import pytest

from shinglefs.fuse.requests import PATH_MAX, parse_snapshot_request, snapshot_request
from shinglefs.meta.errors import FsError


def test_a_request_parses_back() -> None:
    for src, name, ro in ((b"/corpus", b"corpus@v1", True), (b"/a/\xff", b"b\xfe", False)):
        assert parse_snapshot_request(snapshot_request(src, name, ro)) == (src, name, ro)


@pytest.mark.parametrize("value, code", [
    (b"", errno.EINVAL),
    (b"junk", errno.EINVAL),
    (b"snapshot-2\0/a\0b\0rw", errno.EINVAL),          # a version this daemon does not know
    (b"snapshot-1\0/a\0b\0rx", errno.EINVAL),
    (b"snapshot-1\0a\0b\0rw", errno.EINVAL),           # a relative source
    (b"snapshot-1\0/a\0b/c\0rw", errno.EINVAL),        # a path as the new name
    (b"snapshot-1\0/a\0..\0rw", errno.EINVAL),
    (b"snapshot-1\0/a\0\0rw", errno.EINVAL),
    (b"snapshot-1\0/a\0b\0rw\0extra", errno.EINVAL),
    (b"snapshot-1\0/" + b"./" * PATH_MAX + b"\0b\0rw", errno.ENAMETOOLONG),
])
def test_anything_else_is_refused(value: bytes, code: int) -> None:
    with pytest.raises(FsError) as exc:
        parse_snapshot_request(value)
    assert exc.value.errno == code
