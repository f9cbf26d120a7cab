"""``shinglefs bench NAME [--quick] [--json]``: run one benchmark or all of them.

``shinglefs bench report FILE... [--out docs/benchmarks.md] [--img DIR]``
writes the benchmark report from the JSON the benchmarks printed
(``bench.report``). A benchmark is registered by its module in
``shinglefs.bench`` and its name in ``BENCHMARKS``; options only some
benchmarks take go through ``_options``.
"""

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
            result = dict(module.run(quick=quick, workdir=Path(tmp), **options))
    else:
        workdir.mkdir(parents=True, exist_ok=True)
        result = dict(module.run(quick=quick, workdir=workdir, **options))
    result.setdefault("quick", quick)  # the report says which sizes each figure is from
    return result


def _options(name: str, meta: str | None, hosts: str = "auto") -> dict[str, Any]:
    """The options benchmark ``name`` takes from the command line (register new ones here)."""
    if name == "cluster":
        if hosts not in ("auto", "loopback"):
            raise UsageError(f"--hosts {hosts!r} is neither auto nor loopback",
                             hint="auto: network namespaces when root may build them")
        return {"hosts": hosts, **({"meta_url": meta} if meta is not None else {})}
    if name == "meta" and meta is not None:
        return {"meta_url": meta}
    return {}


def _report(inputs: list[Path], out: Path, img: Path | None) -> None:
    from shinglefs.bench.report import write_report

    if not inputs:
        raise UsageError("bench report needs the benchmarks' JSON files",
                         hint="shinglefs bench report bench-data/*.json --out docs/benchmarks.md")
    for path in write_report(inputs, out, img or out.parent / "img"):
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        name: str = typer.Argument(..., help=f"one of: {', '.join(BENCHMARKS)}, all; or report"),
        inputs: list[Path] = typer.Argument(
            None, help="with report: the JSON files the benchmarks printed", show_default=False
        ),
        quick: bool = typer.Option(False, "--quick", help="small sizes, finishes within a minute"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        workdir: Path | None = typer.Option(
            None, "--workdir", help="where to put drives and files (default: a temp dir)"
        ),
        meta: str | None = typer.Option(
            None, "--meta", help="extra metadata URL to benchmark (meta benchmark); "
            "the PostgreSQL server of the cluster benchmark's small files"
        ),
        hosts: str = typer.Option(
            "auto", "--hosts", help="cluster benchmark: auto (network namespaces where "
            "root may build them) or loopback"
        ),
        out: Path = typer.Option(
            Path("docs/benchmarks.md"), "--out", help="with report: the Markdown file to write"
        ),
        img: Path | None = typer.Option(
            None, "--img", help="with report: folder for the plots (default: img/ beside --out)"
        ),
    ) -> None:
        """Measure a layer against a baseline taken in the same run; or write the report."""
        if name == "report":
            _report(list(inputs or []), out, img)
            return
        if inputs:
            raise UsageError(f"bench {name} takes no file arguments",
                             hint="files are for `shinglefs bench report FILE...`")
        names = BENCHMARKS if name == "all" else [name]
        results = {}
        for one in names:
            results[one] = run_benchmark(one, quick, workdir, _options(one, meta, hosts))
            if not as_json:
                typer.echo(f"== {one}")
                for key, value in results[one].items():
                    typer.echo(f"  {key:32s} {value}")
        if as_json:
            typer.echo(json.dumps(results if name == "all" else results[name], indent=None))
