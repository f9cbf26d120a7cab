"""``shinglefs bench NAME [--quick] [--json]``: run one benchmark or all of them."""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

import typer

from shinglefs.bench import BENCHMARKS
from shinglefs.errors import UsageError


def _load(name: str) -> Any:
    if name not in BENCHMARKS:
        raise UsageError(
            f"unknown benchmark {name!r}", hint=f"choose one of: {', '.join(BENCHMARKS)}, all"
        )
    return importlib.import_module(f"shinglefs.bench.{name.replace('-', '_')}")


def run_benchmark(name: str, quick: bool, workdir: Path | None, options: dict[str, Any]) -> dict:
    """Run benchmark ``name`` in ``workdir`` (a fresh temporary directory when None)."""
    module = _load(name)
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix=f"shinglefs-bench-{name}-", dir="/var/tmp") as tmp:
            return dict(module.run(quick=quick, workdir=Path(tmp), **options))
    workdir.mkdir(parents=True, exist_ok=True)
    return dict(module.run(quick=quick, workdir=workdir, **options))


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        name: str = typer.Argument(..., help=f"one of: {', '.join(BENCHMARKS)}, all"),
        quick: bool = typer.Option(False, "--quick", help="small sizes, finishes within a minute"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        workdir: Path | None = typer.Option(
            None, "--workdir", help="where to put drives and files (default: a temp dir)"
        ),
        meta: str | None = typer.Option(
            None, "--meta", help="extra metadata URL to benchmark (meta benchmark)"
        ),
        report: Path | None = typer.Option(
            None, "--report", help="with `all`: write a Markdown report here"
        ),
    ) -> None:
        """Measure a layer against a baseline taken in the same run."""
        options: dict[str, Any] = {}
        if meta is not None:
            options["meta_url"] = meta
        names = BENCHMARKS if name == "all" else [name]
        results = {}
        for one in names:
            opts = options if one == "meta" else {}
            results[one] = run_benchmark(one, quick, workdir, opts)
            if not as_json:
                typer.echo(f"== {one}")
                for key, value in results[one].items():
                    typer.echo(f"  {key:32s} {value}")
        if as_json:
            typer.echo(json.dumps(results if name == "all" else results[name], indent=None))
        if report is not None:
            from shinglefs.bench.report import write_report

            write_report(results, report)
