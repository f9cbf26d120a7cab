"""The ``status`` command: capacity, drives, zones by condition and write
amplification, of a running mount (asked through its virtual status xattr) or
of an unmounted file system (opened by its metadata URL), and the storage
servers registered in its metadata (up, down or stopped; last heartbeat;
address, labels, free and capacity bytes) with, for the live ones, each
drive's write-scheduler figures asked of the server itself (``drive_writes``:
bytes written, runs and mean run length, group and zone switches, queue
depth: meta's server record has only capacity and free bytes).

``collect_status`` is also what a mount serves in that xattr (``cli.filesystem``
passes it to the mount). ``status`` acts only on ShingleFS mounts (exit 17 for
another file system's mount point) and never creates a metadata file.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer

from shinglefs.cli.errors import NotShingleMountError
from shinglefs.errors import UsageError
from shinglefs.fuse.errors import MountFailedError, NotMountedError
from shinglefs.fuse.mount import FSTYPE, mount_entry, mounts_of_type

if TYPE_CHECKING:
    from shinglefs.client.vfs import VFS
    from shinglefs.meta.api import MetaStore
    from shinglefs.server.node import DriveStats

WRITES_TIMEOUT_S = 5.0  # a live server that does not answer STATS within this is skipped


def drive_writes(drive: DriveStats) -> dict[str, int]:
    """A drive's write-scheduler figures (``WriteFigures``) as status shows them."""
    w = drive.writes
    return {"drive": drive.drive_id, "bytes_written": w.bytes_written, "runs": w.runs,
            "mean_run_bytes": w.mean_run_bytes, "group_switches": w.group_switches,
            "zone_switches": w.zone_switches, "bytes_per_zone_switch": w.bytes_per_zone_switch,
            "queued_pieces": w.queued_pieces, "queued_bytes": w.queued_bytes}


def add_server_writes(meta: MetaStore, servers: list[dict[str, Any]]) -> None:
    """Ask each live server in ``servers`` (``server_status``'s) for its drives'
    write figures: ``drive_writes`` (a list, ``drive_writes``'s dicts), or
    ``drive_writes_error`` when it did not answer within ``WRITES_TIMEOUT_S``."""
    from shinglefs.errors import ShingleError
    from shinglefs.server.process import cluster_key
    from shinglefs.server.remote import RemoteNode

    live = [s for s in servers if s["state"] == "up"]
    if not live:
        return
    key = cluster_key(meta)
    for server in live:
        try:
            with RemoteNode(server["address"], key, connections=1, timeout=WRITES_TIMEOUT_S,
                            connect_timeout=WRITES_TIMEOUT_S) as remote:
                server["drive_writes"] = [drive_writes(d) for d in remote.stats().drives]
        except (ShingleError, OSError) as exc:
            server["drive_writes_error"] = str(exc)


def server_status(meta: MetaStore, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """The storage servers registered in ``meta``: ``state`` is ``up`` (live),
    ``down`` (no heartbeat within ``timeout_s``, default ``SERVER_TIMEOUT_S``)
    or ``stopped`` (unregistered cleanly); free and capacity bytes as of the
    last heartbeat, in total and per tier."""
    import time

    from shinglefs.meta.api import SERVER_TIMEOUT_S

    now = time.time_ns()
    states = meta.drive_states()
    out = []
    for server in meta.list_servers(SERVER_TIMEOUT_S if timeout_s is None else timeout_s):
        tiers = server.tiers()
        state = "up" if server.live else "stopped" if server.stopped_ns else "down"
        out.append({
            "id": server.id,
            "address": server.address,
            "state": state,
            "heartbeat_age_s": round(max(0, now - server.heartbeat_ns) / 1e9, 1),
            "labels": server.labels,
            "drives": len(server.drives),
            "offline_drives": sorted(d.drive_id for d in server.drives
                                     if states.get((server.id, d.drive_id)) == "offline"),
            "capacity_bytes": sum(cap for cap, _ in tiers.values()),
            "free_bytes": sum(free for _, free in tiers.values()),
            "tiers": {t: {"capacity_bytes": c, "free_bytes": f} for t, (c, f) in tiers.items()},
        })
    return out


def collect_status(vfs: VFS, *, meta_url: str | None = None,
                   server_timeout_s: float | None = None) -> dict[str, Any]:
    """Capacity, drives, zones by condition and write amplification of an open
    file system, and its storage servers (``server_status``)."""
    from shinglefs.meta.api import ROOT_CTX
    from shinglefs.server.cluster import ClusterNode

    statfs = vfs.statfs(ROOT_CTX)
    unasked: dict[int, str] = {}
    if isinstance(vfs.node, ClusterNode):  # the drives are storage servers': ask them
        node, unasked = vfs.node.stats_asked(WRITES_TIMEOUT_S)
    else:
        node = vfs.node.stats()
    user = node.user_bytes_written
    drives: list[dict[str, Any]] = []
    for drive in node.drives:
        store = drive.store
        drives.append({
            "id": drive.drive_id,
            "spec": drive.spec,
            "capacity_bytes": drive.capacity_bytes,
            "free_bytes": drive.free_bytes,
            "live_bytes": store.live_bytes,
            "slices": store.slices,
            "write_amplification": round(store.write_amplification, 4),
            "gc_bytes_copied": store.gc_bytes_copied,
            "zone_resets": store.zone_resets,
            "zones": dict(store.zones_by_condition),
            "writes": drive_writes(drive),
        })
    zones: dict[str, int] = {}
    for one in node.drives:
        for condition, count in one.store.zones_by_condition.items():
            zones[condition] = zones.get(condition, 0) + count
    return {
        "meta_url": meta_url,
        "capacity_bytes": statfs.capacity_bytes,
        "used_bytes": statfs.used_bytes,
        "free_bytes": statfs.free_bytes,
        "inodes": statfs.inodes,
        "live_bytes": node.live_bytes,
        "user_bytes_written": user,
        "device_bytes_written": node.device_bytes_written,
        "write_amplification": round(node.device_bytes_written / user, 4) if user else 1.0,
        "zones": zones,
        "drives": drives,
        "servers": server_status(vfs.meta, server_timeout_s),
        "metadata_backup": vfs.meta_backup.newest(),
        # Live servers that did not answer STATS: their drives show only the
        # capacity and free bytes of their last heartbeat.
        "drives_not_asked": {str(k): v for k, v in unasked.items()},
    }


def _backup_line(backup: dict[str, int] | None) -> str:
    """The newest metadata backup on the drives, for ``load --from-drives``."""
    if backup is None:
        return "none: the drives are storage servers' (keep `shinglefs dump`s)"
    if not backup["number"]:
        return "none on the drives yet (one 30 s after opening, then every 10 min)"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(backup["created_ns"] / 1e9))
    return (f"number {backup['number']} of {when}, {human(backup['bytes'])}, "
            f"on {backup['drives']} drive(s)")


def require_shingle_mount(mountpoint: str) -> None:
    """NotMountedError / NotShingleMountError unless a ShingleFS mount is at ``mountpoint``."""
    entry = mount_entry(mountpoint)
    if entry is None:
        raise NotMountedError(mountpoint)
    if entry["fstype"] != FSTYPE:
        raise NotShingleMountError(mountpoint, entry["fstype"])


def _status_of_mount(mountpoint: str) -> dict[str, Any]:
    from shinglefs.fuse.operations import STATUS_XATTR

    require_shingle_mount(mountpoint)
    try:
        raw = os.getxattr(mountpoint, STATUS_XATTR.decode())
    except PermissionError as exc:
        raise MountFailedError(
            f"the mount at {mountpoint} (or a directory above it) is not open to uid "
            f"{os.geteuid()}: {exc.strerror}",
            hint="run `shinglefs status` as the mount's owner or root") from exc
    except OSError as exc:
        raise MountFailedError(f"the mount at {mountpoint} does not answer: {exc.strerror}",
                               hint=f"if its daemon died, `shinglefs umount --force {mountpoint}`"
                               ) from exc
    return dict(json.loads(raw))


MOUNT_ANSWER_S = 10.0
"""How long ``status`` waits for a mount's answer (``--mount-timeout``)."""


def _statuses_within(mountpoints: list[str], timeout_s: float
                     ) -> tuple[dict[str, Any], dict[str, Exception]]:
    """The status of each mount, asked of all at once, and the mounts that did
    not give one within ``timeout_s``: a daemon stopped (SIGSTOP, a debugger)
    or waiting for its metadata (PostgreSQL down: 30 s a request) held
    ``status`` for as long, every other mount's status with it. A mount that
    does not answer in time is left to its thread (a daemon thread, gone
    when the command exits)."""
    answers: dict[str, Any] = {}
    failed: dict[str, Exception] = {}

    def ask(mp: str) -> None:
        try:
            answers[mp] = _status_of_mount(mp)
        except Exception as exc:  # the caller raises or reports it
            failed[mp] = exc

    threads = {mp: threading.Thread(target=ask, args=(mp,), daemon=True,
                                    name=f"status {mp}") for mp in mountpoints}
    deadline = time.monotonic() + timeout_s
    for t in threads.values():
        t.start()
    late: dict[str, Exception] = {}
    for mp, t in threads.items():
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():  # what it writes later is never read
            late[mp] = MountFailedError(
                f"the mount at {mp} does not answer within {timeout_s:g} s",
                hint=f"its daemon may be stopped or waiting for its metadata database; "
                     f"if it died, `shinglefs umount --force {mp}`")
    results = {mp: answers[mp] for mp in mountpoints if mp in answers and mp not in late}
    errors = {mp: late.get(mp) or failed[mp] for mp in mountpoints if mp in late or mp in failed}
    return results, errors


def _status_of_every_mount(timeout_s: float = MOUNT_ANSWER_S
                           ) -> tuple[dict[str, Any], dict[str, MountFailedError]]:
    """Every ShingleFS mount's status, and the mounts that did not give one
    (another user's, out of reach, a dead one, or one that does not answer
    within ``timeout_s``): one such mount does not hide the others.
    NotMountedError when there is no mount; the first failure when no mount
    answered."""
    results, errors = _statuses_within(mounts_of_type(FSTYPE), timeout_s)
    failed = {mp: exc if isinstance(exc, MountFailedError)
              else MountFailedError(f"the mount at {mp} gave no status: {exc}")
              for mp, exc in errors.items()}
    if not results and not failed:
        raise NotMountedError("(no ShingleFS mount)")
    if not results:
        raise next(iter(failed.values()))
    return results, failed


def _status_of_url(meta_url: str, server_timeout_s: float | None) -> dict[str, Any]:
    from shinglefs.client.filesystem import absolute_meta_url, open_filesystem

    meta_url = absolute_meta_url(meta_url)
    vfs = open_filesystem(meta_url, join=True)
    vfs.meta_backup.interval_s = 0  # a look changes nothing: no backup at its close
    try:
        return collect_status(vfs, meta_url=meta_url, server_timeout_s=server_timeout_s)
    finally:
        vfs.shutdown()


def _show_servers_of_url(meta_url: str, timeout_s: float | None, as_json: bool) -> None:
    """``status URL --servers``: the servers registered in the metadata, no drive opened."""
    from rich.console import Console

    from shinglefs.client.filesystem import absolute_meta_url, require_metadata_file
    from shinglefs.meta import open_meta

    meta_url = absolute_meta_url(meta_url)
    require_metadata_file(meta_url)
    meta = open_meta(meta_url)
    try:
        meta.format_info()  # NotFormatted on an empty database
        servers = server_status(meta, timeout_s)
        add_server_writes(meta, servers)
        health = None
        if servers:
            from shinglefs.server.repair import replication_health

            health = asdict(replication_health(meta))
    finally:
        meta.close()
    if as_json:
        typer.echo(json.dumps({"meta_url": meta_url, "servers": servers,
                               "replication": health}))
    elif servers:
        _print_servers(servers, Console())
        assert health is not None
        typer.echo(f"replication: {health['slices']} slices stored (default goal "
                   f"{health['goal']} replica(s), else their directory's): "
                   f"{health['under_replicated']} under their goal, "
                   f"{health['lost']} with no replica on a present server, "
                   f"{health['draining']} still on an offline drive")
    else:
        typer.echo(f"no storage server is registered in {meta_url}")


def human(n: float) -> str:
    """``n`` bytes for a person: ``3 B``, ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print_status(status: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(title=title, show_header=False)
    summary.add_column("field")
    summary.add_column("value")
    for key in ("mountpoint", "meta_url", "pid", "config_file"):
        if status.get(key) is not None:
            summary.add_row(key, str(status[key]))
    summary.add_row("capacity", human(status["capacity_bytes"]))
    summary.add_row("used (files)", human(status["used_bytes"]))
    summary.add_row("free", human(status["free_bytes"]))
    summary.add_row("live slice bytes", human(status["live_bytes"]))
    summary.add_row("inodes", str(status["inodes"]))
    summary.add_row("write amplification", f"{status['write_amplification']:.3f}")
    summary.add_row("zones", ", ".join(f"{k} {v}" for k, v in sorted(status["zones"].items())))
    summary.add_row("metadata backup", _backup_line(status.get("metadata_backup")))
    console.print(summary)
    drives = Table(title="drives")
    for column in ("id", "spec", "capacity", "free", "live", "WA", "zones by condition",
                   "writes"):
        drives.add_column(column)
    for drive in status["drives"]:
        writes = drive.get("writes")
        drives.add_row(
            str(drive["id"]), drive["spec"], human(drive["capacity_bytes"]),
            human(drive["free_bytes"]), human(drive["live_bytes"]),
            f"{drive['write_amplification']:.3f}",
            ", ".join(f"{k} {v}" for k, v in sorted(drive["zones"].items())),
            _writes_line(writes) if writes and writes["runs"] else "",
        )
    console.print(drives)
    if status.get("servers"):
        _print_servers(status["servers"], console)


def _print_servers(servers: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(title="storage servers")
    table.add_column("id")
    table.add_column("address", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("heartbeat")
    table.add_column("labels", min_width=10, overflow="fold")
    table.add_column("free / capacity")
    table.add_column("writes per drive", overflow="fold")
    for server in servers:
        space = [f"{tier} {human(t['free_bytes'])} / {human(t['capacity_bytes'])}"
                 for tier, t in sorted(server["tiers"].items())]
        table.add_row(
            str(server["id"]), server["address"],
            server["state"] + "".join(f"\ndrive {d} offline"
                                      for d in server.get("offline_drives", ())),
            f"{server['heartbeat_age_s']:.0f} s",
            " ".join(f"{k}={v}" for k, v in sorted(server["labels"].items())),
            "\n".join(space),
            "\n".join(f"{w['drive']}: {_writes_line(w)}" for w in server.get("drive_writes", ()))
            or server.get("drive_writes_error", ""),
        )
    console.print(table)


def _writes_line(w: dict[str, int]) -> str:
    """A drive's ``drive_writes`` in one line."""
    return (f"{human(w['bytes_written'])} in {w['runs']} runs of {human(w['mean_run_bytes'])}, "
            f"{w['zone_switches']} zone / {w['group_switches']} group switches, "
            f"queue {w['queued_pieces']} ({human(w['queued_bytes'])})")


def _is_url(target: str) -> bool:
    from shinglefs.meta.backend import PG_SCHEMES, SQLITE_SCHEMES

    return "://" in target or target.split(":", 1)[0].lower() in SQLITE_SCHEMES + PG_SCHEMES


def _directory_or_failing_mount(path: str) -> bool:
    """Is ``path`` a directory, or a mount point that fails to answer (a dead
    daemon: ENOTCONN; its metadata unreachable: EIO)? ``_status_of_mount``
    then says which. (``os.path.isdir`` is False for both: the user was told
    the mount point "is neither a directory nor a metadata URL".)"""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


def status_command(
    target: str | None = typer.Argument(None, help="a mount point or a metadata URL "
                                        "(default: every ShingleFS mount)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    server_timeout: float | None = typer.Option(
        None, "--server-timeout", metavar="SECONDS",
        help="a storage server without a heartbeat for this long is down (default 15)"),
    servers_only: bool = typer.Option(
        False, "--servers", help="only the storage servers of a metadata URL (opens no "
        "drive: works from any host, and while the file system is mounted)"),
    mount_timeout: float = typer.Option(
        MOUNT_ANSWER_S, "--mount-timeout", metavar="SECONDS", min=0.1,
        help="a mount that does not answer within this long is reported as such"),
) -> None:
    """Capacity, drives, zones by condition, write amplification, storage servers."""
    if servers_only:
        if target is None or not _is_url(target):
            raise UsageError("--servers needs a metadata URL",
                             hint="e.g. shinglefs status postgresql://db/shingle --servers")
        _show_servers_of_url(target, server_timeout, as_json)
        return
    failed: dict[str, MountFailedError] = {}
    if target is None:
        results, failed = _status_of_every_mount(mount_timeout)
    elif _is_url(target):
        results = {target: _status_of_url(target, server_timeout)}
    else:
        mountpoint = os.path.abspath(target)
        # A mount's own root is not looked at here: a daemon that does not
        # answer would hold this thread (its status is asked with a deadline).
        if mountpoint not in mounts_of_type(FSTYPE) and not _directory_or_failing_mount(
                mountpoint):
            from shinglefs.meta.backend import url_hint

            raise UsageError(f"{target} is neither a directory nor a metadata URL",
                             hint=url_hint(target) if os.path.isfile(target)
                             else "pass a mount point or sqlite3:///PATH / postgresql://...")
        answered, refused = _statuses_within([mountpoint], mount_timeout)
        if refused:
            raise refused[mountpoint]
        results = answered
    if as_json:
        if target is None:
            results.update({mp: {"error": str(exc)} for mp, exc in failed.items()})
        typer.echo(json.dumps(results if target is None else next(iter(results.values()))))
        return
    for title, status in results.items():
        _print_status(status, title)
    for mp, exc in failed.items():
        typer.echo(f"shinglefs: {mp}: {exc}", err=True)


def register(app: typer.Typer) -> None:
    app.command("status")(status_command)
