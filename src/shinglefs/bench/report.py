"""``shinglefs bench report``: the benchmark report (docs/benchmarks.md) from the benchmarks' JSON.

``make bench`` runs every benchmark with ``--json`` into ``bench-data/NAME.json``;
``write_report(paths, out, img_dir)`` then writes the whole document from those
files alone: a table of every field that has a target (value, target, met or
missed), then one section per benchmark with what it measures and against
which baseline, its fields as a table (lists of rows as their own tables), the
raw JSON, and for ``bench smr`` the PNG plots (``sim.plots``) written into
``img_dir`` and linked relative to the report.

An input file holds one benchmark's dict (named by the file's stem, e.g.
``smr.json``) or ``bench all``'s ``{name: dict}``. A field's target is the
benchmark's own (its module's constants, the ``targets`` of its JSON:
``declared_targets``); met or missed is the benchmark's ``targets_met`` when
it says, else value against target. Raises ``ReportInputError`` for a file that is missing or not a JSON
object; writes nothing then.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shinglefs.bench import BENCHMARKS
from shinglefs.errors import UsageError

Target = tuple[str, float]  # (">=" or "<=", value)

ABOUT = {
    "store": "The slice store on an emulated drive: put/get MiB/s against raw writes and reads "
             "of the same bytes to the same files (`*_ratio`), write amplification under churn.",
    "index-scale": "Memory of the slice index per extent against a plain Python dict "
                   "(`baseline_dict_*`), lookup latency.",
    "meta": "Metadata operations per second on SQLite against raw single-row SQLite "
            "transactions with the same pragmas (`create_vs_baseline`).",
    "mount": "The mounted file system (FUSE) against the same operations on a local directory "
             "(`*_ratio`) and against the FUSE floor, a pass-through pyfuse3 file system "
             "(`*_of_floor`).",
    "smr": "What a real SMR drive would take for exactly what our store did: the store's drive "
           "traces replayed through the HC620 host-managed SMR model (`sim`); fractions are of "
           "the model's own sequential rate over the same span. Baselines: the same writes "
           "uncoalesced, a conventional file system's layout on a drive-managed SMR drive, "
           "managed NVMe (cost), the product's 72 s claim (cluster). See docs/sim.md.",
}


class ReportInputError(UsageError):
    """A benchmark JSON file is missing, unreadable or not a JSON object."""


def load_results(paths: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """``{benchmark name: result}`` from the files (``bench all`` files hold several)."""
    results: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ReportInputError(f"cannot read benchmark JSON {path}: {exc}",
                                   hint="run `shinglefs bench NAME --json > FILE` first") from exc
        if not isinstance(doc, dict):
            raise ReportInputError(f"{path} holds no benchmark result (not a JSON object)")
        if doc and all(k in BENCHMARKS and isinstance(v, dict) for k, v in doc.items()):
            results.update(doc)
        else:
            results[Path(path).stem] = doc
    return results


def declared_targets(name: str, result: dict[str, Any]) -> dict[str, Target]:
    """The targets benchmark ``name`` states for its fields (flattened names).

    A benchmark module states them as module constants: ``TARGETS`` and
    ``OF_FLOOR_TARGETS`` (met when at least), ``CEILINGS`` (met when at most),
    ``UPPER_BOUNDS`` (names in ``TARGETS`` met when at most); its JSON's
    ``targets`` object adds to them (at least, unless an upper bound).
    """
    module = None
    if name in BENCHMARKS:
        try:
            module = importlib.import_module(f"shinglefs.bench.{name.replace('-', '_')}")
        except ImportError:  # e.g. mount without FUSE: its JSON's targets_met still says
            module = None
    upper = set(getattr(module, "UPPER_BOUNDS", ()))
    targets: dict[str, Target] = {}
    given: dict[str, Any] = result["targets"] if isinstance(result.get("targets"), dict) else {}
    for source, op in ((getattr(module, "TARGETS", {}), ">="), (given, ">="),
                       (getattr(module, "OF_FLOOR_TARGETS", {}), ">="),
                       (getattr(module, "CEILINGS", {}), "<=")):
        for key, value in source.items():
            targets[key] = ("<=" if key in upper else op, float(value))
    if "target_create_per_s" in result:  # bench meta states its one target in its JSON
        targets["sqlite.create_per_s"] = (">=", float(result["target_create_per_s"]))
    return targets


def _met(key: str, value: Any, target: Target, said: dict[str, Any]) -> bool | None:
    if isinstance(said.get(key), bool):
        return bool(said[key])
    if not isinstance(value, int | float):
        return None
    return value <= target[1] if target[0] == "<=" else value >= target[1]


def _flat(prefix: str, values: dict[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows.extend(_flat(f"{name}.", value))
        else:
            rows.append((name, value))
    return rows


def _shown(value: Any) -> str:
    if isinstance(value, float):  # small figures to 5 significant digits (a WAF of 1.0005)
        return f"{value:,.0f}" if abs(value) >= 1e4 or (value.is_integer() and value) else \
            f"{value:,.1f}" if abs(value) >= 100 else f"{value:.5g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value).replace("|", "\\|")


def _mark(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "**missed**")


def _is_table(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def targets_table(results: dict[str, dict[str, Any]]) -> list[str]:
    """One row per field with a target, in every benchmark."""
    lines = ["| benchmark | field | value | target | met |", "|---|---|---|---|---|"]
    for name, result in results.items():
        values = dict(_flat("", result))
        said = result.get("targets_met", {}) if isinstance(result.get("targets_met"), dict) else {}
        for key, target in declared_targets(name, result).items():
            value = values.get(key)
            lines.append(f"| {name} | `{key}` | {_shown(value)} | {target[0]} {_shown(target[1])} "
                         f"| {_mark(_met(key, value, target, said))} |")
    return lines if len(lines) > 2 else []


def fields_table(name: str, result: dict[str, Any]) -> list[str]:
    """Every scalar field of a result with its target; lists of rows as tables after it."""
    targets = declared_targets(name, result)
    said = result.get("targets_met", {}) if isinstance(result.get("targets_met"), dict) else {}
    skip = {"targets", "targets_met"}
    lines = ["| field | value | target | met |", "|---|---|---|---|"]
    tables: list[str] = []
    for key, value in result.items():
        if key in skip:
            continue
        if _is_table(value):
            cols = list(value[0])
            tables += ["", f"`{key}`:", "", "| " + " | ".join(cols) + " |",
                       "|" + "---|" * len(cols)]
            tables += ["| " + " | ".join(_shown(row.get(c)) for c in cols) + " |" for row in value]
            continue
        for flat, v in _flat(f"{key}.", value) if isinstance(value, dict) else [(key, value)]:
            t = targets.get(flat)
            shown_t = f"{t[0]} {_shown(t[1])}" if t else ""
            met = _mark(_met(flat, v, t, said)) if t else ""
            lines.append(f"| `{flat}` | {_shown(v)} | {shown_t} | {met} |")
    return lines + tables


def plots_section(result: dict[str, Any], img_dir: Path, report_dir: Path) -> list[str]:
    """Write the SMR plots into ``img_dir``; Markdown showing each with its caption."""
    from shinglefs.sim.plots import CAPTIONS, write_plots

    lines: list[str] = []
    for path in write_plots(result, img_dir):
        rel = Path(os.path.relpath(Path(path).resolve(), report_dir.resolve())).as_posix()
        lines += [f"![{path.stem}]({rel})", "", f"*{CAPTIONS.get(path.name, path.stem)}*", ""]
    return lines


def _raw(result: dict[str, Any]) -> str:
    """``result`` as JSON, one top-level field a line."""
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}"
                               for k, v in result.items()) + "\n}"


def render_report(results: dict[str, dict[str, Any]], img_dir: Path, report_dir: Path,
                  sources: Sequence[Path] = ()) -> str:
    """The report's text for ``{benchmark name: result}``; writes the plots into ``img_dir``."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    hosts = sorted({str(r["host"]) for r in results.values() if r.get("host")})
    quick = sorted(n for n, r in results.items() if r.get("quick"))
    lines = ["# ShingleFS benchmark report", "",
             f"Written by `shinglefs bench report` on {now} from "
             + (", ".join(f"`{p}`" for p in sources) or "the benchmarks' JSON")
             + (f" (host {', '.join(hosts)})" if hosts else "") + ".",
             "`make bench` runs every `shinglefs bench` command with `--json` into `bench-data/`",
             "and then this report. Every figure is compared against a baseline measured in the",
             "same run on the same machine; the ratios are what matter, absolute rates depend on",
             "the host (a shared 2-core VM here)."
             + (f" Small sizes (`--quick`): {', '.join(quick)}." if quick else ""), ""]
    targets = targets_table(results)
    if targets:
        lines += ["## Targets", "", *targets, ""]
    order = [n for n in BENCHMARKS if n in results] + [n for n in results if n not in BENCHMARKS]
    for name in order:
        result = results[name]
        lines += [f"## `shinglefs bench {name}`", ""]
        if name in ABOUT:
            lines += [ABOUT[name], ""]
        if name == "smr":
            lines += plots_section(result, img_dir, report_dir)
        lines += fields_table(name, result)
        lines += ["", "<details><summary>raw JSON</summary>", "", "```json", _raw(result),
                  "```", "</details>", ""]
    return "\n".join(lines)


def write_report(paths: Sequence[Path], out: Path, img_dir: Path) -> list[Path]:
    """Write the report of the JSON files ``paths`` to ``out`` and its plots into ``img_dir``.

    Returns the files written (the report last). The report replaces ``out``
    whole (written to a temporary name, then renamed). Raises ReportInputError
    for a bad input (nothing written).
    """
    results = load_results(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(results, img_dir, out.parent, paths)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    images = sorted(img_dir.glob("smr-*.png")) if "smr" in results else []
    return [*images, out]
