"""`fairbench compare` and `fairbench ab`: paired A/B verdicts, of runs given or of runs made.

The commands parse flags, call `fairbench.decide.ab` (which runs the pairs, stops them and
writes comparison.json) and print the verdict table (`report.terminal.verdict_table`). Imports
`cli.common`, `cli.inputs` and, lazily, `decide` and `report` (the run report each run gets,
the table).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fairbench.cli.common import (
    CONFIDENCE,
    RAY,
    RAY_RESOURCE,
    RESAMPLES,
    compared_dirs,
    err,
    out,
    point_runner,
    points_bar,
    points_failed,
)
from fairbench.cli.inputs import UsageFailure, confidence_level, read_document, scenario_with

if TYPE_CHECKING:
    from fairbench.decide.points import PointResult


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
        a_dirs, b_dirs = compared_dirs(a_dirs), compared_dirs(b_dirs)
        change = None if detect is None else detect_change(detect, None, len(a_dirs))
        from fairbench.decide.ab import (  # after the checks
            COMPARE_ADVICE,
            ABRefused,
            compare_payload,
            compare_runs,
            design_note,
        )
        from fairbench.decide.compare import CompareRefused

        try:
            # the block bootstrap's draws on a terminal's bar: 0.5-0.8 CPU s each for two
            # 10-minute fleet runs (1.9M requests each), 10-14 minutes for the default 1,000
            with points_bar("bootstrap draws") as (_, advance):
                comparison, found = compare_runs(
                    a_dirs, b_dirs, resamples, level, metric, change, progress=advance
                )
        except CompareRefused as error:
            raise UsageFailure(f"cannot compare: {error}") from None
        except ABRefused as error:
            raise UsageFailure(str(error)) from None
        note = design_note(comparison, COMPARE_ADVICE)
        if as_json:
            payload = compare_payload(comparison, note, level, found)
            sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        else:
            from fairbench.report.terminal import verdict_table

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
        from fairbench.decide.ab import (
            AB_ADVICE,
            ABDesign,
            ABFailed,
            ABRefused,
            check_metric,
            check_same_plan,
            design_note,
            run_ab,
            write_ab,
        )
        from fairbench.decide.points import PointsFailed
        from fairbench.report import write_run_report

        try:
            check_same_plan(arms, a, b)
            width = None if precision is None else precision / 100
            change = None if detect is None else detect_change(detect, width, iterations)
            if width is not None or change is not None:
                check_metric(arms["A"], metric)
        except ABRefused as error:
            raise UsageFailure(str(error)) from None
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"ab-{arms['A'].name}-{stamp}"
        if (base / "comparison.json").exists() or (base / "A-0").exists():
            raise UsageFailure(f"--out {base} already holds an A/B; choose a new directory")
        runner = point_runner(ray, ray_resource)
        design = ABDesign(iterations, max_iterations, metric, width, change)
        with runner, points_bar(f"A/B of {file.name}") as (console, advance):

            def done(result: PointResult, finished: int, total: int) -> None:
                advance(finished, total)
                if not result.failed:
                    state = "VALID" if result.valid else "INVALID"
                    line = f"{result.job.label}: {state} -> {result.job.out}"
                    console.print(line, markup=False, highlight=False)

            try:
                outcome = run_ab(
                    file, docs, arms, design, base, runner, write_run_report, done, resamples, level
                )
            except PointsFailed as failure:  # the runs that finished stay in --out
                raise points_failed(failure) from None
            except ABFailed as error:
                err.print(str(error), markup=False, highlight=False)
                raise typer.Exit(1) from None  # a measured failure: an arm ran INVALID
        note = design_note(outcome.comparison, AB_ADVICE)
        write_ab(base, outcome, note, level)
        title = f"B ({' '.join(b)}) vs A ({' '.join(a)})"
        from fairbench.report.terminal import verdict_table

        out.print(verdict_table(outcome.comparison, title, level, note))
        out.print(f"{outcome.stopped}; comparison.json in {base}", markup=False, highlight=False)
