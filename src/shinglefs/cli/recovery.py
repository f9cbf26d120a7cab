"""Recovery commands: ``fsck``, ``scrub``, ``dump``, ``load``.

The work lives in ``shinglefs.client.recovery`` (fsck, scrub, backups on the
drives) and ``shinglefs.meta.dump``; this module parses, shows progress on
stderr and turns outcomes into exit codes (docs/cli.md): 0 clean, 40 problems
found and all repaired, 41 damage remains (found without ``--repair``, or not
repairable; scrub: damaged files), 42 (scrub) nothing damaged found but a
storage server or one of its drives was not scrubbed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from shinglefs.errors import UsageError

EXIT_REPAIRED = 40
EXIT_DAMAGED = 41
EXIT_NOT_SCRUBBED = 42
MiB = 1024 * 1024
SHOWN_PER_PASS = 20


@contextmanager
def _progress(total: int | None, what: str) -> Iterator[Any]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:  # a script's stderr gets the error lines alone (a
        # stopped live display writes a newline even where it drew nothing)
        yield lambda advance=1, description=None: None
        return
    counter = DownloadColumn() if what == "bytes" else MofNCompleteColumn()
    with Progress(TextColumn("{task.description}"), BarColumn(), counter, TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda advance=1, description=None: bar.update(
            task, advance=advance, **({"description": description} if description else {}))


def _existing(meta_url: str) -> str:
    """``meta_url`` made absolute; ``NotFormatted`` (nothing created) when it names a
    SQLite file that does not exist: a mistyped path must not leave an empty
    database behind."""
    from shinglefs.client.filesystem import absolute_meta_url, require_metadata_file

    meta_url = absolute_meta_url(meta_url)
    require_metadata_file(meta_url)
    return meta_url


def _print_fsck(report: Any) -> None:
    for name, found in report.found.items():
        if not found:
            continue
        typer.echo(f"{name}: {len(found)} problem(s)")
        for f in found[:SHOWN_PER_PASS]:
            typer.echo(f"  {f.detail}" + ("" if f.repairable else "  [not repairable]"))
        if len(found) > SHOWN_PER_PASS:
            typer.echo(f"  ... and {len(found) - SHOWN_PER_PASS} more")
    for line in report.actions:
        typer.echo(f"repaired: {line}")
    for name, found in report.remaining.items():
        for f in found[:SHOWN_PER_PASS]:
            typer.echo(f"remaining: {name}: {f.detail}")
    for line in report.skipped:
        typer.echo(f"skipped: {line}")


def _fsck_exit(report: Any) -> int:
    if report.clean:
        return 0
    return EXIT_DAMAGED if report.remaining else EXIT_REPAIRED


def fsck_command(
    meta_url: str = typer.Argument(..., help="metadata URL of the file system"),
    repair: bool = typer.Option(False, "--repair", help="fix what is safe to fix"),
    force: bool = typer.Option(False, "--force",
                               help="repair even though sessions look alive"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Check metadata against the drives; exit 0 clean, 40 repaired, 41 damaged."""
    from shinglefs.client.recovery import fsck
    from shinglefs.meta.fsck import FSCK_PASSES

    meta_url = _existing(meta_url)
    with _progress(len(FSCK_PASSES), "passes") as step:
        report = fsck(meta_url, repair=repair, force=force,
                      progress=lambda name: step(description=name))
    if as_json:
        typer.echo(json.dumps({
            "found": {k: [f.detail for f in v] for k, v in report.found.items() if v},
            "actions": report.actions,
            "remaining": {k: [f.detail for f in v] for k, v in report.remaining.items()},
            "skipped": report.skipped,
        }))
    else:
        _print_fsck(report)
        typer.echo("clean" if report.clean else
                   ("repaired" if not report.remaining else "damaged"), err=True)
    raise typer.Exit(_fsck_exit(report))


def scrub_command(
    meta_url: str = typer.Argument(..., help="metadata URL of the file system"),
    rate_text: str = typer.Option("0", "--rate", metavar="MiB/s",
                                  help="read at most this many MiB/s per drive (0: no limit)"),
) -> None:
    """Read every stored slice and verify its checksums; resumable; exit 41 if damaged,
    42 if a storage server or drive was not scrubbed."""
    from shinglefs.client.recovery import scrub

    rate = _rate(rate_text)
    meta_url = _existing(meta_url)
    with _progress(None, "bytes") as step:
        result = scrub(meta_url, rate_bytes=rate * MiB or None, progress=step)
    for path, why in sorted(result.damaged_files.items()):
        health = result.file_health.get(path)
        typer.echo(f"damaged: {path}" + (f"  [{HEALTH_SAYS[health]}]" if health else ""))
        for line in why:
            typer.echo(f"  {line}")
    for sid in result.unreferenced:
        typer.echo(f"damaged slice {sid:#x} (no file uses it)")
    for server in result.servers.values():
        if server.error is not None:
            typer.echo(f"not scrubbed: server {server.label}: {server.error}")
        for drive_id, refused in sorted(server.failed.items()):
            typer.echo(f"not scrubbed: server {server.label} drive {drive_id}: {refused}")
        for drive_id, last in sorted(server.drives.items()):
            if not last.finished:
                typer.echo(f"not scrubbed to its end: server {server.label} drive {drive_id}")
    typer.echo(_scrub_summary(result), err=True)
    if result.damaged_files or result.unreferenced:
        raise typer.Exit(EXIT_DAMAGED)
    if not result.finished:
        raise typer.Exit(EXIT_NOT_SCRUBBED)


def _rate(text: str) -> float:
    """``--rate``: MiB/s, 0 for no limit; ``UsageError`` (exit 2) for anything else."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not math.isfinite(rate) or rate < 0:
        raise UsageError(f"--rate {text!r} is not a number of MiB/s (0 or more)",
                         hint="e.g. `shinglefs scrub META_URL --rate 100`")
    return rate


HEALTH_SAYS = {
    "lost": "beyond repair: a slice of it has no undamaged copy",
    "unverified": "at risk: a slice's other copies were not scrubbed",
    "degraded": "degraded: still readable, every damaged slice has a verified copy",
}


def _scrub_summary(result: Any) -> str:
    line = f"scrubbed {result.bytes_read / MiB:.1f} MiB on {result.drive_count} drive(s)"
    if not result.servers:
        return line
    scrubbed = sum(s.error is None for s in result.servers.values())
    line += f" of {scrubbed} server(s)"
    counts = [f"{n} {health}" for health in ("lost", "unverified", "degraded")
              if (n := sum(h == health for h in result.file_health.values()))]
    if counts:
        line += f"; damaged files: {', '.join(counts)}"
    if scrubbed < len(result.servers):
        line += f"; {len(result.servers) - scrubbed} server(s) not scrubbed"
    return line


def dump_command(
    meta_url: str = typer.Argument(..., help="metadata URL to dump"),
    file: str = typer.Argument(..., help="JSON-lines file to write (gzip if it ends in .gz)"),
) -> None:
    """Write the metadata to a JSON-lines file (one consistent snapshot)."""
    from shinglefs.meta.dump import dump_url

    meta_url = _existing(meta_url)
    with _progress(None, "rows") as step:
        rows = dump_url(meta_url, file, progress=lambda table, n: step(0, f"{table} {n}"))
    typer.echo(f"dumped {sum(rows.values())} rows to {file}", err=True)


def load_command(
    sources: list[str] = typer.Argument(..., help="FILE META_URL, or with --from-drives: "
                                        "DRIVE... META_URL"),
    from_drives: bool = typer.Option(False, "--from-drives",
                                     help="rebuild from the newest metadata backup on the "
                                          "drives (KIND:PATH specs)"),
) -> None:
    """Load a dump (or the drives' newest backup) into an empty metadata database."""
    from shinglefs.client.filesystem import absolute_meta_url

    if from_drives:
        if len(sources) < 2:
            raise UsageError("load --from-drives needs DRIVE... META_URL",
                             hint="e.g. `shinglefs load --from-drives smr:/data/smr0.img "
                                  "sqlite3:///data/meta.db`")
        from shinglefs.client.recovery import load_from_drives

        target = absolute_meta_url(sources[-1])
        loaded = load_from_drives(sources[:-1], target)
        typer.echo(f"loaded metadata backup {loaded.backup.number} of drive "
                   f"{loaded.backup.drive} ({sum(loaded.rows.values())} rows); run "
                   f"`shinglefs fsck --repair {target}` next", err=True)
        return
    if len(sources) != 2:
        raise UsageError("load needs FILE META_URL", hint="e.g. `shinglefs load meta.jsonl "
                         "postgresql://fs@db/shingle`")
    from shinglefs.meta.dump import load_url

    target = absolute_meta_url(sources[1])
    with _progress(None, "rows") as step:
        rows = load_url(sources[0], target,
                        progress=lambda table, n: step(0, f"{table} {n}"))
    typer.echo(f"loaded {sum(rows.values())} rows into {target}", err=True)


def drive_replace_command(
    meta_url: str = typer.Argument(..., help="metadata URL of a file system with drives "
                                   "of its own"),
    drives: list[int] = typer.Argument(..., help="ids of the lost drives (`shinglefs status` "
                                       "lists them)"),
    to: str | None = typer.Option(None, "--to", metavar="KIND:PATH[:SIZE]",
                                  help="put the new drive here (one drive; default: where "
                                       "the lost one was recorded)"),
    force: bool = typer.Option(False, "--force", help="go on although sessions look alive"),
) -> None:
    """Put an empty drive in place of each lost one; cut the files that had bytes on them."""
    from shinglefs.client.drivereplace import replace_drives

    meta_url = _existing(meta_url)
    done = replace_drives(meta_url, drives, to=to, force=force)
    for d in done.drives:
        if d.moved_aside:
            typer.echo(f"drive {d.drive_id}: moved the lost drive's zone table aside to "
                       f"{d.moved_aside}")
        typer.echo(f"drive {d.drive_id}: " + {
            "formatted": "formatted an empty drive at ",
            "adopted": "adopted the empty drive an interrupted replace left at ",
            "already replaced": "already replaced by the empty drive at "}[d.how] + d.spec)
    _print_fsck(done.report)
    raise typer.Exit(EXIT_DAMAGED if done.report.remaining else 0)


def register(app: typer.Typer) -> None:
    from shinglefs.cli.policy import drive_app

    drive_app.command("replace")(drive_replace_command)
    app.command("fsck")(fsck_command)
    app.command("scrub")(scrub_command)
    app.command("dump")(dump_command)
    app.command("load")(load_command)
