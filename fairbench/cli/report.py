"""`fairbench report`: HTML pages from run directories — each run's report, the A/B document
of paired runs, or a history of runs with step detection.

The command checks its arguments, calls `fairbench.report` (`write_run_report`, or
`documents.history_page` / `documents.ab_page` and `write_page`) and prints what it wrote.
Imports `cli.common`, `cli.inputs` and, lazily, `analysis.registry` (to check --metric),
`decide.compare` (its refusal) and `report`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fairbench.cli.common import compared_dirs, out
from fairbench.cli.inputs import UsageFailure, read_summary, run_dir

HISTORY_METRICS = ["ttft_p99", "goodput", "jain_backlogged", "service_difference"]


def register(app: typer.Typer) -> None:
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
            from fairbench.report.documents import history_page

            page = history_page(runs, summaries, metric or HISTORY_METRICS)
            target = out_file or Path("reports") / "history.html"
        elif compare_runs or quarterly:
            if compare_runs and len(runs) != 2:
                raise UsageFailure(f"report --compare: give two runs (A B), got {len(runs)}")
            a_dirs = list(a or []) + ([runs[0]] if compare_runs else [])
            b_dirs = list(b or []) + ([runs[1]] if compare_runs else [])
            if not a_dirs or not b_dirs:
                raise UsageFailure("report --quarterly: give --a RUN and --b RUN (repeat)")
            a_dirs, b_dirs = compared_dirs(a_dirs), compared_dirs(b_dirs)
            from fairbench.decide.compare import CompareRefused
            from fairbench.report.documents import ab_page

            target = out_file or Path("reports") / "ab-report.html"
            try:
                page = ab_page(a_dirs, b_dirs, target)
            except CompareRefused as error:
                raise UsageFailure(f"cannot compare: {error}") from None
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
