"""Commands that never hurt the user (issue 8, section 5).

Each case runs the real ``shinglefs`` console script in a subprocess, from a
working directory of the test's choosing, and checks three things: the exit
code documented in docs/cli.md, one ``shinglefs: error:`` line without a
traceback, and that nothing the command did not create was touched.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.fuse.harness import shinglefs_command
from shinglefs.fuse.mount import mount_entry

SRC = Path(__file__).resolve().parents[2] / "src" / "shinglefs"

# A hint names a Python function when it shows ``Class.method``, ``func()`` or a
# keyword argument of ours; it suggests destroying data when it says so. The
# one exception is ``connect()``: the public Python API, named only in errors
# that nobody but a caller of ``connect()`` can meet.
PYTHON_NAME = re.compile(r"\b[A-Z][a-z]+[A-Z]\w*\.\w+|\b(?!connect\(\))[a-z_][a-z0-9_]*\(\)"
                         r"|\bcheckpoint_path\b")
DESTROYS = re.compile(r"\b(remove|delete|deleting|wipe|erase|rm)\b|start over|drop the old", re.I)


def _literal_text(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value for v in node.values
                        if isinstance(v, ast.Constant) and isinstance(v.value, str))]
    if isinstance(node, ast.BinOp):
        return _literal_text(node.left) + _literal_text(node.right)
    return []


def _hints() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "hint":
                found += [(str(path.relative_to(SRC)), node.value.lineno, text)
                          for text in _literal_text(node.value)]
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "hint"):
                found += [(str(path.relative_to(SRC)), node.lineno, text)
                          for text in _literal_text(node.value)]
    return found


def test_hints_never_name_python_functions_nor_suggest_deleting_data() -> None:
    hints = _hints()
    assert len(hints) > 50  # the scan sees the hints (a broken scan would pass vacuously)
    bad = [h for h in hints if PYTHON_NAME.search(h[2]) or DESTROYS.search(h[2])]
    assert bad == []


# -- the commands, run as a user runs them ---------------------------------------------

GiB = 1024**3
ROOT = os.geteuid() == 0


def run(cwd: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shinglefs_command(), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def refused(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert one error line (plus its hint) and exit ``code``; returns the error line."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert [ln for ln in lines if ln.startswith("shinglefs: error:")] == lines[:1], lines
    assert all(ln.startswith(("shinglefs: error:", "shinglefs: hint:")) for ln in lines), lines
    return lines[0]


def unmount_quietly(path: Path) -> None:
    entry = mount_entry(path)
    if entry is not None and entry["fstype"] == "fuse.shinglefs":
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True, check=False)


def copy_data_dir(src: Path, dst: Path) -> None:
    """A user's ``cp -r`` of a data directory no process has open (WAL included)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.lock"))


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    for name in ("mnt", "mnt2"):
        (tmp_path / name).mkdir()
    try:
        yield tmp_path
    finally:
        for name in ("mnt", "mnt2"):
            unmount_quietly(tmp_path / name)


def small_format(cwd: Path, data: str, name: str = "fs") -> subprocess.CompletedProcess[str]:
    (cwd / data).mkdir(exist_ok=True)
    return run(cwd, "format", f"sqlite3:{data}/meta.db", "--name", name,
               "--drive", f"smr:{data}/smr0.img:2G", "--drive", f"smr:{data}/smr1.img:2G")


@pytest.mark.fuse
def test_up_with_relative_paths_keeps_the_drives_in_the_working_directory(work: Path) -> None:
    up = run(work, "up", "./data", "./mnt")
    assert up.returncode == 0, up.stderr
    try:
        assert (work / "data" / "smr0.img").exists() and (work / "data" / "meta.db").exists()
        (work / "mnt" / "f").write_text("here")
        status = run(Path("/"), "status", str(work / "mnt"), "--json")  # from elsewhere
        assert status.returncode == 0, status.stderr
    finally:
        assert run(work, "umount", "mnt").returncode == 0
    again = run(work / "mnt2", "up", "../data", "../mnt")  # another working directory
    assert again.returncode == 0, again.stderr
    try:
        assert (work / "mnt" / "f").read_text() == "here"
    finally:
        assert run(work, "umount", "./mnt").returncode == 0


@pytest.mark.fuse
def test_a_copied_data_dir_mounts_its_own_drives_while_the_original_is_mounted(
        work: Path) -> None:
    assert small_format(work, "a").returncode == 0
    copy_data_dir(work / "a", work / "b")
    assert run(work, "mount", "sqlite3:a/meta.db", "mnt").returncode == 0
    try:
        copy = run(work, "mount", "sqlite3:b/meta.db", "mnt2")  # was: drive in use (a's drives)
        assert copy.returncode == 0, copy.stderr
        (work / "mnt2" / "only-in-copy").write_text("b")
        assert run(work, "umount", "mnt2").returncode == 0
        assert os.listdir(work / "mnt") == []
    finally:
        run(work, "umount", "mnt")


@pytest.mark.fuse
def test_a_moved_data_dir_mounts(work: Path) -> None:
    assert small_format(work, "a").returncode == 0
    (work / "a").rename(work / "moved")
    mounted = run(work, "mount", "sqlite3:moved/meta.db", "mnt")
    assert mounted.returncode == 0, mounted.stderr
    assert run(work, "umount", "mnt").returncode == 0


def test_a_drive_of_another_file_system_is_refused_in_one_line(work: Path) -> None:
    assert small_format(work, "a").returncode == 0
    assert small_format(work, "b").returncode == 0
    shutil.copy(work / "b" / "smr0.img.zones", work / "a" / "smr0.img.zones")
    line = refused(run(work, "status", "sqlite3:a/meta.db"), 18)
    assert "belongs to another file system" in line


def test_an_error_of_a_command_with_a_progress_bar_is_its_first_line(work: Path) -> None:
    """fsck, scrub and load draw a progress bar only on a terminal: a script's
    stderr starts with the error (it started with a blank line)."""
    assert small_format(work, "a").returncode == 0
    (work / "a" / "smr1.img").rename(work / "aside.img")
    for command in (["fsck", "sqlite3:a/meta.db"], ["scrub", "sqlite3:a/meta.db"],
                    ["load", "missing.jsonl", "sqlite3:b.db"]):
        result = run(work, *command)
        assert result.stderr.startswith("shinglefs: error:"), (command, result.stderr)


def test_a_lost_meta_db_beside_its_drives_names_the_rebuild_command(work: Path) -> None:
    assert small_format(work, "a").returncode == 0
    (work / "a" / "meta.db").rename(work / "meta.db.aside")
    data = (work / "a").resolve()
    for command in (["mount", "sqlite3:a/meta.db", "mnt"], ["fsck", "sqlite3:a/meta.db"]):
        result = run(work, *command)
        assert result.returncode == 3, result.stderr
        assert (f"`shinglefs load --from-drives smr:{data}/smr0.img smr:{data}/smr1.img "
                f"sqlite3://{data}/meta.db`") in result.stderr, result.stderr
        assert not (work / "a" / "meta.db").exists()  # nothing was created


def test_a_missing_or_truncated_drive_is_one_line_with_the_way_back(work: Path) -> None:
    assert small_format(work, "a").returncode == 0
    image = work / "a" / "smr0.img"
    image.rename(work / "aside.img")
    for command in (["status", "sqlite3:a/meta.db"], ["fsck", "sqlite3:a/meta.db"],
                    ["scrub", "sqlite3:a/meta.db"], ["mount", "sqlite3:a/meta.db", "mnt"]):
        line = refused(run(work, *command), 18)
        assert "drive 0 of file system 'fs' is missing: nothing at" in line, (command, line)
    (work / "aside.img").rename(image)
    with open(image, "r+b") as f:
        f.truncate(1 << 20)
    result = run(work, "status", "sqlite3:a/meta.db")
    assert result.returncode == 3 and "put the whole image back" in result.stderr, result.stderr


def test_the_path_of_meta_db_given_for_a_url_gets_its_exact_url(work: Path) -> None:
    assert small_format(work, "a").returncode == 0
    url = f"sqlite3://{work}/a/meta.db"
    for command in (["status", "a/meta.db"], ["fsck", "a/meta.db"],
                    ["dump", "a/meta.db", "out.jsonl"]):
        result = run(work, *command)
        refused(result, 2)
        assert f"hint: a SQLite file's URL is {url}" in result.stderr, (command, result.stderr)
    assert not (work / "out.jsonl").exists()


@pytest.mark.skipif(not ROOT, reason="mounting a tmpfs needs root")
def test_umount_leaves_a_mount_of_another_file_system_alone(work: Path) -> None:
    other = work / "tmpfs"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(other)], check=True)
    try:
        (other / "keep").write_text("mine")
        line = refused(run(work, "umount", "tmpfs"), 17)
        assert "tmpfs mount, not ShingleFS" in line
        refused(run(work, "umount", "--force", "tmpfs"), 17)
        refused(run(work, "status", "tmpfs"), 17)
        assert (other / "keep").read_text() == "mine"
    finally:
        subprocess.run(["umount", str(other)], check=False)


def test_demo_never_deletes_a_directory_it_did_not_make(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    line = refused(run(tmp_path, "demo", "--data-dir", "mine"), 20)
    assert "was not made by `shinglefs demo`" in line
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_a_data_dir_that_cannot_be_written_is_one_line(work: Path) -> None:
    (work / "file").write_text("")
    refused(run(work, "up", "file/data", "mnt"), 20)  # its parent is a file
    ro = work / "ro"
    ro.mkdir()
    if ROOT:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], check=True)
    else:
        ro.chmod(0o500)
    try:
        refused(run(work, "up", "ro/data", "mnt"), 20)
        refused(run(work, "format", "sqlite3:meta.db", "--drive", "smr:ro/d.img:2G"), 20)
    finally:
        if ROOT:
            subprocess.run(["umount", str(ro)], check=False)
    assert mount_entry(work / "mnt") is None


def test_format_names_a_missing_drive_directory_and_creates_nothing(tmp_path: Path) -> None:
    line = refused(run(tmp_path, "format", "sqlite3:meta.db", "--drive", "smr:d0.img:2G",
                       "--drive", "smr:missing/d1.img:2G"), 20)
    assert "directory" in line and "missing" in line and "does not exist" in line
    assert os.listdir(tmp_path) == []  # not d0.img, not meta.db


@pytest.mark.parametrize("size", ["500T", "999999P"])  # EFBIG on ext4; past a C long
def test_a_drive_its_host_cannot_hold_is_one_line_and_format_leaves_nothing(
        tmp_path: Path, size: str) -> None:
    """A format that fails part-way (the first drive made, the second too large)
    undoes what it made: a traceback left a formatted d0.img, a 0-byte d1.img,
    lock files and meta.db, and the same command then said "already exists"
    for a file system that never was."""
    line = refused(run(tmp_path, "format", "sqlite3:meta.db", "--drive", "smr:d0.img:2G",
                       "--drive", f"smr:d1.img:{size}"), 2)
    assert "cannot create" in line and "d1.img" in line
    assert os.listdir(tmp_path) == []
    assert run(tmp_path, "format", "sqlite3:meta.db", "--drive", "smr:d0.img:2G",
               "--drive", "smr:d1.img:2G").returncode == 0


def test_a_drive_whose_lock_file_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    line = refused(run(tmp_path, "format", "sqlite3:meta.db", "--drive", "smr:/proc/d.img:2G"),
                   20)
    assert "cannot create the lock file /proc/d.img.lock" in line
    assert os.listdir(tmp_path) == []


def test_format_never_overwrites_a_drive(tmp_path: Path) -> None:
    assert small_format(tmp_path, "a").returncode == 0
    before = (tmp_path / "a" / "smr0.img.zones").read_bytes()
    line = refused(run(tmp_path, "format", "sqlite3:b.db", "--drive", "smr:a/smr0.img:2G"), 20)
    assert "already exists" in line
    assert (tmp_path / "a" / "smr0.img.zones").read_bytes() == before


def test_format_refuses_a_drive_too_small_with_the_real_minimum(tmp_path: Path) -> None:
    line = refused(run(tmp_path, "format", "sqlite3:meta.db", "--drive", "smr:d.img:1G"), 19)
    assert "needs at least 5" in line and "reserved for GC" in line
    assert os.listdir(tmp_path) == []
    assert run(tmp_path, "format", "sqlite3:meta.db", "--drive",
               "smr:d.img:1536M").returncode == 0  # six 256 MiB zones: the least that works


def test_an_unknown_log_level_is_one_line(tmp_path: Path) -> None:
    line = refused(run(tmp_path, "status", env={"SHINGLEFS_LOG": "chatty"}), 2)
    assert "SHINGLEFS_LOG" in line


@pytest.mark.fuse
def test_mount_options_are_checked_before_mounting(work: Path) -> None:
    assert small_format(work, "a").returncode == 0
    line = refused(run(work, "mount", "sqlite3:a/meta.db", "mnt", "-o", "bogus"), 2)
    assert "unknown mount option 'bogus'" in line
    assert mount_entry(work / "mnt") is None
    line = refused(run(work, "mount", "sqlite3:a/meta.db", "mnt", "-o", "relatime"), 2)
    assert "records no access times" in line
    assert mount_entry(work / "mnt") is None
    good = run(work, "mount", "sqlite3:a/meta.db", "mnt", "-o", "noatime,nodev")
    assert good.returncode == 0, good.stderr
    assert run(work, "umount", "mnt").returncode == 0


def test_version() -> None:
    result = run(Path("/"), "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"shinglefs {__import__('shinglefs').__version__}"


def test_mount_and_status_of_a_missing_sqlite_file_create_nothing(work: Path) -> None:
    line = refused(run(work, "mount", "sqlite3:nothere/meta.db", "mnt"), 3)
    assert "does not exist" in line
    refused(run(work, "status", f"sqlite3://{work / 'none.db'}"), 3)
    assert not (work / "none.db").exists() and not (work / "nothere").exists()
    assert mount_entry(work / "mnt") is None


def test_maintenance_commands_on_a_missing_sqlite_file_create_nothing(work: Path) -> None:
    """A mistyped path given to fsck, scrub, dump or load is one line and exit 3,
    and leaves no empty database (nor an empty dump) behind."""
    missing = f"sqlite3://{work / 'none.db'}"
    for args in (("fsck", missing), ("fsck", "--repair", missing), ("scrub", missing),
                 ("dump", missing, "out.jsonl")):
        assert "does not exist" in refused(run(work, *args), 3)
    line = refused(run(work, "load", "nothere.jsonl", f"sqlite3://{work / 'new.db'}"), 3)
    assert "cannot read the dump" in line
    assert not any((work / n).exists() for n in ("none.db", "out.jsonl", "new.db"))


def test_a_database_that_cannot_be_written_says_how_to_fix_it(work: Path) -> None:
    """Even a reading command writes the metadata (its session, the WAL): an
    immutable meta.db was a bare 'attempt to write a readonly database'."""
    assert small_format(work, "data").returncode == 0
    db = work / "data" / "meta.db"
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root on a file system that has it")
    try:
        result = run(work, "status", f"sqlite3://{db}")
        assert "readonly database" in refused(result, 3)
        assert "make the file and its directory writable" in result.stderr
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)


def test_commands_that_read_an_empty_file_leave_it_empty(work: Path) -> None:
    """status, fsck and dump of a 0-byte file refused it, having written a
    1 KiB SQLite database into it; format may still use it."""
    empty = work / "empty.db"
    empty.touch()
    for args in (("status", f"sqlite3://{empty}"), ("fsck", f"sqlite3://{empty}"),
                 ("dump", f"sqlite3://{empty}", "out.jsonl")):
        assert "is an empty file" in refused(run(work, *args), 3)
    assert empty.stat().st_size == 0 and not (work / "out.jsonl").exists()


@pytest.mark.fuse
def test_relative_sqlite_urls_and_drive_paths_are_the_working_directory_s(work: Path) -> None:
    made = small_format(work, "data")
    assert made.returncode == 0, made.stderr
    assert f"sqlite3://{work / 'data' / 'meta.db'} " in made.stdout  # absolute in the output
    assert (work / "data" / "smr0.img").exists()
    # The sqlite:// alias, relative too, names the same file as sqlite3://.
    mounted = run(work / "data", "mount", "sqlite://meta.db", "../mnt")
    assert mounted.returncode == 0, mounted.stderr
    assert run(work, "umount", "mnt").returncode == 0


def damage(db: Path, table: str | None = None) -> None:
    """Overwrite 8 KiB of ``db``'s tables from the second page on, or only the
    root page of ``table`` (after folding the WAL into the file: a frame in the
    WAL would hide the damage)."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                        (table,)).fetchone()
    conn.close()
    offset, length = (1024, 8192) if table is None else ((root[0] - 1) * page, page)
    with open(db, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * length)


@pytest.mark.fuse
def test_up_on_a_damaged_database_refuses_before_mounting(work: Path) -> None:
    """The mount answers the root's attributes itself before mounting: a damaged
    meta.db is one line with the way back, and no mount whose every request
    says EIO is left behind."""
    assert run(work, "up", "data", "mnt").returncode == 0
    (work / "mnt" / "f").write_text("here")
    assert run(work, "umount", "mnt").returncode == 0
    damage(work / "data" / "meta.db", "inodes")  # opens; the root's attributes fail
    line = refused(run(work, "up", "data", "mnt"), 3)
    assert "malformed" in line
    assert "load --from-drives" in run(work, "up", "data", "mnt").stderr
    assert mount_entry(work / "mnt") is None


def test_a_damaged_or_foreign_database_names_the_way_back(work: Path) -> None:
    """A damaged meta.db is one line and exit 3 whose hint leads to the drives'
    metadata backup (and never suggests deleting anything); so is a file that
    is no database at all, which may be the wrong path."""
    assert small_format(work, "data").returncode == 0
    db = work / "data" / "meta.db"
    damage(db)
    (work / "junk.db").write_bytes(b"not a database " * 100)
    for url in (f"sqlite3://{db}", f"sqlite3://{work / 'junk.db'}"):
        line = refused(run(work, "status", url), 3)
        hint = run(work, "status", url).stderr
        assert "load --from-drives" in hint and "move it aside" in hint, (line, hint)


def _as_nobody(func) -> tuple[int, str]:
    """``func()`` (returning an exit code) in a forked child running as uid/gid
    65534; its exit code and what it wrote to stderr."""
    import tempfile

    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 99
            try:
                os.dup2(err.fileno(), 2)
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                code = func()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), err.read().decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_user_opening_roots_drives_gets_a_typed_error() -> None:
    """fsck or status META_URL as a user who may not open root's drive lock
    files: ``DriveNotPermitted`` (one line at the CLI's boundary, exit 3), not
    a PermissionError traceback. (At the lock: a child running as another user
    cannot import the rest of the CLI from root's 0700 home.)"""
    import tempfile

    from shinglefs.server.errors import DriveNotPermitted
    from shinglefs.server.node import DriveLock

    shared = Path(tempfile.mkdtemp(prefix="shinglefs-users-", dir="/tmp"))
    os.chmod(shared, 0o755)  # every user may reach it; the lock file stays root's
    image = shared / "smr0.img"
    image.write_bytes(b"")
    held = DriveLock("smr:" + str(image), str(image))
    held.acquire()  # root's lock file, 0644

    def open_as_nobody() -> int:
        try:
            DriveLock("smr:" + str(image), str(image)).acquire()
        except DriveNotPermitted as exc:
            os.write(2, f"{exc}\n{exc.hint}\n".encode())
            return exc.exit_code
        return 0

    try:
        code, err = _as_nobody(open_as_nobody)
    finally:
        held.release()
        shutil.rmtree(shared, ignore_errors=True)
    assert code == 3, err
    assert "uid 65534 may not open its lock file" in err and "owned by uid 0" in err, err
    assert "shinglefs status MOUNTPOINT" in err


def test_the_metadata_and_the_drive_images_are_their_owners_alone(work: Path) -> None:
    """meta.db holds the cluster secret and every file's metadata; a drive image
    holds every file's bytes: another user must not read either around the
    mount's permissions (they were 0644)."""
    import stat

    done = small_format(work, "data")
    assert done.returncode == 0, done.stderr
    made = [p for p in (work / "data").iterdir() if not p.name.endswith(".lock")]
    assert any(p.name == "meta.db" for p in made) and any(p.suffix == ".img" for p in made)
    for path in made:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))


def test_main_called_again_in_one_process_registers_its_commands_once() -> None:
    """Every in-process ``main()`` added every command again; each call then
    built all the copies (in-process CLI tests late in a session ran 10-20
    times slower than alone, and a notebook calling it degraded the same)."""
    import contextlib

    from shinglefs.cli.main import app, main

    for _ in range(3):
        with contextlib.suppress(SystemExit):
            main(["--version"])
    names = [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands]
    assert len(names) == len(set(names)), sorted(names)
