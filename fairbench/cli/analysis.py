"""`fairbench compare` and `fairbench ab`: paired A/B verdicts. Registered by fairbench.cli.main."""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from fairbench.decide.compare import CompareRefused, Comparison, compare_dirs
from fairbench.pipeline import run_scenario
from fairbench.report import write_run_report
from fairbench.run import RunOptions, write_json
from fairbench.workload.scenario import ScenarioError, parse_scenario, read_yaml

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def verdict_table(comparison: Comparison, title: str) -> Table:
    table = Table(title=title, caption=comparison.design, title_justify="left")
    for col in ("metric", "A", "B", "change", "95% CI", "p", "verdict"):
        table.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
    colour = {"better": "green", "worse": "red", "cannot evaluate": "yellow"}
    for v in comparison.verdicts:
        latency = not v.absolute and ("ttft" in v.metric or "e2e" in v.metric or "tpot" in v.metric)
        show = (lambda x: f"{x / 1e6:.1f} ms") if latency else (lambda x: f"{x:.3f}")
        fmt = (lambda x: f"{x:+.3f}") if v.absolute else (lambda x: f"{x:+.1%}")
        ci = "-" if math.isnan(v.ci_low) else f"[{fmt(v.ci_low)}, {fmt(v.ci_high)}]"
        table.add_row(
            v.metric,
            "-" if math.isnan(v.a) else show(v.a),
            "-" if math.isnan(v.b) else show(v.b),
            "-" if math.isnan(v.diff) else fmt(v.diff),
            ci,
            "-" if math.isnan(v.p_value) else f"{v.p_value:.3f}",
            f"[{colour.get(v.verdict, 'white')}]{v.verdict}[/]",
        )
    return table


def variant(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The scenario with each PATH=VALUE applied (VALUE read as YAML)."""
    from fairbench.decide.sweep import apply

    params = {}
    for item in overrides:
        path, sep, text = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r}: use PATH=VALUE, e.g. scheduler.policy=dwrr")
        params[path.strip()] = read_yaml(text)
    return apply(raw, params)


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        runs: Annotated[list[Path] | None, typer.Argument(help="RUN_A RUN_B")] = None,
        a: Annotated[list[Path] | None, typer.Option("--a", help="A runs (repeat)")] = None,
        b: Annotated[list[Path] | None, typer.Option("--b", help="B runs (repeat)")] = None,
        resamples: Annotated[int, typer.Option(min=100)] = 1000,
        confidence: Annotated[float, typer.Option(min=0.5, max=0.999)] = 0.95,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Paired A/B verdicts for runs that replayed the same plan."""
        a_dirs = list(a or [])
        b_dirs = list(b or [])
        if runs:
            if len(runs) != 2:
                raise typer.BadParameter("give two runs (A B), or --a/--b for several")
            a_dirs.append(runs[0])
            b_dirs.append(runs[1])
        if not a_dirs or not b_dirs:
            raise typer.BadParameter("nothing to compare: give RUN_A RUN_B")
        try:
            comparison = compare_dirs(a_dirs, b_dirs, resamples, confidence)
        except (CompareRefused, FileNotFoundError) as error:
            err.print(f"cannot compare: {error}", markup=False, highlight=False)
            raise typer.Exit(2) from None
        if as_json:
            sys.stdout.write(json.dumps(comparison.as_dict(), indent=2) + "\n")
        else:
            out.print(verdict_table(comparison, "B vs A"))

    @app.command()
    def ab(
        file: Annotated[Path, typer.Argument(help="scenario file")],
        a: Annotated[list[str], typer.Option("--a", help="PATH=VALUE for arm A (repeat)")],
        b: Annotated[list[str], typer.Option("--b", help="PATH=VALUE for arm B (repeat)")],
        iterations: Annotated[int, typer.Option(min=1)] = 3,
        confidence: Annotated[
            str | None,
            typer.Option(
                help="Netperf-style 'LEVEL,WIDTH' (e.g. 99,5): add iterations until the first "
                "metric's CI is within ±WIDTH/2 % or --max-iterations"
            ),
        ] = None,
        metric: Annotated[str, typer.Option(help="metric for --confidence")] = "ttft_p99",
        max_iterations: Annotated[int, typer.Option(min=1)] = 10,
        out_dir: Annotated[Path | None, typer.Option("--out")] = None,
        resamples: Annotated[int, typer.Option(min=100)] = 1000,
    ) -> None:
        """Run arms A and B on the same plans (seeds interleaved A B B A ...) and compare."""
        raw = read_yaml(file.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ScenarioError(["(top level): must be a mapping of fields"], str(file))
        arms = {
            "A": parse_scenario(variant(raw, a), str(file), file.parent),
            "B": parse_scenario(variant(raw, b), str(file), file.parent),
        }
        level, width = 0.95, None
        if confidence:
            try:
                lv, wd = (float(x) for x in confidence.split(","))
                level, width = lv / 100, wd / 100
            except ValueError:
                raise typer.BadParameter("--confidence takes LEVEL,WIDTH, e.g. 99,5") from None
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"ab-{arms['A'].name}-{stamp}"
        dirs: dict[str, list[Path]] = {"A": [], "B": []}
        seed0 = arms["A"].run.seed
        i = 0
        comparison: Comparison | None = None
        why = "the planned iterations ran"
        limit = max_iterations if width is not None else iterations
        while i < limit:
            order = ("A", "B") if i % 2 == 0 else ("B", "A")
            for arm in order:
                run = run_scenario(arms[arm], RunOptions(out=base / f"{arm}-{i}", seed=seed0 + i))
                write_run_report(run.run_dir)
                dirs[arm].append(run.run_dir)
                err.print(
                    f"{arm} seed {seed0 + i}: {'VALID' if run.summary['valid'] else 'INVALID'}"
                    f" -> {run.run_dir}",
                    markup=False,
                    highlight=False,
                )
            i += 1
            if width is None and i < iterations:
                continue
            try:
                comparison = compare_dirs(dirs["A"], dirs["B"], resamples, level)
            except CompareRefused as error:
                err.print(f"cannot compare: {error}", markup=False, highlight=False)
                raise typer.Exit(2) from None
            if width is None:
                break
            target = next((v for v in comparison.verdicts if v.metric == metric), None)
            if target is None:
                raise typer.BadParameter(f"--metric {metric!r} is not a compared metric")
            half = (target.ci_high - target.ci_low) / 2
            if i >= 2 and math.isfinite(half) and half <= width / 2:
                why = f"{metric}: CI half-width {half:.2%} within ±{width / 2:.2%} after {i}"
                break
            why = f"{metric}: max iterations ({max_iterations}) reached before ±{width / 2:.2%}"
        assert comparison is not None
        write_json(
            base / "comparison.json",
            {
                **comparison.as_dict(),
                "stopped": why,
                "a": [str(p) for p in dirs["A"]],
                "b": [str(p) for p in dirs["B"]],
            },
        )
        out.print(verdict_table(comparison, f"B ({' '.join(b)}) vs A ({' '.join(a)})"))
        out.print(f"{why}; comparison.json in {base}", markup=False, highlight=False)


def _objectives(specs: list[str]) -> tuple[list[str], list[str]]:
    names, senses = [], []
    for spec in specs:
        name, _, sense = spec.rpartition(":")
        if sense not in ("max", "min") or not name:
            raise typer.BadParameter(f"{spec!r}: use NAME:max or NAME:min, e.g. goodput:max")
        names.append(name)
        senses.append(sense)
    return names, senses


def front_table(
    title: str,
    labels: list[str],
    summaries: list[dict[str, Any]],
    names: list[str],
    senses: list[str],
) -> Table:
    from fairbench.analysis.registry import metric_value
    from fairbench.decide.sweep import pareto_front

    values = np.array([[metric_value(s, n) for n in names] for s in summaries])
    front = pareto_front(values, senses)
    table = Table(title=title, title_justify="left")
    table.add_column("point")
    for name, sense in zip(names, senses, strict=True):
        table.add_column(f"{name} ({sense})", justify="right")
    table.add_column("front")
    for label, row, on in zip(labels, values, front, strict=True):
        style = "bold" if on else "dim"
        table.add_row(label, *(f"{v:.4g}" for v in row), "yes" if on else "dominated", style=style)
    return table


DEFAULT_OBJECTIVES = ["goodput:max", "ttft_p99:min", "jain_slowdown:max"]


def register_sweeps(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        file: Annotated[Path, typer.Argument(help="sweep file")],
        out_dir: Annotated[Path | None, typer.Option("--out")] = None,
        objective: Annotated[list[str] | None, typer.Option(help="NAME:max|min")] = None,
    ) -> None:
        """Run every point of a grid (simulated points in parallel) and show the Pareto front."""
        from fairbench.decide.sweep import run_sweep

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"sweep-{file.stem}-{stamp}"
        base.mkdir(parents=True, exist_ok=True)
        rows = run_sweep(
            file, base, lambda k, n: err.print(f"point {k}/{n} done"), write_run_report
        )
        names, senses = _objectives(objective or DEFAULT_OBJECTIVES)
        labels = [
            " ".join(f"{k}={v}" for k, v in r["params"].items())
            + (f" seed={r['seed']}" if r["seed"] is not None else "")
            for r in rows
        ]
        out.print(
            front_table(f"sweep of {file}", labels, [r["summary"] for r in rows], names, senses)
        )
        from fairbench.report import pareto_report, write_page

        links = [f"{Path(r['run_dir']).name}/report.html" for r in rows]
        page = pareto_report(
            labels,
            [r["summary"] for r in rows],
            names[0],
            names[1],
            (senses[0], senses[1]),
            params=[r["params"] for r in rows],
            links=links,
            more=list(zip(names[2:], senses[2:], strict=True)),
        )
        write_page(base / "report.html", page)
        out.print(f"results and report.html in {base}", markup=False, highlight=False)

    @app.command()
    def pareto(
        runs: Annotated[list[Path], typer.Argument(help="run directories")],
        objective: Annotated[list[str] | None, typer.Option(help="NAME:max|min")] = None,
    ) -> None:
        """The non-dominated runs on the chosen objectives (dominated ones shown dimmed)."""
        names, senses = _objectives(objective or DEFAULT_OBJECTIVES)
        summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
        out.print(front_table("Pareto front", [str(r) for r in runs], summaries, names, senses))

    @app.command()
    def knee(
        file: Annotated[Path, typer.Argument(help="scenario file")],
        low: Annotated[float, typer.Option(help="load multiplier that must meet the SLOs")] = 0.25,
        high: Annotated[float, typer.Option(help="load multiplier that must miss them")] = 8.0,
        attainment: Annotated[float, typer.Option(min=0, max=1)] = 0.99,
        tolerance: Annotated[float, typer.Option(min=0.001)] = 0.05,
        out_dir: Annotated[Path | None, typer.Option("--out")] = None,
    ) -> None:
        """The highest load (a multiple of the scenario's rates) at which every class with an
        SLO still reaches `attainment`, found by bisection."""
        from fairbench.decide.sweep import knee as find_knee
        from fairbench.decide.sweep import scale_load

        raw = read_yaml(file.read_text(encoding="utf-8"))
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"knee-{file.stem}-{stamp}"

        def holds(factor: float) -> bool:
            scn = parse_scenario(scale_load(raw, factor), str(file), file.parent)
            outcome = run_scenario(scn, RunOptions(out=base / f"x{factor:.4g}"))
            write_run_report(outcome.run_dir)
            summary = outcome.summary
            with_slo = [c for c, slo in scn.slo_classes.items() if slo.ttft or slo.tpot or slo.e2e]
            got = [summary["slo_classes"].get(c, {}).get("slo_attainment") for c in with_slo]
            ok = summary["valid"] and all(g is None or g >= attainment for g in got)
            err.print(
                f"load x{factor:.4g}: {'holds' if ok else 'misses'} ({got})",
                markup=False,
                highlight=False,
            )
            return ok

        best, trail = find_knee(holds, low, high, tolerance)
        write_json(base / "knee.json", {"knee": best, "trail": trail, "attainment": attainment})
        if best is None:
            out.print(f"even x{low:g} misses the SLOs; lower --low")
        else:
            out.print(
                f"knee: load x{best:.3g} of {file.name} meets every SLO at "
                f"{attainment:.0%}; results in {base}",
                markup=False,
                highlight=False,
            )


def register_gate(app: typer.Typer) -> None:
    @app.command()
    def gate(
        candidate: Annotated[Path, typer.Option(help="candidate run directory or summary.json")],
        rules: Annotated[Path, typer.Option(help="rules file (YAML)")],
        baseline: Annotated[Path | None, typer.Option(help="baseline run or summary.json")] = None,
        junit: Annotated[Path | None, typer.Option(help="write JUnit XML here")] = None,
        markdown: Annotated[Path | None, typer.Option(help="write Markdown here")] = None,
    ) -> None:
        """Judge a candidate run against rules (and a baseline): exit 0 pass, 1 regression,
        2 cannot evaluate."""
        from fairbench.decide.gate import (
            GateError,
            as_junit,
            as_markdown,
            as_text,
            evaluate,
            exit_code,
            load_rules,
            load_summary,
        )

        try:
            rule_list = load_rules(rules)
            cand = load_summary(candidate)
            base = load_summary(baseline) if baseline is not None else None
        except GateError as error:
            for line in error.lines:
                err.print(
                    f"{rules}: {line}" if "rules" in line else line,
                    markup=False,
                    highlight=False,
                    soft_wrap=True,  # one line per problem, however long the path
                )
            raise typer.Exit(2) from None
        results, blocker = evaluate(rule_list, base, cand)
        sys.stdout.write(as_text(results, blocker))
        if junit is not None:
            junit.parent.mkdir(parents=True, exist_ok=True)
            junit.write_text(as_junit(results, blocker), encoding="utf-8")
        if markdown is not None:
            markdown.parent.mkdir(parents=True, exist_ok=True)
            with markdown.open("a", encoding="utf-8") as handle:  # $GITHUB_STEP_SUMMARY appends
                handle.write(as_markdown(results, blocker))
        raise typer.Exit(exit_code(results, blocker))


def register_report(app: typer.Typer) -> None:
    @app.command()
    def report(
        runs: Annotated[list[Path] | None, typer.Argument(help="run directories")] = None,
        compare_runs: Annotated[bool, typer.Option("--compare", help="RUNS are A B")] = False,
        quarterly: Annotated[bool, typer.Option(help="the A/B document from --a/--b runs")] = False,
        a: Annotated[list[Path] | None, typer.Option("--a")] = None,
        b: Annotated[list[Path] | None, typer.Option("--b")] = None,
        history: Annotated[bool, typer.Option(help="RUNS over time, with step detection")] = False,
        metric: Annotated[list[str] | None, typer.Option(help="metrics for --history")] = None,
        out_file: Annotated[Path | None, typer.Option("--out")] = None,
    ) -> None:
        """Write HTML reports (offline, self-contained): per run, an A/B document, or history."""
        from fairbench.report import comparison_report, history_report, write_page

        runs = list(runs or [])
        if history:
            summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
            order = sorted(
                range(len(runs)),
                key=lambda k: json.loads((runs[k] / "run.json").read_text()).get("started_at", ""),
            )
            names = metric or ["ttft_p99", "goodput", "jain_slowdown", "worst_slowdown_ratio"]
            page = history_report(
                [summaries[k] for k in order], [runs[k].name for k in order], names
            )
            target = out_file or Path("reports") / "history.html"
        elif compare_runs or quarterly:
            a_dirs = list(a or []) + ([runs[0]] if compare_runs and runs else [])
            b_dirs = list(b or []) + ([runs[1]] if compare_runs and len(runs) > 1 else [])
            try:
                comparison = compare_dirs(a_dirs, b_dirs)
            except CompareRefused as error:
                err.print(f"cannot compare: {error}", markup=False, highlight=False)
                raise typer.Exit(2) from None
            changed = _what_changed(a_dirs[0], b_dirs[0])
            target = out_file or Path("reports") / "ab-report.html"
            page = comparison_report(
                comparison, a_dirs, b_dirs, "Scheduler A/B report", changed, target.parent
            )
        else:
            for run in runs:
                write_run_report(run)
                out.print(
                    f"wrote {run / 'report.html'} and {run / 'summary.md'}",
                    markup=False,
                    highlight=False,
                )
            return
        write_page(target, page)
        out.print(f"wrote {target}", markup=False, highlight=False)


def _what_changed(a_dir: Path, b_dir: Path) -> str:
    """The scenario lines that differ between arm A and arm B (the scheduler, usually)."""
    import difflib

    a_text = (a_dir / "scenario.yaml").read_text(encoding="utf-8").splitlines()
    b_text = (b_dir / "scenario.yaml").read_text(encoding="utf-8").splitlines()
    diff = [
        line
        for line in difflib.unified_diff(a_text, b_text, "A", "B", lineterm="", n=0)
        if not line.startswith("@@")
    ]
    return "\n".join(diff) or "the scenarios are identical (runs differ by seed or target)"
