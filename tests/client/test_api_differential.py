"""Differential test of the Python API against the local file system (as JuiceFS does
against a local directory): random namespace and file operations on both, comparing
every result and every errno."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fsfixtures import drive_specs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shinglefs.client.api import ShingleFS, connect
from shinglefs.client.filesystem import format_filesystem

NAMES = ["a", "b", "d", "d/a", "d/e"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ShingleFS, Path]]:
    root = tmp_path_factory.mktemp("api-differential")
    url = f"sqlite3://{root}/meta.db"
    format_filesystem(url, drive_specs(root, 1), zone_size=64 * 1024 * 1024)
    fs = connect(url)
    local = root / "local"
    local.mkdir()
    yield fs, local
    fs.close()


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except OSError as exc:
        return ("error", errno.errorcode.get(exc.errno or 0, exc.errno))


def clear(fs: ShingleFS, local: Path) -> None:
    for top, dirs, files in list(fs.walk("/", topdown=False)):
        for name in files:
            fs.unlink(f"{top.rstrip('/')}/{name}")
        for name in dirs:
            fs.rmdir(f"{top.rstrip('/')}/{name}")
    shutil.rmtree(local)
    local.mkdir()


def write(fs_open: Callable[..., Any], path: str, mode: str, data: bytes) -> int:
    with fs_open(path, mode) as f:
        return f.write(data)


def read(fs_open: Callable[..., Any], path: str) -> bytes:
    with fs_open(path, "rb") as f:
        return f.read()


name = st.sampled_from(NAMES)
op = st.one_of(
    st.tuples(st.just("mkdir"), name),
    st.tuples(st.just("rmdir"), name),
    st.tuples(st.just("write"), name, st.sampled_from(["wb", "ab", "xb"]), st.binary(max_size=64)),
    st.tuples(st.just("read"), name),
    st.tuples(st.just("unlink"), name),
    st.tuples(st.just("rename"), name, name),
    st.tuples(st.just("link"), name, name),
    st.tuples(st.just("symlink"), st.sampled_from(["a", "d", "nowhere", "d/a"]), name),
    st.tuples(st.just("truncate"), name, st.integers(0, 100)),
    st.tuples(st.just("listdir"), st.sampled_from(["", "d", "d/e", "a"])),
    st.tuples(st.just("stat"), name),
)


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=1, max_size=30))
def test_python_api_matches_the_local_file_system(
    pair: tuple[ShingleFS, Path], ops: list[tuple]
) -> None:
    fs, local = pair
    clear(fs, local)
    for step in ops:
        got, want = apply(step, fs, local)
        assert got == want, f"{step}: shinglefs {got} != local {want}"


def apply(step: tuple, fs: ShingleFS, local: Path) -> tuple[tuple, tuple]:
    """Run one operation on both; return (shinglefs outcome, local outcome)."""

    def lp(p: str) -> str:
        return str(local / p) if p else str(local)

    def sp(p: str) -> str:
        return "/" + p

    kind, args = step[0], step[1:]
    if kind == "mkdir":
        return outcome(lambda: fs.mkdir(sp(args[0]))), outcome(lambda: os.mkdir(lp(args[0])))
    if kind == "rmdir":
        return outcome(lambda: fs.rmdir(sp(args[0]))), outcome(lambda: os.rmdir(lp(args[0])))
    if kind == "write":
        p, mode, data = args
        return (
            outcome(lambda: write(fs.open, sp(p), mode, data)),
            outcome(lambda: write(open, lp(p), mode, data)),
        )
    if kind == "read":
        return outcome(lambda: read(fs.open, sp(args[0]))), outcome(lambda: read(open, lp(args[0])))
    if kind == "unlink":
        return outcome(lambda: fs.unlink(sp(args[0]))), outcome(lambda: os.unlink(lp(args[0])))
    if kind == "rename":
        return (
            outcome(lambda: fs.rename(sp(args[0]), sp(args[1]))),
            outcome(lambda: os.rename(lp(args[0]), lp(args[1]))),
        )
    if kind == "link":
        return (
            outcome(lambda: fs.link(sp(args[0]), sp(args[1]))),
            outcome(lambda: os.link(lp(args[0]), lp(args[1]), follow_symlinks=False)),
        )
    if kind == "symlink":
        return (
            outcome(lambda: fs.symlink(args[0], sp(args[1]))),
            outcome(lambda: os.symlink(args[0], lp(args[1]))),
        )
    if kind == "truncate":
        return (
            outcome(lambda: fs.truncate(sp(args[0]), args[1])),
            outcome(lambda: os.truncate(lp(args[0]), args[1])),
        )
    if kind == "listdir":
        return (
            outcome(lambda: sorted(fs.listdir(sp(args[0])))),
            outcome(lambda: sorted(os.listdir(lp(args[0])))),
        )
    return (
        outcome(lambda: _brief(fs.stat(sp(args[0])))),
        outcome(lambda: _brief(os.stat(lp(args[0])))),
    )


def _brief(st_: os.stat_result) -> tuple[int, int, int]:
    kind = st_.st_mode & 0o170000
    return kind, st_.st_nlink, st_.st_size if kind != 0o040000 else 0
