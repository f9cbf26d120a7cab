"""The path-based Python API and fsspec: real io objects, torch.save/torch.load, errors as OSError."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fsspec
import pytest
import torch
from fsfixtures import FsFactory, MiB, pattern

from shinglefs.client import fsspec_impl
from shinglefs.client.api import ShingleFS, connect


def test_open_modes_seek_tell_readinto(pyfs: ShingleFS) -> None:
    with pyfs.open("/f.bin", "wb") as f:
        assert isinstance(f, io.BufferedWriter)
        f.write(b"0123456789")
        assert f.tell() == 10
    with pyfs.open("/f.bin", "r+b") as f:
        f.seek(3)
        f.write(b"abc")
        f.seek(-2, io.SEEK_END)
        assert f.read() == b"89"
        f.seek(0)
        buf = bytearray(6)
        assert f.readinto(buf) == 6 and bytes(buf) == b"012abc"
    with pyfs.open("/f.bin", "ab") as f:
        f.write(b"!")
    with pyfs.open("/f.bin", "r") as t:
        assert t.read() == "012abc6789!"
    with pytest.raises(FileExistsError):
        pyfs.open("/f.bin", "xb")
    with pyfs.open("/f.bin", "w") as t:
        t.write("text\n")
    assert pyfs.read_bytes("/f.bin") == b"text\n"


def test_namespace_calls_and_oserror_subclasses(pyfs: ShingleFS) -> None:
    pyfs.makedirs("/a/b/c")
    pyfs.makedirs("/a/b", exist_ok=True)
    with pytest.raises(FileExistsError):
        pyfs.makedirs("/a/b")
    pyfs.write_bytes("/a/b/x", b"x")
    assert pyfs.exists("/a/b/x") and pyfs.isfile("/a/b/x") and pyfs.isdir("/a/b")
    assert sorted(pyfs.listdir("/a/b")) == ["c", "x"]
    assert list(pyfs.walk("/a")) == [("/a", ["b"], []), ("/a/b", ["c"], ["x"]), ("/a/b/c", [], [])]
    pyfs.write_bytes("/a/b/y", b"y")
    pyfs.replace("/a/b/y", "/a/b/x")
    assert pyfs.read_bytes("/a/b/x") == b"y"
    pyfs.symlink("b/x", "/a/lnk")
    assert pyfs.read_bytes("/a/lnk") == b"y" and pyfs.readlink("/a/lnk") == "b/x"
    pyfs.link("/a/b/x", "/a/hard")
    assert pyfs.stat("/a/hard").st_nlink == 2
    pyfs.truncate("/a/hard", 0)
    assert pyfs.stat("/a/b/x").st_size == 0
    with pytest.raises(FileNotFoundError):
        pyfs.stat("/missing")
    with pytest.raises(OSError) as exc:
        pyfs.rmdir("/a/b")
    assert exc.value.errno == 39  # ENOTEMPTY
    with pytest.raises(IsADirectoryError):
        pyfs.open("/a", "rb")
    pyfs.remove("/a/b/x")
    assert not pyfs.exists("/a/b/x")


def test_xattrs_through_the_python_api(pyfs: ShingleFS) -> None:
    pyfs.write_bytes("/x", b"1")
    pyfs.setxattr("/x", "user.k", b"v")
    assert pyfs.listxattr("/x") == ["user.k"] and pyfs.getxattr("/x", "user.k") == b"v"
    with pytest.raises(OSError) as bad:  # stored, it broke listxattr through the mount
        pyfs.setxattr("/x", "user.\x00", b"1")
    assert bad.value.errno == errno.EINVAL
    pyfs.removexattr("/x", "user.k")
    assert pyfs.listxattr("/x") == []
    with pytest.raises(OSError) as gone:
        pyfs.removexattr("/x", "user.k")
    assert gone.value.errno == errno.ENODATA


def test_a_mode_no_c_int_holds_is_refused_as_os_chmod_refuses_it(pyfs: ShingleFS) -> None:
    pyfs.write_bytes("/m", b"1")
    with pytest.raises(OverflowError):  # its low bits were set: mode 0000
        pyfs.chmod("/m", 1 << 40)
    assert pyfs.stat("/m").st_mode & 0o7777 == 0o644


def test_paths_are_taken_as_os_takes_them(pyfs: ShingleFS) -> None:
    """The empty path names nothing (it is not the root); bytes and PathLike
    paths work, a name that is not UTF-8 included; anything else is a TypeError."""
    with pytest.raises(FileNotFoundError):
        pyfs.stat("")
    with pytest.raises(FileNotFoundError):
        pyfs.listdir("")
    with pytest.raises(FileNotFoundError):
        pyfs.write_bytes("", b"x")
    raw = b"/caf\xe9"  # Latin-1, not UTF-8: as os.listdir shows it, surrogate-escaped
    pyfs.write_bytes(raw, b"latin")
    assert os.fsencode(pyfs.listdir("/")[0]) == raw[1:]
    assert pyfs.read_bytes("/" + pyfs.listdir("/")[0]) == b"latin"
    assert pyfs.read_bytes(Path(os.fsdecode(raw))) == b"latin"
    pyfs.symlink(os.fsdecode(raw), "/link")
    assert pyfs.read_bytes("/link") == b"latin"
    with pytest.raises(TypeError, match="not int"):
        pyfs.stat(3)  # type: ignore[arg-type]
    assert pyfs.listdir("/") == sorted(pyfs.listdir("/"))


def test_connect_takes_the_sqlite_urls_the_cli_takes(
        fs_factory: FsFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path (the working directory's) and one slash before an absolute
    one: the CLI took both, connect() and fsspec said "not a metadata URL"."""
    fs_factory.format()
    db = Path(fs_factory.meta_url.removeprefix("sqlite3://"))
    monkeypatch.chdir(db.parent.parent)
    for url in (f"sqlite3:{db.parent.name}/{db.name}", f"sqlite3:{db}"):
        with connect(url) as fs:
            fs.write_bytes("/r", b"1")
            assert fs.read_bytes("/r") == b"1"


def test_a_call_after_close_says_the_client_is_shut_down(fs_factory: FsFactory) -> None:
    fs_factory.format()
    fs = connect(fs_factory.meta_url)
    fs.close()
    with pytest.raises(OSError) as closed:  # "Cannot send after transport endpoint shutdown"
        fs.listdir("/")
    assert closed.value.errno == errno.ESHUTDOWN and "shut down" in str(closed.value)


def test_snapshot_through_the_python_api(pyfs: ShingleFS) -> None:
    """A copy of a checkpoint directory, taken while this process still has a
    file open: it holds what the process would read then (the open file's
    buffered bytes too), and the two sides change independently afterwards."""
    pyfs.makedirs("/ckpt/step-1")
    pyfs.write_bytes("/ckpt/step-1/rank0.pt", pattern(3 * MiB, 1))
    with pyfs.open("/ckpt/step-1/rank1.pt", "wb") as f:
        f.write(b"partial")
        f.flush()  # from io's buffer to the file system's
        pyfs.snapshot("/ckpt", "/ckpt@1")
        pyfs.snapshot("/ckpt/step-1/rank0.pt", "/rank0@1", read_only=True)
        f.write(b" more")
    assert pyfs.read_bytes("/ckpt@1/step-1/rank0.pt") == pattern(3 * MiB, 1)
    assert pyfs.read_bytes("/ckpt@1/step-1/rank1.pt") == b"partial"
    assert pyfs.read_bytes("/ckpt/step-1/rank1.pt") == b"partial more"
    assert pyfs.stat("/rank0@1").st_mode & 0o777 == 0o444
    pyfs.write_bytes("/ckpt/step-1/rank0.pt", b"new")
    assert pyfs.read_bytes("/rank0@1") == pattern(3 * MiB, 1)
    with pytest.raises(FileExistsError):
        pyfs.snapshot("/ckpt", "/ckpt@1")
    with pytest.raises(FileNotFoundError):
        pyfs.snapshot("/missing", "/x")
    with pytest.raises(OSError) as exc:
        pyfs.snapshot("/ckpt", "/ckpt/step-1/inside")
    assert exc.value.errno == 22  # EINVAL


def test_a_snapshot_leaves_another_files_write_error_to_that_file(pyfs: ShingleFS) -> None:
    """A snapshot commits every buffered file of this client first; a failure
    of one of them is that file's to report (at its close), not the copy's.
    The failure is recorded the way a background store failure records it."""
    pyfs.makedirs("/a")
    pyfs.makedirs("/b")
    pyfs.write_bytes("/b/x", b"x")
    f = pyfs.open("/a/victim", "wb")
    f.write(b"data")
    f.flush()
    (writer,) = pyfs.vfs.inodes.writers()
    writer._failures.keep(OSError(errno.EIO, "drive failed"))
    pyfs.snapshot("/b", "/b@1")
    assert pyfs.read_bytes("/b@1/x") == b"x"
    with pytest.raises(OSError) as exc:
        f.close()
    assert exc.value.errno == errno.EIO


def test_torch_save_and_load_through_the_python_api(pyfs: ShingleFS) -> None:
    state = {"weight": torch.randn(512, 512), "step": torch.tensor(7)}
    with pyfs.open("/model.pt", "wb") as f:
        torch.save(state, f)
    with pyfs.open("/model.pt", "rb") as f:
        back = torch.load(f)
    assert torch.equal(back["weight"], state["weight"]) and int(back["step"]) == 7


def test_fsync_through_the_api(pyfs: ShingleFS) -> None:
    with pyfs.open("/d.bin", "wb", buffering=0) as raw:
        raw.write(pattern(40, MiB))
        raw.fsync()
        assert pyfs.vfs.meta.getattr(raw.ino).size == MiB


def test_connect_and_fsspec_share_one_connection(fs_factory: FsFactory, monkeypatch) -> None:
    fs_factory.format()
    url = fs_factory.meta_url
    try:
        state = {"w": torch.arange(1000.0)}
        with fsspec.open("shinglefs://ckpt/model.pt", "wb", meta=url) as f:
            torch.save(state, f)
        with fsspec.open("shinglefs://ckpt/model.pt", "rb", meta=url) as f:
            assert torch.equal(torch.load(f)["w"], state["w"])
        monkeypatch.setenv("SHINGLEFS_META", url)
        sfs = fsspec.filesystem("shinglefs")
        assert sfs.ls("/ckpt", detail=False) == ["/ckpt/model.pt"]
        info = sfs.info("shinglefs://ckpt/model.pt")
        assert info["type"] == "file" and info["size"] > 4000
        sfs.pipe_file("/ckpt/big.bin", pattern(5 * MiB, 3))
        free = sfs.fs.statvfs().free_bytes
        sfs.cp_file("/ckpt/model.pt", "/ckpt/copy.pt")
        sfs.cp_file("/ckpt/big.bin", "/ckpt/copy.pt")  # over an existing file
        assert sfs.fs.statvfs().free_bytes == free  # shares the data: nothing stored
        assert sorted(sfs.ls("/ckpt", detail=False)) == [
            "/ckpt/big.bin", "/ckpt/copy.pt", "/ckpt/model.pt"]  # no temporary left
        sfs.pipe_file("/ckpt/big.bin", b"changed")
        assert sfs.cat_file("/ckpt/copy.pt") == pattern(5 * MiB, 3)
        sfs.cp_file("/ckpt/model.pt", "/ckpt/copy.pt")
        sfs.mv("/ckpt/copy.pt", "/ckpt/moved.pt")
        assert sfs.cat_file("/ckpt/moved.pt") == sfs.cat_file("/ckpt/model.pt")
        sfs.fs.symlink("moved.pt", "/ckpt/latest")
        long_name = "/ckpt/" + "n" * 250
        sfs.cp_file("/ckpt/latest", long_name)  # the data a link points at, a long name
        assert sfs.cat_file(long_name) == sfs.cat_file("/ckpt/model.pt")
        assert sfs.info(long_name)["type"] == "file"
        sfs.rm_file(long_name)
        sfs.rm_file("/ckpt/latest")
        sfs.pipe_file("/ckpt/.metadata", b"meta")
        assert sfs.exists("/ckpt/.metadata")
        sfs.rm("/ckpt", recursive=True)
        assert not sfs.exists("/ckpt")
        with pytest.raises(FileNotFoundError):
            sfs.info("/ckpt")
    finally:
        fsspec_impl.close_connections()


def test_fsspec_without_a_meta_url_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("SHINGLEFS_META", raising=False)
    from shinglefs.errors import UsageError

    with pytest.raises(UsageError, match="SHINGLEFS_META"):
        fsspec_impl.ShingleFileSystem(skip_instance_cache=True)


def test_connect_opens_a_formatted_file_system(fs_factory: FsFactory) -> None:
    fs_factory.format()
    with connect(fs_factory.meta_url) as fs:
        fs.write_bytes("/hello", b"world")
    with connect(fs_factory.meta_url) as fs:
        assert fs.read_bytes("/hello") == b"world"
        assert fs.statvfs().capacity_bytes > 0


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this environment (a user's script)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_connects_in_one_process_share_one_file_system(fs_factory: FsFactory) -> None:
    fs_factory.format()
    with connect(fs_factory.meta_url) as first, connect(fs_factory.meta_url) as second:
        assert first.vfs is second.vfs
        first.write_bytes("/a", b"from the first")
        assert second.read_bytes("/a") == b"from the first"
        second.close()
        first.write_bytes("/b", b"still open")  # the last handle keeps it open
    with connect(fs_factory.meta_url) as again:
        assert again.read_bytes("/b") == b"still open"


def test_another_process_shares_the_drives_this_one_holds(fs_factory: FsFactory) -> None:
    fs_factory.format()
    with connect(fs_factory.meta_url) as fs:
        fs.write_bytes("/a", b"from the owner")
        other = run_python(f"""
            import os, shinglefs
            fs = shinglefs.connect({fs_factory.meta_url!r})
            print(fs.read_bytes("/a").decode())
            fs.write_bytes("/big", bytes(range(256)) * 12289)  # stored on the owner's drives
            fs.write_bytes("/small", b"tiny")
            fs.close()
        """)
        assert other.returncode == 0, other.stderr
        assert other.stdout.strip() == "from the owner"
        assert fs.read_bytes("/big") == bytes(range(256)) * 12289
        assert fs.read_bytes("/small") == b"tiny"
        owner = fs.vfs.node
        (sid,) = {p.slice_id for p in fs.vfs.meta.read_map(fs.stat("/big").st_ino, 0, 1 << 30)}
        assert owner.contains(sid)  # the other process's slice is on this process's drive
        fs.unlink("/big")
        fs.vfs.jobs.deletions.run()
        assert not owner.contains(sid)  # its replica names this process as a server
    unshared = run_python(f"""
        import shinglefs
        from shinglefs.client.filesystem import open_filesystem
        from shinglefs.server.errors import DriveInUse
        owner = open_filesystem({fs_factory.meta_url!r})  # neither serves nor joins
        try:
            open_filesystem({fs_factory.meta_url!r})
        except DriveInUse as exc:
            print("in use:", exc)
        owner.shutdown()
    """)
    assert "in use: " in unshared.stdout, unshared.stderr


def test_files_of_a_script_that_never_closes_are_committed_at_exit(
    fs_factory: FsFactory,
) -> None:
    fs_factory.format()
    script = run_python(f"""
        import shinglefs
        fs = shinglefs.connect({fs_factory.meta_url!r})
        fs.makedirs("/ckpt", exist_ok=True)
        with fs.open("/ckpt/closed.bin", "wb") as f:
            f.write(bytes(range(256)) * 4096)
        left_open = fs.open("/ckpt/left-open.bin", "wb")
        left_open.write(b"buffered in the BufferedWriter")
        # no fs.close(), no left_open.close(): the interpreter exits
    """)
    assert script.returncode == 0, script.stderr
    with connect(fs_factory.meta_url) as fs:
        assert fs.read_bytes("/ckpt/closed.bin") == bytes(range(256)) * 4096
        assert fs.read_bytes("/ckpt/left-open.bin") == b"buffered in the BufferedWriter"


def test_a_joined_script_that_never_closes_still_stores_its_files(
    fs_factory: FsFactory,
) -> None:
    """A process joined to another's drives (``shinglefs up`` serving them) sends
    its bytes through thread pools that Python shuts down before ``atexit``:
    the files it left open are committed before that, not left empty."""
    fs_factory.format()
    with connect(fs_factory.meta_url) as owner:  # serves its drives to others
        script = run_python(f"""
            import fsspec, shinglefs
            fs = shinglefs.connect({fs_factory.meta_url!r})
            mid = fs.open("/mid.bin", "wb")
            mid.write(bytes(range(256)) * 400)  # 100 KiB: on a drive, not inline
            big = fs.open("/big.bin", "wb")
            big.write(b"B" * (10 << 20))
            via = fsspec.open("shinglefs:///via-fsspec.bin", "wb",
                              meta={fs_factory.meta_url!r}).open()
            via.write(b"F" * (3 << 20))
            # nothing closed: the interpreter exits
        """)
        assert script.returncode == 0, script.stderr
        assert "Traceback" not in script.stderr, script.stderr
        assert owner.read_bytes("/mid.bin") == bytes(range(256)) * 400
        assert owner.read_bytes("/big.bin") == b"B" * (10 << 20)
        assert owner.read_bytes("/via-fsspec.bin") == b"F" * (3 << 20)


def test_forked_workers_open_file_systems_of_their_own(fs_factory: FsFactory) -> None:
    """DataLoader workers forked from a process that had read through its
    connection (whose TCP connections, threads and session are the parent's):
    fsspec and connect() in a worker open the worker's own file system; the
    parent's handle refuses use there with a clear error; the parent goes on."""
    fs_factory.format()
    with connect(fs_factory.meta_url) as owner:  # serves its drives: the script joins
        owner.makedirs("/data")
        for i in range(4):
            owner.write_bytes(f"/data/f{i}", bytes([i]) * (300 << 10))  # on a drive
        script = run_python(f"""
            import errno, multiprocessing, fsspec, shinglefs
            url = {fs_factory.meta_url!r}
            fs = shinglefs.connect(url)
            assert fs.read_bytes("/data/f0") == bytes([0]) * (300 << 10)  # connections open

            def worker(i):
                with fsspec.open(f"shinglefs:///data/f{{i}}", "rb", meta=url) as f:
                    assert f.read() == bytes([i]) * (300 << 10), "fsspec"
                mine = shinglefs.connect(url)
                assert mine.read_bytes(f"/data/f{{3 - i}}") == bytes([3 - i]) * (300 << 10)
                try:
                    fs.read_bytes("/data/f0")
                except OSError as exc:
                    assert exc.errno == errno.EBADF, exc
                    assert "forked" in str(exc.__cause__), exc.__cause__  # why, with a hint
                else:
                    raise AssertionError("the parent's handle worked in a child")
                mine.close()

            ctx = multiprocessing.get_context("fork")
            procs = [ctx.Process(target=worker, args=(i,)) for i in range(4)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(60)
            print("exit codes", [p.exitcode for p in procs])
            assert fs.read_bytes("/data/f1") == bytes([1]) * (300 << 10)
            fs.write_bytes("/after", b"the parent goes on")
            fs.close()
        """)
        assert script.returncode == 0, script.stderr
        assert "exit codes [0, 0, 0, 0]" in script.stdout, script.stdout + script.stderr
        assert owner.read_bytes("/after") == b"the parent goes on"


def test_a_handle_dropped_without_close_releases_the_file_system(fs_factory: FsFactory) -> None:
    import gc

    fs_factory.format()
    fs = connect(fs_factory.meta_url)
    fs.write_bytes("/x", b"x")
    vfs = fs.vfs
    del fs
    gc.collect()
    assert vfs.closed
    with connect(fs_factory.meta_url) as again:
        assert again.read_bytes("/x") == b"x"


def test_the_readme_example_runs_as_written(fs_factory: FsFactory) -> None:
    """README's Python example: connect() and fsspec on one URL in one process, no close."""
    fs_factory.format()
    url = fs_factory.meta_url
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert "shinglefs.connect(" in block and "fsspec.open(" in block
    code = ("import torch\nmodel = torch.nn.Linear(4, 2)\n"
            + block.replace("sqlite3:///abs/path/data/meta.db", url)
            + "\nassert torch.equal(state['weight'], model.state_dict()['weight'])\n")
    script = run_python(code)
    assert script.returncode == 0, script.stderr
    with connect(url) as fs:
        assert fs.stat("/ckpt/model.pt").st_size > 0


def test_a_cached_fsspec_instance_reconnects_after_close(fs_factory: FsFactory) -> None:
    fs_factory.format()
    url = fs_factory.meta_url
    try:
        sfs = fsspec.filesystem("shinglefs", meta=url)
        sfs.pipe_file("/a", b"1")
        fsspec_impl.close_connections()
        again = fsspec.filesystem("shinglefs", meta=url)
        assert again is sfs  # fsspec's instance cache
        assert again.cat_file("/a") == b"1"
    finally:
        fsspec_impl.close_connections()


def test_fsspec_ranges_from_the_end_and_blocks_read_as_from_a_local_file(
        fs_factory: FsFactory, tmp_path) -> None:
    """fsspec's own ``cat_file`` (negative offsets) and ``read_block`` ask the
    open file its ``size`` (zarr's sharded reads do); compared with fsspec's
    local file system."""
    fs_factory.format()
    data = bytes(range(256)) * 40
    local = fsspec.filesystem("file")
    (tmp_path / "a").write_bytes(data + b"\nline two\n")
    try:
        sfs = fsspec.filesystem("shinglefs", meta=fs_factory.meta_url)
        sfs.pipe_file("/a", data + b"\nline two\n")
        for start, end in ((-5, None), (0, -9995), (-100, -10), (7, 70)):
            assert sfs.cat_file("/a", start=start, end=end) == local.cat_file(
                str(tmp_path / "a"), start=start, end=end), (start, end)
        assert sfs.read_block("/a", 100, 10) == local.read_block(str(tmp_path / "a"), 100, 10)
        assert sfs.read_block("/a", 10000, 50, delimiter=b"\n") == local.read_block(
            str(tmp_path / "a"), 10000, 50, delimiter=b"\n")
        with sfs.open("/a", "rb") as f:
            assert f.size == len(data) + 10
    finally:
        fsspec_impl.close_connections()


def test_fsspec_auto_mkdir_makes_parents_as_an_object_store_would(
        fs_factory: FsFactory) -> None:
    fs_factory.format()
    try:
        plain = fsspec.filesystem("shinglefs", meta=fs_factory.meta_url)
        with pytest.raises(FileNotFoundError):
            plain.pipe_file("/arr/c/0/0", b"chunk")
        made = fsspec.filesystem("shinglefs", meta=fs_factory.meta_url, auto_mkdir=True)
        made.pipe_file("/arr/c/0/0", b"chunk")
        assert plain.cat_file("/arr/c/0/0") == b"chunk"
        assert made.isdir("/arr/c/0")
        with pytest.raises(FileNotFoundError):
            made.cat_file("/arr/c/1/0")  # reading makes nothing
        assert not made.exists("/arr/c/1")
    finally:
        fsspec_impl.close_connections()


# ---- directories remembered by path resolution (api._lookup_dir) -----------------------


def test_renames_and_rmdirs_through_this_client_are_seen_at_once(pyfs: ShingleFS) -> None:
    pyfs.makedirs("/a/b")
    pyfs.write_bytes("/a/b/x", b"x")  # /a and /a/b are remembered now
    pyfs.rename("/a", "/c")
    with pytest.raises(FileNotFoundError):
        pyfs.open("/a/b/y", "wb")
    pyfs.write_bytes("/c/b/y", b"y")
    assert pyfs.read_bytes("/c/b/x") == b"x" and pyfs.read_bytes("/c/b/y") == b"y"
    for name in ("x", "y"):
        pyfs.unlink(f"/c/b/{name}")
    pyfs.rmdir("/c/b")
    pyfs.mkdir("/c/b")  # a new directory under the old name
    pyfs.write_bytes("/c/b/z", b"z")
    assert pyfs.listdir("/c/b") == ["z"] and pyfs.read_bytes("/c/b/z") == b"z"


def test_a_directory_renamed_by_another_client_resolves_anew_after_the_ttl(
    fs_factory: FsFactory, pyfs: ShingleFS
) -> None:
    from shinglefs.meta import open_meta
    from shinglefs.meta.api import ROOT_INO

    pyfs.vfs.dir_names.ttl = 0.05
    pyfs.makedirs("/d/sub")
    pyfs.write_bytes("/d/sub/f", b"1")
    other = open_meta(fs_factory.meta_url)
    try:
        other.rename(ROOT_INO, b"d", ROOT_INO, b"e")
    finally:
        other.close()
    time.sleep(0.1)
    assert not pyfs.exists("/d/sub/f")
    with pytest.raises(FileNotFoundError):
        pyfs.open("/d/sub/g", "wb")
    assert pyfs.read_bytes("/e/sub/f") == b"1"


def test_a_remembered_directory_is_searched_only_with_permission(pyfs: ShingleFS) -> None:
    from shinglefs.meta.api import Ctx

    pyfs.makedirs("/p/q")
    pyfs.chmod("/p/q", 0o777)
    pyfs.chmod("/p", 0o700)
    pyfs.write_bytes("/p/q/root", b"r")  # root remembers /p (mode 700) and /p/q
    user = ShingleFS(pyfs.vfs, Ctx(uid=1000, gid=1000))
    with pytest.raises(PermissionError):
        user.open("/p/q/u", "wb")
    pyfs.chmod("/p", 0o755)
    user.write_bytes("/p/q/u", b"u")
    assert pyfs.read_bytes("/p/q/u") == b"u"
