"""`fairbench sweep`, `pareto` and `knee`: runs over a grid or a load range, ranked on
objectives or bisected to the highest load that meets the SLOs.

The commands parse flags, call `fairbench.decide` (`sweep.run_sweep`, `knee_run.run_knee`)
and print (`report.terminal.front_table`: the objectives and the front). Imports `cli.common`,
`cli.inputs` and, lazily, `decide` and `report`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from fairbench.cli.common import (
    RAY,
    RAY_RESOURCE,
    err,
    out,
    point_runner,
    points_bar,
    points_failed,
)
from fairbench.cli.inputs import SET_HELP, UsageFailure, read_summary, scenario_with
from fairbench.workload.errors import ScenarioError

OBJECTIVE = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME:max or NAME:min (repeat; default goodput:max ttft_p99:min "
        "jain_slowdown:max). One objective ranks the points (best marked); two or more give "
        "the Pareto front",
        metavar="NAME:SENSE",
    ),
]


def _objectives(specs: list[str] | None) -> tuple[list[str], list[str]]:
    """--objective specs (default: DEFAULT_OBJECTIVES), checked before anything runs."""
    from fairbench.decide.objectives import DEFAULT_OBJECTIVES, ObjectiveError, parse_objectives

    try:
        return parse_objectives(specs or DEFAULT_OBJECTIVES)
    except ObjectiveError as error:
        raise UsageFailure(str(error)) from None


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
    from fairbench.report.terminal import front_table

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


def _knee_answer(
    result: Any, file: Path, low: float, high: float, attainment: float, base: Path
) -> str:
    """The knee search's one line: the knee and whether it was verified, or which bound to move."""
    if result.best is None:
        return f"even x{low:g} misses the SLOs; lower --low (results in {base})"
    if result.best == high and result.monotone:
        return (
            f"knee: above x{high:g} of {file.name}: --high still meets every SLO at "
            f"{attainment:.0%}; raise --high (results in {base})"
        )
    checked = (
        "verified by a second run and one step above"
        if result.verified
        else "NOT verified (see the warning)"
    )
    return (
        f"knee: load x{result.best:.3g} of {file.name} meets every SLO at "
        f"{attainment:.0%}, {checked}; results in {base}"
    )


def register(app: typer.Typer) -> None:
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
        names, senses = _objectives(objective)
        _scenario_file(file, "sweep file")
        from fairbench.decide.objectives import point_labels
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
        labels = point_labels(rows)
        if failed:
            _show_failed_sweep(file, base, rows, labels, names, senses, failed)
        from fairbench.report.terminal import front_table

        out.print(
            front_table(f"sweep of {file}", labels, [r["summary"] for r in rows], names, senses)
        )
        if len(names) < 2:
            out.print(f"results in {base} (report.html needs two objectives)", markup=False)
            return
        from fairbench.report.documents import write_sweep_page

        write_sweep_page(base, rows, labels, names, senses)
        out.print(f"results and report.html in {base}", markup=False, highlight=False)

    @app.command()
    def pareto(
        runs: Annotated[list[Path], typer.Argument(help="run directories", metavar="RUN")],
        objective: OBJECTIVE = None,
    ) -> None:
        """The non-dominated runs on the chosen objectives (dominated ones shown dimmed)."""
        names, senses = _objectives(objective)
        summaries = [read_summary(r) for r in runs]
        title = "Pareto front" if len(names) > 1 else f"best on {names[0]}"
        from fairbench.report.terminal import front_table

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
        from fairbench.decide.knee_run import KneeAsk, run_knee  # after the checks
        from fairbench.decide.points import PointsFailed
        from fairbench.report import write_run_report

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"knee-{file.stem}-{stamp}"
        if (base / "knee.json").exists() or any(base.glob("00-x*")):
            raise UsageFailure(f"--out {base} already holds a knee search; choose a new directory")
        runner = point_runner(ray, ray_resource)

        def show(line: str) -> None:
            err.print(line, markup=False, highlight=False)

        ask = KneeAsk(low, high, attainment, tolerance)
        with runner:
            try:
                result = run_knee(file, raw, scn0, ask, base, runner, write_run_report, show)
            except PointsFailed as failure:  # the loads that ran keep their run directories
                raise points_failed(failure) from None
        if result.note:
            err.print(f"warning: {result.note}", markup=False, highlight=False)
        answer = _knee_answer(result, file, low, high, attainment, base)
        out.print(answer, markup=False, highlight=False)
