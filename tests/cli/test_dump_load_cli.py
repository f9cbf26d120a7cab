"""``shinglefs dump`` and ``load`` (and ``scrub --rate``) run as a user runs them.

Each case runs the real console script in a subprocess from a working
directory of its own: where a dump goes (a pipe, the command's standard
output, a FIFO, a symlink, a file already there, a missing directory), how a
relative SQLite URL is read, and that every refusal is one line with its
documented exit code (docs/cli.md) and no traceback.
"""

from __future__ import annotations

import ast
import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shinglefs.fuse.harness import shinglefs_command

SRC = Path(__file__).resolve().parents[2] / "src" / "shinglefs"
URL = "sqlite3:data/meta.db"


def run(cwd: Path, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("capture_output", True)
    return subprocess.run([*shinglefs_command(), *args], cwd=cwd, text=True, timeout=120,
                          check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


def refused(result: subprocess.CompletedProcess[str], code: int) -> str:
    """One error line (and its hint), exit ``code``, no traceback; returns the error line."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert lines and lines[0].startswith("shinglefs: error:"), lines
    assert all(ln.startswith(("shinglefs: error:", "shinglefs: hint:")) for ln in lines), lines
    return lines[0]


def is_complete_dump(text: str) -> bool:
    lines = text.splitlines()
    return (len(lines) > 3 and json.loads(lines[0]).get("shinglefs_dump") == 1
            and json.loads(lines[-1]).get("complete") is True)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A formatted file system in ``data/`` and a dump of it, ``d.jsonl``."""
    root = tmp_path_factory.mktemp("dumpcli")
    (root / "data").mkdir()
    made = run(root, "format", URL, "--drive", "smr:data/smr0.img:2G")
    assert made.returncode == 0, made.stderr
    assert run(root, "dump", URL, "d.jsonl").returncode == 0
    return root


# ---- where the dump goes ----------------------------------------------------------------


def test_dump_to_dev_stdout_of_a_pipe_streams_it_and_leaves_dev_stdout_alone(
        work: Path) -> None:
    if not os.path.islink("/dev/stdout"):
        pytest.skip("/dev/stdout is not a symlink on this machine")
    before = os.readlink("/dev/stdout")
    piped = run(work, "dump", URL, "/dev/stdout")
    assert piped.returncode == 0, piped.stderr
    assert is_complete_dump(piped.stdout)
    assert os.path.islink("/dev/stdout") and os.readlink("/dev/stdout") == before


def test_dump_to_proc_self_fd_1_of_a_pipe_never_seeks(work: Path) -> None:
    piped = run(work, "dump", URL, "/proc/self/fd/1")
    assert piped.returncode == 0, piped.stderr
    assert is_complete_dump(piped.stdout)


def test_dump_to_a_link_to_its_own_stdout_writes_the_redirected_file(work: Path) -> None:
    """``dump URL /dev/stdout > out.txt``: the shell opened out.txt; the dump goes
    there and the link (here one of our own, like /dev/stdout) stays a link."""
    link = work / "my-stdout"
    link.symlink_to("/proc/self/fd/1")
    out = work / "out.txt"
    with open(out, "w") as stdout:
        done = run(work, "dump", URL, str(link), stdout=stdout, stderr=subprocess.PIPE,
                   capture_output=False)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    assert is_complete_dump(out.read_text())


def test_dump_to_a_fifo_streams_into_it(work: Path) -> None:
    fifo = work / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    done = run(work, "dump", URL, str(fifo))
    reader.join(60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert is_complete_dump(got[0].decode())


def test_a_new_dump_is_private_and_leaves_no_temporary_file(work: Path) -> None:
    (work / "new").mkdir()
    assert run(work, "dump", URL, "new/n.jsonl").returncode == 0
    assert [p.name for p in (work / "new").iterdir()] == ["n.jsonl"]
    assert stat.S_IMODE(os.stat(work / "new" / "n.jsonl").st_mode) == 0o600  # holds the secret
    assert is_complete_dump((work / "new" / "n.jsonl").read_text())


def test_a_dangling_link_gets_the_dump_at_its_target_and_stays_a_link(work: Path) -> None:
    (work / "dangling").mkdir()
    link = work / "dangling" / "l.jsonl"
    link.symlink_to("real.jsonl")
    assert run(work, "dump", URL, str(link)).returncode == 0
    assert link.is_symlink() and is_complete_dump((work / "dangling" / "real.jsonl").read_text())


def test_an_existing_file_is_never_overwritten_directly_or_through_a_link(work: Path) -> None:
    (work / "kept").mkdir()
    real = work / "kept" / "real.jsonl"
    real.write_text("yesterday\n")
    link = work / "kept" / "l.jsonl"
    link.symlink_to("real.jsonl")
    for target in (real, link):
        line = refused(run(work, "dump", URL, str(target)), 20)
        assert "already exists" in line
    assert real.read_text() == "yesterday\n" and link.is_symlink()
    assert sorted(p.name for p in (work / "kept").iterdir()) == ["l.jsonl", "real.jsonl"]


def test_a_directory_or_a_missing_directory_is_one_line_and_exit_20(work: Path) -> None:
    (work / "adir").mkdir(exist_ok=True)
    assert "directory" in refused(run(work, "dump", URL, "adir"), 20)
    assert "does not exist" in refused(run(work, "dump", URL, "/nonexistdir/x.jsonl"), 20)
    assert not Path("/nonexistdir").exists()


# ---- load -------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["sqlite3:copy1/meta.db", "sqlite3://copy2/meta.db"])
def test_load_takes_a_relative_sqlite_url_like_the_other_commands(work: Path,
                                                                  spelling: str) -> None:
    (work / spelling.split("/")[-2].split(":")[-1]).mkdir()
    loaded = run(work, "load", "d.jsonl", spelling)
    assert loaded.returncode == 0, loaded.stderr
    again = run(work, "dump", spelling, "/dev/stdout" if os.path.islink("/dev/stdout")
                else "/proc/self/fd/1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[1:] == (work / "d.jsonl").read_text().splitlines()[1:]


def test_load_from_drives_takes_a_relative_sqlite_url(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    assert run(tmp_path, "format", URL, "--drive", "smr:data/smr0.img:2G").returncode == 0
    backup = subprocess.run(  # a clean close writes the metadata backup to the drives
        [sys.executable, "-c", "import shinglefs, sys; shinglefs.connect(sys.argv[1]).close()",
         f"sqlite3://{tmp_path}/data/meta.db"], capture_output=True, text=True, check=False)
    assert backup.returncode == 0, backup.stderr
    (tmp_path / "again").mkdir()
    # While the drives' own database lies beside them, a second one is refused.
    line = refused(run(tmp_path, "load", "--from-drives", "smr:data/smr0.img",
                       "sqlite3:again/meta.db"), 2)
    assert f"has its metadata database at {tmp_path}/data/meta.db" in line
    assert not (tmp_path / "again" / "meta.db").exists()
    (tmp_path / "data" / "meta.db").rename(tmp_path / "lost.db")  # lost: out of data/
    loaded = run(tmp_path, "load", "--from-drives", "smr:data/smr0.img", "sqlite3:again/meta.db")
    assert loaded.returncode == 0, loaded.stderr
    assert (tmp_path / "again" / "meta.db").exists()


def test_a_misspelt_database_name_names_the_database_beside_it(work: Path) -> None:
    """A typo in the file name (``meta.bd``) beside the real database is named as
    such: the hint to rebuild a lost database from the drives would have given
    them a second one, and files deleted through it lost their bytes under the
    first."""
    result = run(work, "status", "sqlite3:data/meta.bd")
    line = refused(result, 3)
    assert f"sqlite3://{work}/data/meta.db beside it holds a file system" in line
    assert "did you mean" in result.stderr and "load" not in result.stderr
    assert not (work / "data" / "meta.bd").exists()


def test_a_fifo_beside_a_missing_database_is_never_opened(tmp_path: Path) -> None:
    """Looking beside a missing SQLite file for the database meant opens only
    regular files: a FIFO there (as /tmp may hold) held ``status`` for good."""
    os.mkfifo(tmp_path / "pipe")
    result = subprocess.run([*shinglefs_command(), "status", f"sqlite3://{tmp_path}/typo.db"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert "does not exist" in refused(result, 3)


def test_a_damaged_dump_is_one_line_and_exit_3(work: Path) -> None:
    lines = (work / "d.jsonl").read_text().splitlines(keepends=True)
    lines[2] = "null\n"
    (work / "null.jsonl").write_text("".join(lines))
    (work / "bad").mkdir()
    assert "line 3" in refused(run(work, "load", "null.jsonl", "sqlite3:bad/meta.db"), 3)


# ---- scrub's --rate, and the hints of these commands --------------------------------------


def test_scrub_rate_that_is_not_a_number_is_one_line_and_exit_2(work: Path) -> None:
    for rate in ("abc", "-1", "nan"):
        assert "--rate" in refused(run(work, "scrub", URL, "--rate", rate), 2)


def _text(node: ast.expr, constants: dict[str, str]) -> str:
    """The literal text of a hint: strings, f-strings' literal parts, sums, names of
    module-level string constants."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v, constants) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _text(node.left, constants) + _text(node.right, constants)
    if isinstance(node, ast.Name):
        return constants.get(node.id, "")
    return ""


def _hints(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    constants = {node.targets[0].id: _text(node.value, {}) for node in tree.body
                 if isinstance(node, ast.Assign) and len(node.targets) == 1
                 and isinstance(node.targets[0], ast.Name)}
    return [_text(node.value, constants) for node in ast.walk(tree)
            if isinstance(node, ast.keyword) and node.arg == "hint"]


@pytest.mark.parametrize("module", ["meta/dump.py", "cli/recovery.py"])
def test_every_hint_of_dump_and_load_names_a_command_and_never_deleting(module: str) -> None:
    hints = _hints(SRC / module)
    assert hints
    for hint in hints:
        assert "`shinglefs " in hint, hint
        assert not re.search(r"\b(drop|delete|remove|rm|wipe|erase)\b", hint, re.I), hint
