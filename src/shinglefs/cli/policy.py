"""The ``policy`` and ``drive`` commands: a directory's policy (replication goal,
tier, retention) and a storage server's drive states, straight in the
metadata database (no drive opened, no mount needed).

``shinglefs policy URL PATH`` shows a directory's own policy and the goal its
files get (inherited when it sets none); with ``--replicas``, ``--tier`` or
``--retention`` it changes those and keeps the rest. ``shinglefs drive
offline URL SERVER:DRIVE`` takes a drive out of placement and has the servers
drain it; ``drive online`` puts it back. Errors are typed (``FsError``: exit
1 with the errno's message; a malformed argument: exit 2), printed by the
boundary in ``cli.main``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import typer

from shinglefs.errors import UsageError

if TYPE_CHECKING:
    from shinglefs.meta.api import MetaStore

drive_app = typer.Typer(name="drive", help="A storage server's drive states (offline drains it).",
                        no_args_is_help=True)


@contextmanager
def _meta(meta_url: str) -> Iterator[MetaStore]:
    from shinglefs.client.filesystem import absolute_meta_url, require_metadata_file
    from shinglefs.meta import open_meta

    meta_url = absolute_meta_url(meta_url)
    require_metadata_file(meta_url)
    meta = open_meta(meta_url)
    try:
        meta.format_info()  # NotFormatted on an empty database
        yield meta
    finally:
        meta.close()


def _resolve(meta: MetaStore, path: str) -> int:
    """The inode of absolute ``path`` (ENOENT, ENOTDIR from meta)."""
    from shinglefs.meta.api import ROOT_INO

    if not path.startswith("/"):
        raise UsageError(f"{path!r} is not an absolute path inside the file system",
                         hint="e.g. /ckpt (the path as the mount shows it below its root)")
    ino = ROOT_INO
    for name in (p for p in path.split("/") if p):
        ino = meta.lookup(ino, name.encode()).ino
    return ino


def _goal(text: str | None) -> int | str | None:
    """``--replicas``: a count, ``inherit`` (None), or not given ("")."""
    if text is None:
        return ""
    if text == "inherit":
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--replicas {text!r} is neither a number of copies nor 'inherit'",
                         hint="e.g. --replicas 3, or --replicas inherit") from None


def policy_command(
    meta_url: str = typer.Argument(..., help="metadata URL of a formatted file system"),
    path: str = typer.Argument(..., help="a directory, as an absolute path in the file system"),
    replicas: str | None = typer.Option(
        None, "--replicas", metavar="N|inherit",
        help="replication goal of the files below (1..16 copies), or inherit the parent's"),
    tier: str | None = typer.Option(None, "--tier", help="tier policy (hot, cold)"),
    retention: str | None = typer.Option(None, "--retention", help="retention policy"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Show a directory's policy; with options, change those parts of it."""
    goal = _goal(replicas)
    with _meta(meta_url) as meta:
        ino = _resolve(meta, path)
        policy = meta.get_policy(ino)
        changed = policy
        if goal != "":
            assert not isinstance(goal, str)
            changed = replace(changed, replicas=goal)
        if tier is not None:
            changed = replace(changed, tier=tier or None)
        if retention is not None:
            changed = replace(changed, retention=retention or None)
        if changed != policy:
            meta.set_policy(ino, changed)
            policy = meta.get_policy(ino)
        effective = meta.replica_goals([ino]).get(ino)
    out = {"path": path, "ino": ino, "replicas": policy.replicas, "tier": policy.tier,
           "retention": policy.retention, "effective_replicas": effective}
    if as_json:
        typer.echo(json.dumps(out))
        return
    own = "inherited" if policy.replicas is None else str(policy.replicas)
    got = ("the default (1 with one storage server, 2 with more)" if effective is None
           else str(effective))
    typer.echo(f"{path}: replicas {own} (files get {got}), tier {policy.tier or '-'}, "
               f"retention {policy.retention or '-'}")


def _drive_ref(text: str) -> tuple[int, int]:
    server, sep, drive = text.partition(":")
    try:
        if sep:
            return int(server), int(drive)
    except ValueError:
        pass
    raise UsageError(f"{text!r} is not SERVER:DRIVE",
                     hint="ids as `shinglefs status URL --servers --json` lists them, e.g. 2:0")


def _set_state(meta_url: str, ref: str, state: str | None) -> None:
    server, drive = _drive_ref(ref)
    with _meta(meta_url) as meta:
        meta.set_drive_state(server, drive, state)
    typer.echo(f"drive {drive} of server {server}: "
               + ("offline; the servers copy its slices to other drives (`shinglefs status "
                  "URL --servers` shows what is left)" if state else "online"))


@drive_app.command("offline")
def drive_offline(
    meta_url: str = typer.Argument(..., help="metadata URL of a formatted file system"),
    ref: str = typer.Argument(..., metavar="SERVER:DRIVE", help="server id and drive id"),
) -> None:
    """Take a drive out of placement now and have the servers drain it."""
    _set_state(meta_url, ref, "offline")


@drive_app.command("online")
def drive_online(
    meta_url: str = typer.Argument(..., help="metadata URL of a formatted file system"),
    ref: str = typer.Argument(..., metavar="SERVER:DRIVE", help="server id and drive id"),
) -> None:
    """Put an offline drive back into placement (what was drained stays moved)."""
    _set_state(meta_url, ref, None)


def register(app: typer.Typer) -> None:
    app.command("policy")(policy_command)
    app.add_typer(drive_app)
