"""The ``policy``, ``drive`` and ``forget-server`` commands: a directory's policy
(replication goal, tier, retention), a storage server's drive states, and a
storage server taken out of the cluster for good, straight in the metadata
database (no drive opened, no mount needed).

``shinglefs policy URL PATH`` (or ``shinglefs policy DIR`` for a directory on
a ShingleFS mount of this host) shows a directory's own policy and the goal its
files get (inherited when it sets none); with ``--replicas``, ``--tier`` or
``--retention`` it changes those and keeps the rest. ``shinglefs drive
offline URL SERVER:DRIVE`` takes a drive out of placement and has the servers
drain it; ``drive online`` puts it back. ``shinglefs forget-server URL
SERVER`` removes a stopped server's replicas from every slice record, its
drive states and its registration (``MetaStore.forget_server``), after
counting what it alone holds: a verb of its own because ``server`` is the
command that runs one. Errors are typed (``FsError``: exit 1 with the
errno's message; a malformed argument: exit 2), printed by the boundary in
``cli.main``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import typer

from shinglefs.errors import ShingleError, UsageError

if TYPE_CHECKING:
    from shinglefs.meta.api import MetaStore
    from shinglefs.meta.backend import Tx

drive_app = typer.Typer(name="drive", help="A storage server's drive states (offline drains "
                        "it); replace a lost drive of a file system on this host.",
                        no_args_is_help=True)


@contextmanager
def opened_meta(meta_url: str) -> Iterator[MetaStore]:
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


def resolve_path(meta: MetaStore, path: str) -> int:
    """The inode of absolute ``path`` (ENOENT, ENOTDIR naming the path).

    Resolved name by name as the kernel does, not lexically: ``/c2/../c3``
    needs a directory ``/c2``, and ``..`` goes back up the names walked (no
    name is a symlink followed: a symlink is not a directory here)."""
    from shinglefs.meta.api import ROOT_INO
    from shinglefs.meta.errors import FsError

    if not path.startswith("/"):
        raise UsageError(f"{path!r} is not an absolute path inside the file system",
                         hint="e.g. /ckpt (the path as the mount shows it below its root)")
    walked: list[tuple[str, int, bool]] = []  # (name, inode, is a directory)
    for name in (p for p in path.split("/") if p):
        here = "/" + "/".join(n for n, _, _ in walked)
        if walked and not walked[-1][2]:
            raise FsError(errno.ENOTDIR, f"{path}: {here} is not a directory")
        if name == ".":
            continue
        if name == "..":
            if walked:
                walked.pop()
            continue
        try:
            attr = meta.lookup(walked[-1][1] if walked else ROOT_INO, os.fsencode(name))
        except FsError as exc:
            if exc.errno == errno.ENOENT:
                raise FsError(errno.ENOENT, f"{path}: no {name!r} in {here}") from None
            raise
        walked.append((name, attr.ino, attr.is_dir))
    if walked and not walked[-1][2] and path.rstrip("/") != path:
        raise FsError(errno.ENOTDIR, f"{path}: not a directory")
    return walked[-1][1] if walked else ROOT_INO


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


def _retention(text: str | None) -> str | None:
    """``--retention``: the rule in its canonical spelling, "" to clear, None
    when not given; ``UsageError`` (exit 2) for a rule that is not one."""
    if text is None or not text.strip():
        return text if text is None else ""
    from shinglefs.client.background.retention import RetentionRule

    return str(RetentionRule.parse(text))


POLICY_USAGE = ("shinglefs policy ./mnt/ckpt (a directory on a mount), or "
                "shinglefs policy META_URL /ckpt")


def path_on_mount(target: str, usage: str = POLICY_USAGE,
                  shown: str | None = None) -> tuple[str, str]:
    """(metadata URL, absolute path inside the file system) of ``target`` on a
    ShingleFS mount of this host (``policy ./mnt/ckpt``); ``usage`` is the
    hint when it is on none; ``shown``: how to name it in that message."""
    from shinglefs.cli.status import _status_of_mount
    from shinglefs.fuse.mount import FSTYPE, mount_entry

    real = top = os.path.realpath(target)
    while (entry := mount_entry(top)) is None and os.path.dirname(top) != top:
        top = os.path.dirname(top)
    if entry is None or entry["fstype"] != FSTYPE:
        named = repr(target) if shown is None else shown
        raise UsageError(f"{named} is neither a metadata URL nor on a ShingleFS mount",
                         hint=usage)
    inside = os.path.relpath(real, top)
    return str(_status_of_mount(top)["meta_url"]), "/" if inside == "." else "/" + inside


def walked(path: str) -> None:
    """The entry ``path`` (on this host) names exists, walked by the kernel as
    written: ``x/../d`` needs a directory ``x``, which ``os.path.realpath``
    (``path_on_mount``) does not check. Else FsError with its errno (ENOENT,
    ENOTDIR, EACCES) in the user's words."""
    from shinglefs.meta.errors import FsError

    try:
        os.lstat(path)
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise FsError(code, {errno.ENOENT: f"{path} does not exist",
                             errno.ENOTDIR: f"a part of {path} is not a directory"}.get(
                                 code, f"{path}: {os.strerror(code)}")) from None


def policy_command(
    meta_url: str = typer.Argument(
        ..., help="metadata URL of a formatted file system, or a directory on a mount"),
    path: str | None = typer.Argument(
        None, help="with a URL: a directory, as an absolute path in the file system"),
    replicas: str | None = typer.Option(
        None, "--replicas", metavar="N|inherit",
        help="replication goal of the files below (1..16 copies), or inherit the parent's"),
    tier: str | None = typer.Option(None, "--tier", help="tier policy (hot, cold)"),
    retention: str | None = typer.Option(
        None, "--retention", metavar="keep-last=N[,match=GLOB]",
        help="keep the N newest entries of this directory (matching GLOB), delete older ones; "
             "'' clears"),
    move: bool = typer.Option(
        False, "--move", help="also move the data already below to the tier (on a mount)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Show a directory's policy; with options, change those parts of it."""
    from shinglefs.meta.errors import FsError
    from shinglefs.meta.records import ROOT_INO

    goal = _goal(replicas)
    rule = _retention(retention)
    local = meta_url if path is None else None  # the directory on a mount, if given so
    if move and local is None:
        raise UsageError("--move works through a mount: the mount's daemon moves the data",
                         hint="shinglefs policy ./mnt/hot --tier hot --move")
    if path is None:
        where = meta_url
        meta_url, path = path_on_mount(where)
        walked(where)
    with opened_meta(meta_url) as meta:
        ino = resolve_path(meta, path)
        if not meta.getattr(ino).is_dir:
            raise FsError(errno.ENOTDIR, f"{local or path} is not a directory: a policy "
                                         "is set on the directory that holds the files")
        policy = meta.get_policy(ino)
        changed = policy
        if goal != "":
            assert not isinstance(goal, str)
            changed = replace(changed, replicas=goal)
        if tier is not None:
            changed = replace(changed, tier=tier or None)
        if rule is not None:
            if rule and ino == ROOT_INO:  # a typo away from deleting the corpus
                raise UsageError("retention on the root would delete all but the newest "
                                 "entries of the whole file system",
                                 hint="set it on the directory that holds the checkpoints, "
                                      "e.g. /ckpt")
            changed = replace(changed, retention=rule or None)
        if changed != policy:
            meta.set_policy(ino, changed)
            policy = meta.get_policy(ino)
        effective = meta.replica_goals([ino]).get(ino)
    out: dict[str, object] = {
        "path": path, "ino": ino, "replicas": policy.replicas, "tier": policy.tier,
        "retention": policy.retention, "effective_replicas": effective}
    moved = _move_to_tier(local) if move and local is not None else None
    if moved is not None:
        out["moved"] = moved
    if as_json:
        typer.echo(json.dumps(out))
        return
    own = "inherited" if policy.replicas is None else str(policy.replicas)
    got = ("the default (1 with one storage server, 2 with more)" if effective is None
           else str(effective))
    typer.echo(f"{path}: replicas {own} (files get {got}), tier {policy.tier or '-'}, "
               f"retention {policy.retention or '-'}")
    if moved is not None:
        typer.echo(f"moved to its tier: {moved['chunks']} chunks of {moved['files']} files "
                   f"({moved['skipped']} written meanwhile, left where they are)")
        if moved["no_room"]:
            typer.echo(f"not moved: {moved['no_room']} chunks; the drives of tier {policy.tier} "
                       "have no room for them (free space there, then run --move again)")


def _move_to_tier(local: str) -> dict[str, int]:
    """Ask the mount holding ``local`` to move the data below it to its tier
    (fuse/requests.py ``TIER_MOVE_XATTR``); returns the move's figures."""
    from shinglefs.fuse.requests import TIER_MOVE_XATTR
    from shinglefs.meta.errors import FsError

    try:
        os.setxattr(local, TIER_MOVE_XATTR, b"move")
        figures = json.loads(os.getxattr(local, TIER_MOVE_XATTR))
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise FsError(code, f"moving the data of {local}: {os.strerror(code)}") from exc
    except ValueError:  # a daemon that stored the request: it moves nothing
        with contextlib.suppress(OSError):
            os.removexattr(local, TIER_MOVE_XATTR)
        raise FsError(errno.ENOTSUP, f"the mount of {local} runs an older ShingleFS that "
                                     "cannot move data: unmount and mount it again") from None
    return {k: int(figures.get(k, 0)) for k in ("files", "chunks", "skipped", "no_room")}


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
    with opened_meta(meta_url) as meta:
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


LOST_SHOWN = 5
"""Slices that would be lost named (with their files) by ``forget-server``."""


class SlicesWouldBeLost(ShingleError):
    """``forget-server`` without ``--force`` of a server holding the only present
    copy of committed slices: nothing was changed."""

    errno = errno.EBUSY
    exit_code = 1


@dataclass
class Holdings:
    """What the slice records name on one server, before it is forgotten: by the
    record's state, and the committed slices with no replica on another present
    server (lost once it is forgotten; the first ``LOST_SHOWN`` by id and file)."""

    server: int
    registered: bool
    slices: int = 0
    committed: int = 0
    queued: int = 0
    writing: int = 0
    lost: int = 0
    lost_slices: list[int] = field(default_factory=list)
    lost_files: list[str] = field(default_factory=list)


def _holdings(meta: MetaStore, server_id: int, registered: bool) -> Holdings:
    """Page through the records naming ``server_id`` (``server_slices``): bounded
    memory, one read a page. Present as the repair pass counts it: running and
    heartbeated within the servers' default ``--repair-after``."""
    from shinglefs.meta.api import REPAIR_AFTER_S, SliceState

    present = {str(s.id) for s in meta.list_servers(REPAIR_AFTER_S)
               if s.live and s.id != server_id}
    out = Holdings(server_id, registered)
    page = meta.server_slices(server_id)  # from the first id, as forget_server pages
    while page:
        for info in page:
            out.slices += 1
            if info.state == SliceState.TO_DELETE:
                out.queued += 1
            elif info.state == SliceState.WRITING:
                out.writing += 1
            else:
                out.committed += 1
                if not any(r.server in present for r in info.replicas):
                    out.lost += 1
                    if len(out.lost_slices) < LOST_SHOWN:
                        out.lost_slices.append(info.id)
        page = meta.server_slices(server_id, page[-1].id)
    out.lost_files = _files_of(meta, out.lost_slices)
    return out


def _files_of(meta: MetaStore, slice_ids: list[int]) -> list[str]:
    """The paths of the files referencing ``slice_ids`` (a few): one read, a scan
    of the chunk map (no index by slice), then each inode's path."""
    if not slice_ids:
        return []
    from shinglefs.meta.check import path_of
    from shinglefs.meta.dump import backend_of

    marks = ", ".join("?" * len(slice_ids))

    def txn(tx: Tx) -> list[str]:
        inos = [r[0] for r in tx.all(
            f"SELECT DISTINCT ino FROM chunk_refs WHERE slice_id IN ({marks})", slice_ids)]
        return sorted(path_of(tx, ino) for ino in inos)

    files: list[str] = backend_of(meta).run(txn, "read")
    return files


def _server_ref(text: str) -> int:
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise UsageError(f"{text!r} is not a storage server id",
                     hint="ids as `shinglefs status URL --servers` lists them, e.g. 3")


def _named(held: Holdings) -> str:
    what = ", ".join(held.lost_files) or ", ".join(f"{s:#x}" for s in held.lost_slices)
    more = held.lost - len(held.lost_slices)
    return (f"{'files' if held.lost_files else 'slices'} {what}"
            + (f" (and the files of {more} more slice(s))" if more > 0 else ""))


def forget_server_command(
    meta_url: str = typer.Argument(..., help="metadata URL of a formatted file system"),
    server: str = typer.Argument(..., metavar="SERVER", help="the server id"),
    force: bool = typer.Option(False, "--force",
                               help="forget it even if slices have no other present copy "
                                    "(their bytes are lost)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Take a stopped storage server out of the cluster for good (its records)."""
    from shinglefs.meta.errors import FsError

    server_id = _server_ref(server)
    with opened_meta(meta_url) as meta:
        record = next((s for s in meta.list_servers() if s.id == server_id), None)
        if record is not None and record.live:
            raise FsError(errno.EBUSY, f"storage server {server_id} ({record.address}) is up",
                          hint="stop its `shinglefs server` process first (SIGTERM), "
                               "then run this again")
        # Not registered: forgotten before (what still names it is no present
        # copy to anyone), or never (ENOENT from forget_server, before any scan).
        held = (_holdings(meta, server_id, True) if record is not None
                else Holdings(server_id, registered=False))
        if held.lost and not force:
            raise SlicesWouldBeLost(
                f"{held.lost} committed slice(s) have no copy on another present server "
                f"and would be lost with server {server_id}: {_named(held)} (--force: forget "
                "it all the same)",
                hint=f"start server {server_id} again, wait until `shinglefs status URL "
                     "--servers` shows nothing under its goal, then run this again")
        changed = meta.forget_server(server_id)
    if as_json:
        typer.echo(json.dumps({**asdict(held), "forgotten": True, "records_changed": changed}))
        return
    if not held.registered:
        typer.echo(f"server {server_id} was forgotten already; {changed} slice record(s) "
                   "named it still, now none")
        return
    typer.echo(f"server {server_id} forgotten: {changed} slice record(s) no longer name it "
               f"({held.committed} committed, {held.queued} queued for deletion, "
               f"{held.writing} being written); the servers copy what is under its goal "
               "(`shinglefs status URL --servers` shows what is left)")
    if held.lost:
        typer.echo(f"lost: {held.lost} slice(s) had no other copy; reads of their bytes fail "
                   f"(EIO): {_named(held)}")


def register(app: typer.Typer) -> None:
    app.command("policy")(policy_command)
    app.add_typer(drive_app)
    app.command("forget-server")(forget_server_command)
