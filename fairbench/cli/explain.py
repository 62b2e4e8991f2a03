"""`fairbench explain BASELINE CANDIDATE`: where a TTFT p99 shift comes from, and why.

An edge: reads the two run directories' records, calls fairbench.analysis.explain (pure), prints
the shift, the groups and components that carry it and the ranked causes, and writes the same
JSON to `explain.json` in the candidate's directory.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from fairbench.cli.inputs import UsageFailure, run_dir

console = Console(highlight=False)


def _records(path: Path) -> Any:
    from fairbench.run.records import read_records

    run_dir(path, "records.parquet")
    try:
        return read_records(path / "records.parquet")
    except (OSError, ValueError) as error:
        raise UsageFailure(f"{path / 'records.parquet'}: cannot read ({error})") from None


def _ms(value: Any) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.1f} ms"


def _pct(value: Any) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:+.2%}"


def _print(out: dict[str, Any]) -> None:
    s = out["shift"]
    ci = (
        f"[{_pct(s['ci_low'])}, {_pct(s['ci_high'])}] ({s['ci_confidence']:.0%}, {s['ci_method']})"
        if s["ci_low"] is not None and s["ci_high"] is not None
        else f"no interval ({s.get('ci_reason') or s['ci_method']})"
    )
    console.print(
        f"{out['metric']}: {_ms(s['baseline_ms'])} -> {_ms(s['candidate_ms'])} "
        f"({_pct(s['relative'])}), {ci}",
        markup=False,
    )
    for dim, groups in out["groups"].items():
        parts = [f"{name} {_pct(g['relative'])}" for name, g in groups.items()]
        console.print(f"by {dim}: " + ", ".join(parts), markup=False)
    comps = out["components"]
    console.print(
        f"tail TTFT components ({comps['tail']['definition']}), growth with 95% CI:", markup=False
    )
    for name, c in comps.items():
        if name == "tail":
            continue
        band = f"[{c['ci_low_ms']:+.1f}, {c['ci_high_ms']:+.1f}]"
        console.print(f"  {name:<12} {c['growth_ms']:+8.1f} ms  {band}", markup=False)
    q = out["queue_length"]
    if q["variance_ratio"] is not None:
        band = (
            f"[{q['ci_low']:.2f}, {q['ci_high']:.2f}] (95%, {q['ci_method']})"
            if q.get("ci_low") is not None
            else f"no interval ({q.get('ci_reason')})"
        )
        console.print(
            f"queue length: mean {q['baseline']['mean']:.2f} -> {q['candidate']['mean']:.2f}, "
            f"variance ratio {q['variance_ratio']:.2f} {band}",
            markup=False,
        )
    console.print("causes, ranked:", markup=False)
    for rank, cause in enumerate(out["causes"], start=1):
        console.print(
            f"  {rank}. {cause['name']:<26} share {cause['share']:.2f}  {cause['evidence']}",
            markup=False,
        )


def _finite(value: Any) -> Any:
    """JSON has no NaN: a figure that could not be computed is null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float | int) and not isinstance(value, bool):
        return None if not math.isfinite(float(value)) else value
    return value


def register(app: typer.Typer) -> None:
    @app.command()
    def explain(
        baseline: Annotated[
            Path, typer.Argument(help="the baseline run's directory", metavar="BASELINE")
        ],
        candidate: Annotated[
            Path, typer.Argument(help="the candidate run's directory", metavar="CANDIDATE")
        ],
        metric: Annotated[
            str, typer.Option("--metric", help="the metric to explain (ttft_p99)", metavar="METRIC")
        ] = "ttft_p99",
        as_json: Annotated[
            bool, typer.Option("--json", help="print the explanation as JSON")
        ] = False,
    ) -> None:
        """Where a shift in TTFT p99 between two runs of one scenario comes from: which tenants,
        classes and TTFT components carry it, and a ranked list of causes with evidence."""
        from fairbench.analysis.explain import explain as explain_runs

        if metric != "ttft_p99":
            raise UsageFailure(f"--metric: explain decomposes ttft_p99 only, got {metric!r}")
        base, cand = _records(baseline), _records(candidate)
        out = explain_runs(base, cand, metric)
        text = json.dumps(_finite(out), indent=2) + "\n"
        (candidate / "explain.json").write_text(text, encoding="utf-8")
        if as_json:
            sys.stdout.write(text)
        else:
            _print(out)
            console.print(f"wrote {candidate / 'explain.json'}", markup=False)
