"""`fairbench compare`, `ab`, `sweep`, `pareto`, `knee`, `gate` and `report`: the commands that
decide across runs. Registered on the app by `fairbench.cli.main.main`."""

from __future__ import annotations

import contextlib
import datetime as dt
import difflib
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fairbench.cli.inputs import (
    CONFIDENCE_HELP,
    SET_HELP,
    UsageFailure,
    confidence_level,
    read_document,
    read_summary,
    run_dir,
    scenario_with,
)
from fairbench.workload.scenario import ScenarioError, parse_scenario

if TYPE_CHECKING:
    from fairbench.decide.compare import Comparison
    from fairbench.decide.points import PointResult, PointRunner, PointsFailed

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)  # one problem, one line, however long


def _level_text(level: float) -> str:
    return f"{level * 100:g}%"


def design_note(comparison: Comparison, advice: str) -> str:
    """The comparison's design line, with the advice for one pair given by the command that
    prints it (compare has no --iterations; ab has no --a RUN)."""
    text = comparison.design
    if comparison.pairs < 2:
        text = text.split(" — ")[0] + " — " + advice
    return text


def verdict_table(comparison: Comparison, title: str, level: float, caption: str) -> Table:
    """A row per metric and group: A, B (≥ for a lower bound; the runs' spread with 2+ pairs),
    the change, its interval, the practical threshold the verdict used, and the verdict."""
    from fairbench.analysis import registry

    table = Table(title=title, caption=caption, title_justify="left")
    cols = ("metric", "A", "B", "change", f"{_level_text(level)} CI", "threshold", "p", "verdict")
    for col in cols:
        table.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
    colour = {"better": "green", "worse": "red", "cannot evaluate": "yellow"}
    for v in comparison.verdicts:
        metric = registry.of_name(v.metric)

        def arm(x: float, bound: bool, runs: list[float], v: Any = v) -> str:
            text = registry.show(v.unit, x, bound)
            finite = [r for r in runs if r is not None and math.isfinite(r)]
            if len(finite) > 1:
                text += (
                    f" ({registry.show(v.unit, min(finite))}–{registry.show(v.unit, max(finite))})"
                )
            return text

        change = lambda x, m=metric: registry.show_change(m, x)  # noqa: E731
        ci = "-" if math.isnan(v.ci_low) else f"[{change(v.ci_low)}, {change(v.ci_high)}]"
        word = f"[{colour.get(v.verdict, 'white')}]{v.verdict}[/]"
        if v.reason and v.verdict not in ("better", "worse"):
            word += f" [dim]({v.reason})[/]"
        table.add_row(
            v.metric,
            arm(v.a, v.a_bound, v.a_runs),
            arm(v.b, v.b_bound, v.b_runs),
            change(v.diff),
            ci,
            "±" + change(v.threshold).lstrip("+"),
            "-" if math.isnan(v.p_value) else f"{v.p_value:.3f}",
            word,
        )
    return table


COMPARE_ADVICE = "compare 3 or more pairs (repeat --a RUN --b RUN)"
AB_ADVICE = "use --iterations 3 or more"
CONFIDENCE = Annotated[str, typer.Option("--confidence", help=CONFIDENCE_HELP, metavar="PCT")]
RESAMPLES = Annotated[
    int, typer.Option("--resamples", min=100, help="bootstrap resamples per metric", metavar="N")
]


RAY = Annotated[
    str | None,
    typer.Option(
        metavar="ADDRESS",
        help="run each point as a Ray task: auto (RAY_ADDRESS / `ray start`), local, or "
        "HOST:PORT (docs/ray.md)",
    ),
]
RAY_RESOURCE = Annotated[
    list[str] | None,
    typer.Option(metavar="NAME", help="with --ray: point k needs one unit of the k-th (cycled)"),
]


def point_runner(ray: str | None, resources: list[str] | None) -> PointRunner:
    """Where the command's points run, chosen once from --ray and --ray-resource: this machine,
    or Ray tasks (a missing ray package, an address where no cluster answers or a resource the
    cluster lacks is one line naming the flag, exit 2)."""
    if resources and ray is None:
        raise UsageFailure("--ray-resource needs --ray ADDRESS")
    from fairbench.decide.points import make_runner
    from fairbench.run.ray_shards import RaySetupError

    try:
        return make_runner(ray, resources or ())
    except RaySetupError as error:
        raise UsageFailure(str(error)) from None


@contextlib.contextmanager
def points_bar(title: str) -> Iterator[tuple[Console, Callable[[int, int], None]]]:
    """A progress bar on a terminal (points done of all, time), and the console to print each
    point's line on without tearing the bar; `advance(done, total)` moves it."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=False,
    ) as bar:
        task = bar.add_task(title, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield bar.console, advance


def points_failed(error: PointsFailed) -> typer.Exit:
    """Print each failed point's line; the exit to raise (2: bad input, 1: a failed run)."""
    for line in error.lines:
        err.print(line, markup=False, highlight=False)
    return typer.Exit(error.exit_code)


def _compared_dirs(paths: list[Path]) -> list[Path]:
    return [run_dir(p, "summary.json", "records.parquet", "scenario.yaml") for p in paths]


def detect_change(text: str, width: float | None, iterations: int) -> float:
    """--detect PCT as a fraction, after the checks that need no run."""
    from fairbench.decide.power import PowerError, parse_change

    if width is not None:
        raise UsageFailure("--detect and --precision: choose one stopping rule")
    if iterations < 2:
        raise UsageFailure(f"--detect needs 2 or more pilot pairs; got {iterations}")
    try:
        return parse_change(text)
    except PowerError as error:
        raise UsageFailure(str(error)) from None


def compare_power(comparison: Comparison, metric: str, change: float, window_s: float) -> Any:
    """compare --detect: the power plan from the pairs given (a usage error if it has none)."""
    from fairbench.decide.power import PowerError, from_comparison

    try:
        return from_comparison(comparison, metric, change, window_s)
    except PowerError as error:
        raise UsageFailure(f"--detect: {error}") from None


def detect_step(
    comparison: Comparison, metric: str, change: float, scn: Any, limit: int
) -> tuple[Any, str | None]:
    """The power plan after the pairs run so far, and why to stop (None: one pair more)."""
    from fairbench.decide.power import PowerError, from_comparison, stop_reason

    window = (scn.run.duration or 0) - scn.run.warmup - scn.run.cooldown
    try:
        found = from_comparison(comparison, metric, change, window)
    except PowerError as error:
        return None, f"{metric}: no power calculation: {error}"
    return found, stop_reason(found, limit)


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        runs: Annotated[
            list[Path] | None,
            typer.Argument(help="two run directories, A then B", metavar="RUN"),
        ] = None,
        a: Annotated[
            list[Path] | None,
            typer.Option(
                "--a", help="an A run directory (repeat for several pairs)", metavar="RUN"
            ),
        ] = None,
        b: Annotated[
            list[Path] | None,
            typer.Option("--b", help="a B run directory (repeat for several pairs)", metavar="RUN"),
        ] = None,
        resamples: RESAMPLES = 1000,
        confidence: CONFIDENCE = "95",
        as_json: Annotated[bool, typer.Option("--json", help="print the verdicts as JSON")] = False,
        detect: Annotated[
            str | None,
            typer.Option(
                help="power: how many pairs detect a relative change of PCT in --metric (80% "
                "power), from the pairs given (2 or more)",
                metavar="PCT",
            ),
        ] = None,
        metric: Annotated[
            str, typer.Option(help="the metric --detect watches", metavar="NAME")
        ] = "ttft_p99",
    ) -> None:
        """Paired A/B verdicts for runs that replayed the same plan (pairs matched by plan
        digest)."""
        level = confidence_level(confidence)
        a_dirs = list(a or [])
        b_dirs = list(b or [])
        if runs:
            if len(runs) != 2:
                raise UsageFailure(
                    f"compare: give two runs (RUN_A RUN_B), got {len(runs)}; "
                    "for several pairs repeat --a RUN --b RUN"
                )
            a_dirs.append(runs[0])
            b_dirs.append(runs[1])
        if not a_dirs or not b_dirs:
            raise UsageFailure("compare: nothing to compare; give RUN_A RUN_B (or --a RUN --b RUN)")
        a_dirs, b_dirs = _compared_dirs(a_dirs), _compared_dirs(b_dirs)
        change = None if detect is None else detect_change(detect, None, len(a_dirs))
        from fairbench.decide.compare import CompareRefused, compare_dirs  # after the checks

        try:
            comparison = compare_dirs(a_dirs, b_dirs, resamples, level)
        except CompareRefused as error:
            raise UsageFailure(f"cannot compare: {error}") from None
        note = design_note(comparison, COMPARE_ADVICE)
        found = None
        if change is not None:
            lo, hi = json.loads((a_dirs[0] / "summary.json").read_text())["window_s"]
            found = compare_power(comparison, metric, change, hi - lo)
        if as_json:
            payload = {**comparison.as_dict(), "design": note, "confidence": level}
            if found is not None:
                payload["power"] = found.as_dict()
            sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        else:
            out.print(verdict_table(comparison, "B vs A", level, note))
            if found is not None:
                out.print(found.sentence(), markup=False, highlight=False)

    @app.command()
    def ab(
        file: Annotated[Path, typer.Argument(help="scenario file", metavar="FILE")],
        a: Annotated[
            list[str],
            typer.Option(
                "--a",
                help="PATH=VALUE for arm A (repeat), e.g. scheduler.policy=fifo; tenants by id "
                "or index (tenants.<id>.weight=3), workloads by name",
                metavar="PATH=VALUE",
            ),
        ],
        b: Annotated[
            list[str],
            typer.Option("--b", help="PATH=VALUE for arm B (repeat), as --a", metavar="PATH=VALUE"),
        ],
        iterations: Annotated[
            int,
            typer.Option(min=1, help="pairs of runs (with --detect: the pilot pairs)", metavar="N"),
        ] = 3,
        confidence: CONFIDENCE = "95",
        precision: Annotated[
            float | None,
            typer.Option(
                help="Netperf-style: add pairs until --metric's CI is at most WIDTH % wide "
                "(±WIDTH/2), or --max-iterations",
                metavar="WIDTH",
                min=0.01,
            ),
        ] = None,
        detect: Annotated[
            str | None,
            typer.Option(
                help="power: from the pilot pairs, how many pairs detect a relative change of "
                "PCT in --metric (80% power) — and add pairs until reached, or --max-iterations",
                metavar="PCT",
            ),
        ] = None,
        metric: Annotated[
            str, typer.Option(help="the metric --precision or --detect watches", metavar="NAME")
        ] = "ttft_p99",
        max_iterations: Annotated[
            int,
            typer.Option(
                min=1, help="most pairs of runs with --precision or --detect", metavar="N"
            ),
        ] = 10,
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="directory (default: reports/ab-<scenario>-<UTC time>/)",
                metavar="DIR",
            ),
        ] = None,
        resamples: RESAMPLES = 1000,
        ray: RAY = None,
        ray_resource: RAY_RESOURCE = None,
    ) -> None:
        """Run arms A and B on the same plans (seeds interleaved A B B A ...) and compare.

        With --ray, each run is a Ray task; simulated runs of a batch of pairs run at once."""
        level = confidence_level(confidence)
        raw = read_document(file)
        chosen = {"A": scenario_with(file, a, "--a", raw), "B": scenario_with(file, b, "--b", raw)}
        docs = {arm: doc for arm, (doc, _) in chosen.items()}  # what each run parses again
        arms = {arm: scn for arm, (_, scn) in chosen.items()}
        from fairbench.decide.compare import CompareRefused, compare_dirs, default_rows
        from fairbench.decide.points import PointJob, PointsFailed
        from fairbench.plan.materialize import materialize
        from fairbench.report import write_run_report
        from fairbench.run import write_json

        seed0 = arms["A"].run.seed
        if materialize(arms["A"], seed0).digest != materialize(arms["B"], seed0).digest:
            raise UsageFailure(
                f"--a {' '.join(a)} / --b {' '.join(b)}: the arms plan different requests, and "
                "an A/B replays one plan in both: override what serves the requests (scheduler, "
                "target, tenant weights), not what makes them (workloads, arrivals, run)"
            )
        width = None if precision is None else precision / 100
        change = None if detect is None else detect_change(detect, width, iterations)
        if width is not None or change is not None:
            rows = default_rows(list(arms["A"].slo_classes), [t.id for t in arms["A"].tenants])
            known = [str(r) for r in rows]
            if metric not in known:
                close = difflib.get_close_matches(metric, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise UsageFailure(f"--metric {metric!r}: not a compared metric{hint}")
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"ab-{arms['A'].name}-{stamp}"
        if (base / "comparison.json").exists() or (base / "A-0").exists():
            raise UsageFailure(f"--out {base} already holds an A/B; choose a new directory")
        runner = point_runner(ray, ray_resource)
        dirs: dict[str, list[Path]] = {"A": [], "B": []}
        i = 0
        comparison: Comparison | None = None
        why = "the planned iterations ran"
        limit = max(max_iterations, iterations) if change is not None else iterations
        limit = max_iterations if width is not None else limit
        power_plan = None
        with runner, points_bar(f"A/B of {file.name}") as (console, advance):

            def done(result: PointResult, finished: int, total: int) -> None:
                advance(finished, total)
                if not result.failed:
                    state = "VALID" if result.valid else "INVALID"
                    line = f"{result.job.label}: {state} -> {result.job.out}"
                    console.print(line, markup=False, highlight=False)

            while i < limit:
                # without --precision every pair at once (a runner may run them together);
                # with it, one pair more until the interval is narrow enough
                pairs = range(i, iterations if width is None and i == 0 else i + 1)
                arms_run = [a for k in pairs for a in (("A", "B") if k % 2 == 0 else ("B", "A"))]
                keys = [k for k in pairs for _ in range(2)]
                jobs = [
                    PointJob(
                        f"{arm} seed {seed0 + k}",
                        docs[arm],
                        str(file),
                        str(base / f"{arm}-{k}"),
                        seed0 + k,
                        write_run_report,
                    )
                    for arm, k in zip(arms_run, keys, strict=True)
                ]
                results = runner.run(jobs, 1, done)
                failed = [r for r in results if r.failed]
                if failed:  # the runs that finished stay in --out
                    raise points_failed(PointsFailed.of(failed))
                for arm, result in zip(arms_run, results, strict=True):
                    dirs[arm].append(Path(result.job.out))
                i = pairs[-1] + 1
                try:
                    comparison = compare_dirs(dirs["A"], dirs["B"], resamples, level)
                except CompareRefused as error:
                    err.print(f"cannot compare: {error}", markup=False, highlight=False)
                    raise typer.Exit(1) from None  # a measured failure: an arm ran INVALID
                if change is not None:
                    power_plan, stop = detect_step(comparison, metric, change, arms["A"], limit)
                    why = stop or why
                    if stop:
                        break
                    continue
                if width is None:
                    break
                target = next((v for v in comparison.verdicts if v.metric == metric), None)
                half = math.nan if target is None else (target.ci_high - target.ci_low) / 2
                if i >= 2 and math.isfinite(half) and half <= width / 2:
                    why = f"{metric}: CI half-width {half:.2%} within ±{width / 2:.2%} after {i}"
                    break
                why = f"{metric}: max iterations ({max_iterations}) reached before ±{width / 2:.2%}"
        assert comparison is not None
        note = design_note(comparison, AB_ADVICE)
        write_json(
            base / "comparison.json",
            {
                **comparison.as_dict(),
                "design": note,
                "confidence": level,
                "stopped": why,
                **({"power": power_plan.as_dict()} if power_plan is not None else {}),
                "a": [str(p) for p in dirs["A"]],
                "b": [str(p) for p in dirs["B"]],
            },
        )
        out.print(verdict_table(comparison, f"B ({' '.join(b)}) vs A ({' '.join(a)})", level, note))
        out.print(f"{why}; comparison.json in {base}", markup=False, highlight=False)


def _objectives(specs: list[str]) -> tuple[list[str], list[str]]:
    """NAME:max|min specs, checked before anything runs (a typo must not cost a sweep)."""
    from fairbench.analysis.registry import MetricError, parse_name

    names, senses = [], []
    for spec in specs:
        name, _, sense = spec.rpartition(":")
        if sense not in ("max", "min") or not name:
            raise UsageFailure(f"--objective {spec!r}: use NAME:max or NAME:min, e.g. goodput:max")
        try:
            parse_name(name)
        except MetricError as error:
            raise UsageFailure(f"--objective {spec!r}: {error}") from None
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
    one = len(names) == 1
    table.add_column("best" if one else "front")
    for label, row, on in zip(labels, values, front, strict=True):
        style = "bold" if on else "dim"
        mark = ("yes" if on else "-") if one else ("yes" if on else "dominated")
        table.add_row(label, *(f"{v:.4g}" for v in row), mark, style=style)
    return table


DEFAULT_OBJECTIVES = ["goodput:max", "ttft_p99:min", "jain_backlogged:max"]
OBJECTIVE = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME:max or NAME:min (repeat; default goodput:max ttft_p99:min "
        "jain_slowdown:max). One objective ranks the points (best marked); two or more give "
        "the Pareto front",
        metavar="NAME:SENSE",
    ),
]


def _scenario_file(file: Path, what: str) -> Path:
    if not file.exists():
        raise UsageFailure(f"{file}: file not found (the {what})")
    if not file.is_file():
        raise UsageFailure(f"{file}: not a file (the {what})")
    return file


def _show_failed_sweep(
    file: Path,
    base: Path,
    rows: list[dict[str, Any]],
    labels: list[str],
    names: list[str],
    senses: list[str],
    failed: list[dict[str, Any]],
) -> None:
    """A sweep with failed points: the table of those that ran, then one line per failure, and
    the exit (2 when every failure was bad input, such as a point directory that holds a run)."""
    from fairbench.decide.points import PointsFailed

    if rows:
        out.print(
            front_table(f"sweep of {file}", labels, [r["summary"] for r in rows], names, senses)
        )
    err.print(
        f"{len(failed)} of {len(failed) + len(rows)} points failed (sweep.json in {base}):",
        markup=False,
        highlight=False,
    )
    lines = [r["error"] for r in failed]
    raise points_failed(PointsFailed(lines, all(r["bad_input"] for r in failed)))


def register_sweeps(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        file: Annotated[Path, typer.Argument(help="sweep file (YAML)", metavar="FILE")],
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out", help="directory (default: reports/sweep-<file>-<UTC time>/)", metavar="DIR"
            ),
        ] = None,
        objective: OBJECTIVE = None,
        ray: RAY = None,
        ray_resource: RAY_RESOURCE = None,
    ) -> None:
        """Run every point of a grid (simulated points in parallel) and show the Pareto front.

        With --ray, each point is a Ray task. report.html plots the first two objectives (with
        one objective it is not written)."""
        names, senses = _objectives(objective or DEFAULT_OBJECTIVES)
        _scenario_file(file, "sweep file")
        from fairbench.decide.sweep import run_sweep  # after the checks: it loads the stack
        from fairbench.report import write_run_report

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"sweep-{file.stem}-{stamp}"
        runner = point_runner(ray, ray_resource)
        try:
            with runner, points_bar(f"sweep of {file.name}") as (console, advance):

                def done(k: int, n: int) -> None:
                    advance(k, n)
                    console.print(f"point {k}/{n} done", markup=False, highlight=False)

                base.mkdir(parents=True, exist_ok=True)
                rows = run_sweep(file, base, done, write_run_report, runner)
        except ScenarioError as error:
            if error.source is None:
                error.source = str(file)
            raise
        except FileNotFoundError as error:  # the scenario the sweep file names
            raise UsageFailure(
                f"{file}: scenario: no such file {error.filename} (relative to the sweep file)"
            ) from None
        failed = [r for r in rows if r.get("error")]
        rows = [r for r in rows if not r.get("error")]  # the table and the page show the rest
        labels = [
            " ".join(f"{k}={v}" for k, v in r["params"].items())
            + (f" seed={r['seed']}" if r["seed"] is not None else "")
            for r in rows
        ]
        if failed:
            _show_failed_sweep(file, base, rows, labels, names, senses, failed)
        out.print(
            front_table(f"sweep of {file}", labels, [r["summary"] for r in rows], names, senses)
        )
        if len(names) < 2:
            out.print(f"results in {base} (report.html needs two objectives)", markup=False)
            return
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
        runs: Annotated[list[Path], typer.Argument(help="run directories", metavar="RUN")],
        objective: OBJECTIVE = None,
    ) -> None:
        """The non-dominated runs on the chosen objectives (dominated ones shown dimmed)."""
        names, senses = _objectives(objective or DEFAULT_OBJECTIVES)
        summaries = [read_summary(r) for r in runs]
        title = "Pareto front" if len(names) > 1 else f"best on {names[0]}"
        out.print(front_table(title, [str(r) for r in runs], summaries, names, senses))

    @app.command()
    def knee(
        file: Annotated[Path, typer.Argument(help="scenario file", metavar="FILE")],
        low: Annotated[
            float,
            typer.Option(help="load multiplier that must meet the SLOs", metavar="X", min=0.0001),
        ] = 0.25,
        high: Annotated[
            float, typer.Option(help="load multiplier that must miss them", metavar="X")
        ] = 8.0,
        attainment: Annotated[
            float,
            typer.Option(
                min=0, max=1, help="SLO attainment every class must reach (0-1)", metavar="FRAC"
            ),
        ] = 0.99,
        tolerance: Annotated[
            float,
            typer.Option(min=0.001, help="relative precision of the answer", metavar="FRAC"),
        ] = 0.05,
        overrides: Annotated[
            list[str] | None, typer.Option("--set", help=SET_HELP, metavar="PATH=VALUE")
        ] = None,
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out", help="directory (default: reports/knee-<file>-<UTC time>/)", metavar="DIR"
            ),
        ] = None,
        ray: RAY = None,
        ray_resource: RAY_RESOURCE = None,
    ) -> None:
        """The highest load (a multiple of the scenario's rates) at which every class with an
        SLO still reaches `attainment`, found by bisection.

        The answer is then verified: run again (next seed) and one --tolerance step above. If
        attainment does not fall steadily with load, the output and knee.json say so. With
        --ray, each load is a Ray task (one at a time: each step depends on the last)."""
        if high <= low:
            raise UsageFailure(f"--high {high:g}: must be above --low {low:g}")
        raw, scn0 = scenario_with(file, overrides, "--set")
        from fairbench.decide.points import PointJob, PointsFailed
        from fairbench.decide.sweep import scale_load, search_knee  # after the checks
        from fairbench.report import write_run_report
        from fairbench.run import write_json

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"knee-{file.stem}-{stamp}"
        if (base / "knee.json").exists() or any(base.glob("00-x*")):
            raise UsageFailure(f"--out {base} already holds a knee search; choose a new directory")
        runner = point_runner(ray, ray_resource)
        seen: dict[float, int] = {}
        details: list[dict[str, Any]] = []

        def holds(factor: float) -> bool:
            repeat = seen.get(factor, 0)
            seen[factor] = repeat + 1
            seed = scn0.run.seed + repeat  # a re-check is an independent run, not a replay
            data = scale_load(raw, factor)
            scn = parse_scenario(data, str(file), file.parent)
            run_out = base / f"{len(details):02d}-x{factor:.4g}"
            label = f"load x{factor:.4g} (seed {seed})"
            job = PointJob(label, data, str(file), str(run_out), seed, write_run_report)
            (point,) = runner.run([job])
            if point.failed:
                raise PointsFailed.of([point])
            summary = point.summary
            with_slo = [c for c, slo in scn.slo_classes.items() if slo.ttft or slo.tpot or slo.e2e]
            got = {c: summary["slo_classes"].get(c, {}).get("slo_attainment") for c in with_slo}
            ok = summary["valid"] and all(g is None or g >= attainment for g in got.values())
            details.append(
                {
                    "load": factor,
                    "seed": seed,
                    "held": ok,
                    "valid": summary["valid"],
                    "attainment": got,
                    "run_dir": str(run_out),
                }
            )
            shown = ", ".join(f"{c} {'-' if g is None else f'{g:.2%}'}" for c, g in got.items())
            err.print(
                f"load x{factor:.4g} (seed {seed}): {'holds' if ok else 'misses'} ({shown})",
                markup=False,
                highlight=False,
            )
            return ok

        with runner:
            try:
                result = search_knee(holds, low, high, tolerance)
            except PointsFailed as failure:  # the loads that ran keep their run directories
                base.mkdir(parents=True, exist_ok=True)
                write_json(
                    base / "knee.json", {"knee": None, "error": failure.lines[0], "trail": details}
                )
                raise points_failed(failure) from None
        for row, role in zip(details, result.roles, strict=True):
            row["role"] = role
        write_json(
            base / "knee.json",
            {
                "knee": result.best,
                "monotone": result.monotone,
                "verified": result.verified,
                "highest_held": result.highest_held,
                "note": result.note,
                "attainment": attainment,
                "tolerance": tolerance,
                "trail": details,
            },
        )
        if result.note:
            err.print(f"warning: {result.note}", markup=False, highlight=False)
        if result.best is None:
            out.print(
                f"even x{low:g} misses the SLOs; lower --low (results in {base})",
                markup=False,
                highlight=False,
            )
            return
        if result.best == high and result.monotone:
            out.print(
                f"knee: above x{high:g} of {file.name}: --high still meets every SLO at "
                f"{attainment:.0%}; raise --high (results in {base})",
                markup=False,
                highlight=False,
            )
            return
        checked = (
            "verified by a second run and one step above"
            if result.verified
            else "NOT verified (see the warning)"
        )
        out.print(
            f"knee: load x{result.best:.3g} of {file.name} meets every SLO at "
            f"{attainment:.0%}, {checked}; results in {base}",
            markup=False,
            highlight=False,
        )


def register_gate(app: typer.Typer) -> None:
    @app.command()
    def gate(
        candidate: Annotated[
            Path, typer.Option(help="candidate run directory or summary.json", metavar="RUN")
        ],
        rules: Annotated[Path, typer.Option(help="rules file (YAML)", metavar="FILE")],
        baseline: Annotated[
            list[Path] | None,
            typer.Option(
                help="baseline run directory, summary.json or directory of summaries; repeat "
                "for replicated runs (relative rules need 3 or more)",
                metavar="RUN",
            ),
        ] = None,
        junit: Annotated[
            Path | None, typer.Option(help="write JUnit XML here", metavar="FILE")
        ] = None,
        markdown: Annotated[
            Path | None,
            typer.Option(help="append Markdown here (e.g. $GITHUB_STEP_SUMMARY)", metavar="FILE"),
        ] = None,
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
            load_baselines,
            load_rules,
            load_summary,
        )

        try:
            rule_list = load_rules(rules)
            cand = load_summary(candidate)
            base = load_baselines(baseline) if baseline else None
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


HISTORY_METRICS = ["ttft_p99", "goodput", "jain_backlogged", "service_difference"]


def register_report(app: typer.Typer) -> None:
    @app.command()
    def report(
        runs: Annotated[
            list[Path] | None, typer.Argument(help="run directories", metavar="RUN")
        ] = None,
        compare_runs: Annotated[
            bool, typer.Option("--compare", help="RUNS are A B: write the A/B document")
        ] = False,
        quarterly: Annotated[
            bool, typer.Option("--quarterly", help="the A/B document from --a/--b runs")
        ] = False,
        a: Annotated[
            list[Path] | None,
            typer.Option("--a", help="an A run for --quarterly (repeat)", metavar="RUN"),
        ] = None,
        b: Annotated[
            list[Path] | None,
            typer.Option("--b", help="a B run for --quarterly (repeat)", metavar="RUN"),
        ] = None,
        history: Annotated[
            bool, typer.Option("--history", help="RUNS over time, with step detection")
        ] = False,
        metric: Annotated[
            list[str] | None,
            typer.Option(
                help=f"a metric for --history (repeat; default {' '.join(HISTORY_METRICS)})",
                metavar="NAME",
            ),
        ] = None,
        out_file: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="the page (default reports/history.html or reports/ab-report.html)",
                metavar="FILE",
            ),
        ] = None,
    ) -> None:
        """Write HTML reports (offline, self-contained): per run, an A/B document, or history."""
        runs = list(runs or [])
        if sum((compare_runs, quarterly, history)) > 1:
            raise UsageFailure("report: give one of --compare, --quarterly, --history")
        if history:
            if not runs:
                raise UsageFailure("report --history: give the run directories to chart")
            from fairbench.analysis.registry import MetricError, parse_name

            for name in metric or []:
                try:
                    parse_name(name)
                except MetricError as error:
                    raise UsageFailure(f"--metric {name!r}: {error}") from None
            summaries = [read_summary(r) for r in runs]
            from fairbench.report import history_report

            started = [_started_at(r) for r in runs]
            order = sorted(range(len(runs)), key=lambda k: started[k])
            page = history_report(
                [summaries[k] for k in order],
                [runs[k].name for k in order],
                metric or HISTORY_METRICS,
            )
            target = out_file or Path("reports") / "history.html"
        elif compare_runs or quarterly:
            if compare_runs and len(runs) != 2:
                raise UsageFailure(f"report --compare: give two runs (A B), got {len(runs)}")
            a_dirs = list(a or []) + ([runs[0]] if compare_runs else [])
            b_dirs = list(b or []) + ([runs[1]] if compare_runs else [])
            if not a_dirs or not b_dirs:
                raise UsageFailure("report --quarterly: give --a RUN and --b RUN (repeat)")
            a_dirs, b_dirs = _compared_dirs(a_dirs), _compared_dirs(b_dirs)
            from fairbench.decide.compare import CompareRefused, compare_dirs
            from fairbench.report import comparison_report

            try:
                comparison = compare_dirs(a_dirs, b_dirs)
            except CompareRefused as error:
                raise UsageFailure(f"cannot compare: {error}") from None
            changed = _what_changed(a_dirs[0], b_dirs[0])
            target = out_file or Path("reports") / "ab-report.html"
            page = comparison_report(
                comparison, a_dirs, b_dirs, "Scheduler A/B report", changed, target.parent
            )
        else:
            if not runs:
                raise UsageFailure("report: give run directories (or --compare, --history)")
            for run in runs:
                run_dir(run, "summary.json", "records.parquet", "scenario.yaml")
            from fairbench.report import write_run_report

            for run in runs:
                write_run_report(run)
                out.print(
                    f"wrote {run / 'report.html'} and {run / 'summary.md'}",
                    markup=False,
                    highlight=False,
                )
            return
        from fairbench.report import write_page

        write_page(target, page)
        out.print(f"wrote {target}", markup=False, highlight=False)


def _started_at(run: Path) -> str:
    """When a run started (its run.json), for ordering a history; '' when it is not recorded."""
    try:
        meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(meta.get("started_at", "")) if isinstance(meta, dict) else ""


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
