"""The configuration file, ``shinglefs.toml``: what ``format``, ``mount`` and
``up`` read besides their flags (keys and an example: docs/configuration.md).

Which file: ``--config PATH``, else ``$SHINGLEFS_CONFIG``, else the first
that exists of ``$XDG_CONFIG_HOME/shinglefs/shinglefs.toml`` (default
``~/.config/...``) and ``/etc/shinglefs/shinglefs.toml``; with none, the
defaults. A file named by the flag or the variable must exist. A
``shinglefs.toml`` in the working directory is never read unless named: what
a command does must not depend on where it is run from.

Sections: ``[format]`` (``FormatSettings``), ``[store]`` (``StoreConfig``,
every field), ``[client]`` (``ClientConfig``, every field), ``[mount]``
(``MountSettings``). Byte counts (keys ending in ``_bytes`` or ``_size``)
are an integer or a size string (``"512M"``, ``"4G"``).

Contract: an unknown section or key, a value of the wrong type or a negative
number is a ``ConfigFileError`` naming ``section.key`` (exit 22) before
anything is opened or started; nothing in the file is ever silently ignored.
Precedence, highest first: a flag, an environment variable
(``SHINGLEFS_READ_CACHE_MIB`` for ``client.read_cache_bytes``), the file, the
default. Environment variables are read when a command runs, never at import.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from shinglefs.cli.errors import ConfigFileError
from shinglefs.client.config import READ_CACHE_ENV, ClientConfig
from shinglefs.errors import UsageError
from shinglefs.meta.api import CHUNK_SIZE
from shinglefs.store.api import MAX_SLICE_SIZE
from shinglefs.store.config import StoreConfig
from shinglefs.zoned.drivespec import DriveSpecError, parse_size

CONFIG_ENV = "SHINGLEFS_CONFIG"
CONFIG_NAME = "shinglefs.toml"
SYSTEM_CONFIG = Path("/etc/shinglefs") / CONFIG_NAME
MiB = 1024 * 1024


def check_chunk_size(chunk_size: int) -> int:
    """``chunk_size`` if a format may use it; UsageError otherwise (a slice never
    crosses a chunk, and one slice must be able to fill a chunk)."""
    if chunk_size <= 0 or chunk_size > MAX_SLICE_SIZE:
        raise UsageError(
            f"chunk size {chunk_size} is not between 1 and the maximum slice size "
            f"{MAX_SLICE_SIZE} ({MAX_SLICE_SIZE // MiB} MiB)",
            hint=f"use at most {MAX_SLICE_SIZE // MiB}M (the default is {CHUNK_SIZE // MiB}M)")
    return chunk_size


@dataclass(frozen=True, slots=True)
class FormatSettings:
    """``[format]``: what ``format`` records once (``up`` picks its own)."""

    name: str = "shinglefs"
    chunk_size: int = CHUNK_SIZE  # file-offset unit of the chunk map, <= MAX_SLICE_SIZE
    zone_size: int | None = None  # zones of emulated drives created here (default 256 MiB)

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)


@dataclass(frozen=True, slots=True)
class MountSettings:
    """``[mount]``: how ``mount`` and ``up`` serve the file system."""

    allow_other: bool | None = None  # None: yes when mounting as root
    options: tuple[str, ...] = ()  # -o options (docs/cli.md), checked before mounting
    log_file: str | None = None  # the background daemon's log


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a command reads from the file and its flags, merged."""

    path: Path | None  # the file read; None when there was none
    format: FormatSettings = field(default_factory=FormatSettings)
    store: StoreConfig = field(default_factory=StoreConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    mount: MountSettings = field(default_factory=MountSettings)

    def report(self) -> dict[str, Any]:
        """The file read and the settings in force, for ``shinglefs status``."""
        return {"config_file": str(self.path) if self.path is not None else None,
                "config": {"store": asdict(self.store), "client": asdict(self.client),
                           "mount": asdict(self.mount)}}


# Checks of single keys beyond their type (the dataclass repeats them for flags).
KEY_CHECKS: dict[str, Callable[[Any], object]] = {"format.chunk_size": check_chunk_size}

SECTIONS: dict[str, type] = {
    "format": FormatSettings,
    "store": StoreConfig,
    "client": ClientConfig,
    "mount": MountSettings,
}


# -- which file -------------------------------------------------------------------------


def config_candidates() -> list[Path]:
    """The files looked for, in order, when neither --config nor $SHINGLEFS_CONFIG names one."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return [Path(xdg) / "shinglefs" / CONFIG_NAME, SYSTEM_CONFIG]


def find_config(explicit: Path | None) -> Path | None:
    """The configuration file a command reads (module docstring), or None.

    Raises ConfigFileError when the file named by ``explicit`` or by
    ``$SHINGLEFS_CONFIG`` does not exist."""
    named = explicit if explicit is not None else os.environ.get(CONFIG_ENV) or None
    if named is not None:
        path = Path(os.path.abspath(os.path.expanduser(named)))
        if not path.is_file():
            source = "--config" if explicit is not None else f"${CONFIG_ENV}"
            raise ConfigFileError(str(path), f"no such file (named by {source})",
                                  hint="pass the path of a shinglefs.toml, "
                                  "or leave it out to use the defaults")
        return path
    return next((p for p in config_candidates() if p.is_file()), None)


def read_config(path: Path) -> dict[str, Any]:
    """The parsed TOML of ``path``; ConfigFileError when unreadable or not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigFileError(str(path), f"cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(str(path), f"not valid TOML: {exc}") from None


# -- checking and merging ---------------------------------------------------------------


def _allowed_types(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(hint) if a is not type(None))
    return (hint,)


def _describe(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    parts = []
    for t in _allowed_types(hint):
        if typing.get_origin(t) is tuple:
            parts.append("a list of strings")
        else:
            parts.append(names.get(t, str(t)))
    return " or ".join(parts)


def _is_size_key(key: str) -> bool:
    return key.endswith(("_bytes", "_size"))


def _coerce_one(key: str, value: Any, allowed: Any) -> tuple[bool, Any]:
    """(matched, value) for one allowed type."""
    if allowed is bool:
        return isinstance(value, bool), value
    if isinstance(value, bool):
        return False, value
    if allowed is int:
        if isinstance(value, int):
            return True, value
        if isinstance(value, str) and _is_size_key(key):
            return True, parse_size(value)
        return False, value
    if allowed is float:
        return isinstance(value, int | float), float(value) if isinstance(value, int | float) else value
    if allowed is str:
        return isinstance(value, str), value
    if typing.get_origin(allowed) is tuple:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return ok, tuple(value) if ok else value
    return False, value


def _coerce(path: str, section: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type; ConfigFileError naming ``section.key`` otherwise."""
    name = f"{section}.{key}"
    for allowed in _allowed_types(hint):
        try:
            matched, coerced = _coerce_one(key, value, allowed)
        except DriveSpecError as exc:
            raise ConfigFileError(path, str(exc), key=name,
                                  hint="write a byte count: 4194304, \"512M\", \"4G\"") from None
        if matched:
            if isinstance(coerced, int | float) and not isinstance(coerced, bool) and coerced < 0:
                raise ConfigFileError(path, f"{value!r} is negative", key=name)
            return coerced
    raise ConfigFileError(path, f"expected {_describe(hint)}, got {type(value).__name__} {value!r}",
                          key=name)


def _unknown(path: str, name: str, known: list[str], what: str) -> ConfigFileError:
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1], known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigFileError(path, f"unknown {what}", key=name,
                           hint=f"{hint}{what}s here: {', '.join(known)} (docs/configuration.md)")


def check_section(path: str, section: str, cls: type[Any], values: Any) -> dict[str, Any]:
    """The keys of one ``[section]`` checked against ``cls``'s fields and typed."""
    if not isinstance(values, dict):
        raise ConfigFileError(path, f"expected a [{section}] table, got {values!r}", key=section)
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise _unknown(path, f"{section}.{key}", known, "key")
        checked[key] = _coerce(path, section, key, value, hints[key])
        check = KEY_CHECKS.get(f"{section}.{key}")
        if check is not None:
            try:
                check(checked[key])
            except UsageError as exc:
                raise ConfigFileError(path, str(exc), key=f"{section}.{key}",
                                      hint=exc.hint) from None
    return checked


def check_config(path: str, data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every section of a parsed file, checked (see ``check_section``)."""
    checked: dict[str, dict[str, Any]] = {}
    for section, values in data.items():
        if section not in SECTIONS:
            raise _unknown(path, section, list(SECTIONS), "section")
        checked[section] = check_section(path, section, SECTIONS[section], values)
    return checked


def load_settings(config: Path | None = None,
                  flags: Mapping[str, Mapping[str, Any]] | None = None) -> Settings:
    """The settings of a command: the file (``find_config(config)``) under ``flags``.

    ``flags`` maps a section to the values given on the command line (None
    values are left out: not given). Raises ConfigFileError for the file,
    UsageError for a flag value a section refuses.
    """
    path = find_config(config)
    merged = check_config(str(path), read_config(path)) if path is not None else {}
    for section, given in (flags or {}).items():
        merged.setdefault(section, {}).update({k: v for k, v in given.items() if v is not None})
    client_values = merged.get("client", {})
    given_client = (flags or {}).get("client", {})
    if os.environ.get(READ_CACHE_ENV, "").strip() and given_client.get("read_cache_bytes") is None:
        # The environment variable outranks the file (ClientConfig reads it).
        client_values.pop("read_cache_bytes", None)
    return Settings(
        path=path,
        format=FormatSettings(**merged.get("format", {})),
        store=StoreConfig(**merged.get("store", {})),
        client=ClientConfig(**client_values),
        mount=MountSettings(**merged.get("mount", {})),
    )


def size_flag(flag: str, text: str | None) -> int | None:
    """A size flag's value (``"512M"``) in bytes; UsageError naming the flag."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except DriveSpecError as exc:
        raise UsageError(f"{flag} {text!r} is not a size", hint=exc.hint) from None
