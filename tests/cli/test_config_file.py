"""The configuration file ``shinglefs.toml`` (docs/configuration.md).

Unit tests of ``cli.configfile`` (which file, typed keys, precedence), then the
real commands: ``format`` and ``mount`` run as the ``shinglefs`` console script
with a configuration file, a flag overriding it, and a bad key refused before
anything is created or mounted.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shinglefs.cli.configfile import (
    CONFIG_ENV,
    SYSTEM_CONFIG,
    config_candidates,
    find_config,
    load_settings,
)
from shinglefs.cli.errors import ConfigFileError
from shinglefs.client.config import READ_CACHE_ENV
from shinglefs.errors import UsageError
from shinglefs.fuse.harness import shinglefs_command
from shinglefs.fuse.mount import mount_entry
from shinglefs.meta import open_meta
from shinglefs.store.api import MAX_SLICE_SIZE

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def no_ambient_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No configuration file of the machine or the user leaks into a test."""
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.delenv(READ_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- which file --------------------------------------------------------------------------


def test_no_file_anywhere_gives_the_defaults(tmp_path: Path) -> None:
    if SYSTEM_CONFIG.exists():
        pytest.skip(f"{SYSTEM_CONFIG} exists on this machine")
    settings = load_settings()
    assert settings.path is None
    assert settings.format.chunk_size == 64 * MiB
    assert settings.store.gc_reserve_zones == 2 and settings.client.read_cache_bytes == 256 * MiB


def test_the_working_directory_file_is_not_read_implicitly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "shinglefs.toml", "[store]\ngc_free_zones = 9\n")
    monkeypatch.chdir(tmp_path)
    assert tmp_path / "shinglefs.toml" not in config_candidates()
    if not SYSTEM_CONFIG.exists():
        assert find_config(None) is None


def test_lookup_order_is_flag_then_environment_then_xdg(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = write(tmp_path / "xdg" / "shinglefs" / "shinglefs.toml", "[store]\ngc_free_zones = 3\n")
    env = write(tmp_path / "env.toml", "[store]\ngc_free_zones = 4\n")
    flag = write(tmp_path / "flag.toml", "[store]\ngc_free_zones = 5\n")
    assert find_config(None) == xdg
    assert load_settings().store.gc_free_zones == 3
    monkeypatch.setenv(CONFIG_ENV, str(env))
    assert load_settings().store.gc_free_zones == 4
    assert load_settings(flag).store.gc_free_zones == 5


def test_a_named_file_that_does_not_exist_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigFileError, match=r"no such file.*--config") as err:
        load_settings(tmp_path / "missing.toml")
    assert err.value.exit_code == 22
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "gone.toml"))
    with pytest.raises(ConfigFileError, match=r"no such file.*\$SHINGLEFS_CONFIG"):
        load_settings()


# -- keys and types ----------------------------------------------------------------------


def test_every_section_is_read_with_sizes_as_strings(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", """
[format]
name = "train"
chunk_size = "32M"
zone_size = 134217728
[store]
gc_free_zones = 8
linger_s = 0
checkpoint_interval_bytes = "1G"
[client]
read_cache_bytes = "1G"
compaction = false
[mount]
allow_other = false
options = ["noatime", "writeback_cache"]
log_file = "/var/log/shinglefs.log"
""")
    s = load_settings(path)
    assert (s.format.name, s.format.chunk_size, s.format.zone_size) == ("train", 32 * MiB, 128 * MiB)
    assert s.store.gc_free_zones == 8 and s.store.linger_s == 0.0
    assert isinstance(s.store.linger_s, float) and s.store.checkpoint_interval_bytes == 1024 * MiB
    assert s.client.read_cache_bytes == 1024 * MiB and s.client.compaction is False
    assert s.mount.options == ("noatime", "writeback_cache") and s.mount.allow_other is False


@pytest.mark.parametrize(("text", "key", "says"), [
    ("[store]\nlinger = 0.01\n", "store.linger", "did you mean 'linger_s'"),
    ("[client]\nread_cache = 5\n", "client.read_cache", "unknown key"),
    ("[storage]\ngc_free_zones = 3\n", "storage", "unknown section"),
    ("[store]\nlinger_s = \"fast\"\n", "store.linger_s", "expected a number"),
    ("[store]\ngc_background = 1\n", "store.gc_background", "expected true or false"),
    ("[store]\ngc_free_zones = true\n", "store.gc_free_zones", "expected an integer"),
    ("[client]\nio_threads = -1\n", "client.io_threads", "negative"),
    ("[client]\nread_cache_bytes = \"lots\"\n", "client.read_cache_bytes", "not a size"),
    ("[mount]\noptions = \"noatime\"\n", "mount.options", "a list of strings"),
    ("[format]\nchunk_size = \"128M\"\n", "format.chunk_size", "maximum slice size"),
    ("store = 3\n", "store", "expected a [store] table"),
])
def test_a_bad_key_is_a_typed_error_naming_it(tmp_path: Path, text: str, key: str,
                                              says: str) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigFileError) as err:
        load_settings(path)
    assert err.value.key == key
    assert f"{path}: {key}: " in str(err.value) and says in str(err.value) + str(err.value.hint)
    assert err.value.exit_code == 22 and err.value.hint


def test_a_file_that_is_not_toml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="not valid TOML"):
        load_settings(write(tmp_path / "c.toml", "[store\n"))


# -- precedence --------------------------------------------------------------------------


def test_a_flag_wins_over_the_file_and_the_file_over_the_default(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[client]\ntotal_buffer_bytes = \"512M\"\n"
                 "file_buffer_bytes = \"32M\"\n[mount]\noptions = [\"noatime\"]\n")
    s = load_settings(path, {"client": {"total_buffer_bytes": 64 * MiB, "read_cache_bytes": None},
                             "mount": {"options": None}})
    assert s.client.total_buffer_bytes == 64 * MiB  # the flag
    assert s.client.file_buffer_bytes == 32 * MiB  # the file
    assert s.mount.options == ("noatime",)  # a flag not given leaves the file's value
    assert s.client.small_file_bytes == 4 * MiB  # the default


def test_the_read_cache_variable_wins_over_the_file_not_over_the_flag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "c.toml", "[client]\nread_cache_bytes = \"1G\"\n")
    monkeypatch.setenv(READ_CACHE_ENV, "64")
    assert load_settings(path).client.read_cache_bytes == 64 * MiB
    flagged = load_settings(path, {"client": {"read_cache_bytes": 32 * MiB}})
    assert flagged.client.read_cache_bytes == 32 * MiB


def test_a_chunk_size_flag_above_the_maximum_slice_size_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="maximum slice size") as err:
        load_settings(None, {"format": {"chunk_size": MAX_SLICE_SIZE * 2}})
    assert err.value.exit_code == 2


# -- the real commands -------------------------------------------------------------------


def run(*args: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shinglefs_command(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})


def one_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("shinglefs: error:") and all(
        ln.startswith(("shinglefs: error:", "shinglefs: hint:")) for ln in lines), lines
    return lines[0]


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "mnt").mkdir()
    (tmp_path / "data").mkdir()
    try:
        yield tmp_path
    finally:
        if mount_entry(tmp_path / "mnt") is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "mnt")],
                           capture_output=True, check=False)


def chunk_size_of(url: str) -> int:
    meta = open_meta(url)
    try:
        return meta.format_info().chunk_size
    finally:
        meta.close()


def test_format_reads_the_file_and_a_flag_overrides_it(work: Path) -> None:
    config = write(work / "fs.toml", "[format]\nname = \"fromfile\"\nchunk_size = \"32M\"\n"
                   "[store]\ngc_reserve_zones = 3\n")
    url = f"sqlite3://{work / 'data' / 'a.db'}"
    result = run("format", url, "--drive", f"smr:{work / 'data' / 'a.img'}:2G",
                 "--config", str(config), cwd=work)
    assert result.returncode == 0, result.stderr
    assert "formatted fromfile" in result.stdout
    assert chunk_size_of(url) == 32 * MiB
    url_b = f"sqlite3://{work / 'data' / 'b.db'}"
    flagged = run("format", url_b, "--drive", f"smr:{work / 'data' / 'b.img'}:2G",
                  "--chunk-size", "16M", "--name", "fromflag", cwd=work,
                  env={CONFIG_ENV: str(config)})
    assert flagged.returncode == 0, flagged.stderr
    assert "formatted fromflag" in flagged.stdout and chunk_size_of(url_b) == 16 * MiB


def test_format_refuses_a_bad_key_or_a_chunk_above_the_slice_size_and_creates_nothing(
        work: Path) -> None:
    bad = write(work / "bad.toml", "[store]\ngc_reserve = 3\n")
    url = f"sqlite3://{work / 'data' / 'c.db'}"
    drive = f"smr:{work / 'data' / 'c.img'}:2G"
    line = one_error(run("format", url, "--drive", drive, "--config", str(bad), cwd=work), 22)
    assert "store.gc_reserve: unknown key" in line
    too_big = run("format", url, "--drive", drive, "--chunk-size", "128M", cwd=work)
    assert "maximum slice size" in one_error(too_big, 2)
    assert sorted(p.name for p in (work / "data").iterdir()) == []


@pytest.mark.fuse
def test_mount_serves_with_the_file_and_flags_over_it(work: Path) -> None:
    url = f"sqlite3://{work / 'data' / 'meta.db'}"
    assert run("format", url, "--drive", f"smr:{work / 'data' / 'd.img'}:4G",
               cwd=work).returncode == 0
    log_file = work / "logs" / "daemon.log"
    config = write(work / "mount.toml", f"""
[store]
gc_free_zones = 7
[client]
read_cache_bytes = "128M"
total_buffer_bytes = "128M"
[mount]
options = ["noatime"]
log_file = "{log_file}"
""")
    bad = write(work / "bad.toml", "[mount]\noptons = [\"noatime\"]\n")
    line = one_error(run("mount", url, str(work / "mnt"), "--config", str(bad), cwd=work), 22)
    assert "mount.optons: unknown key" in line and mount_entry(work / "mnt") is None
    result = run("mount", url, str(work / "mnt"), "--config", str(config),
                 "--write-buffer", "64M", cwd=work)
    assert result.returncode == 0, result.stderr
    try:
        assert log_file.exists()  # [mount] log_file
        (work / "mnt" / "f").write_bytes(b"configured")
        status = run("status", str(work / "mnt"), "--json", cwd=work)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["config_file"] == str(config)
        assert report["config"]["store"]["gc_free_zones"] == 7
        assert report["config"]["client"]["read_cache_bytes"] == 128 * MiB
        assert report["config"]["client"]["total_buffer_bytes"] == 64 * MiB  # the flag won
        with open("/proc/self/mountinfo") as info:
            line = next(ln for ln in info if f" {work / 'mnt'} " in ln)
        assert "noatime" in line.split()[5]
    finally:
        assert run("umount", str(work / "mnt"), cwd=work).returncode == 0
    assert (work / "data").exists() and mount_entry(work / "mnt") is None


@pytest.mark.fuse
def test_up_reads_the_file_and_a_bad_key_formats_nothing(work: Path) -> None:
    data = work / "updata"
    bad = write(work / "bad.toml", "[client]\nread_cache_bytes = true\n")
    line = one_error(run("up", str(data), str(work / "mnt"), "--config", str(bad), cwd=work), 22)
    assert "client.read_cache_bytes: expected an integer" in line
    assert not (data / "meta.db").exists() and mount_entry(work / "mnt") is None
    config = write(work / "up.toml", "[store]\ngc_free_zones = 6\n[client]\n"
                   "read_cache_bytes = \"64M\"\n[mount]\noptions = [\"noatime\"]\n")
    result = run("up", str(data), str(work / "mnt"), "--read-cache", "96M", cwd=work,
                 env={CONFIG_ENV: str(config)})
    assert result.returncode == 0, result.stderr
    try:
        report = json.loads(run("status", str(work / "mnt"), "--json", cwd=work).stdout)
        assert report["config_file"] == str(config)
        assert report["config"]["store"]["gc_free_zones"] == 6
        assert report["config"]["client"]["read_cache_bytes"] == 96 * MiB  # the flag won
        assert report["config"]["mount"]["options"] == ["noatime"]
    finally:
        assert run("umount", str(work / "mnt"), cwd=work).returncode == 0
