"""`fairbench run`: the main job. Registered on the app by `fairbench.cli.main.main`.

The command checks its flags, calls `pipeline.run_scenario` with a progress bar, writes the
report (`report.write_run_report`) and prints what `report.terminal` renders. With `--simulate
PROFILE`, a live run is followed by its simulation: the same plan in virtual time on the
profile (fairbench.workload.twin says which engine mode and policy; cli/simulate.py applies
--simulate-set), written
under RUN/sim/ with the fidelity files `fairbench fidelity RUN RUN/sim` writes
(`report.twin.simulate_and_compare`). Imports `cli.inputs`, `cli.simulate` and, lazily, the
library it calls.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fairbench.cli.inputs import SET_HELP, scenario_with

if TYPE_CHECKING:
    from rich.progress import Task
    from rich.text import Text

    from fairbench.run.executor import LiveCounters

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get full rows


class RunElapsed(TimeElapsedColumn):
    """The whole run's elapsed time. Rich's column stops once the count is complete, but the
    summary and the report come after the last request: seconds on a fleet run, with the clock
    frozen at the end of the simulation (issue 35 item 6)."""

    def render(self, task: Task) -> Text:
        from datetime import timedelta

        from rich.text import Text

        elapsed = task.elapsed
        if elapsed is None:
            return Text("-:--:--", style="progress.elapsed")
        return Text(str(timedelta(seconds=max(0, int(elapsed)))), style="progress.elapsed")


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        file: Annotated[Path, typer.Argument(help="scenario file", metavar="FILE")],
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="run directory (default: reports/<scenario>-<UTC time>/)",
                metavar="DIR",
            ),
        ] = None,
        seed: Annotated[int | None, typer.Option(help="override run.seed", metavar="N")] = None,
        overrides: Annotated[
            list[str] | None, typer.Option("--set", help=SET_HELP, metavar="PATH=VALUE")
        ] = None,
        workers: Annotated[
            int | None,
            typer.Option(
                help="generator processes (default: enough for the busiest second, <= cores)",
                metavar="N",
                min=1,
            ),
        ] = None,
        target_url: Annotated[
            str | None, typer.Option(help="override the target's URL", metavar="URL")
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="print summary.json instead of the table")
        ] = False,
        quiet: Annotated[
            bool,
            typer.Option(
                "--quiet",
                help="no progress display and no tables: the run directory, and INVALID or a "
                "warning where there is one",
            ),
        ] = False,
        ray: Annotated[
            str | None,
            typer.Option(
                metavar="ADDRESS",
                help="run the generators as Ray actors: auto (RAY_ADDRESS / `ray start`), "
                "local, or HOST:PORT; --workers actors (docs/ray.md)",
            ),
        ] = None,
        ray_resource: Annotated[
            list[str] | None,
            typer.Option(
                metavar="NAME", help="with --ray: actor k needs one unit of the k-th (cycled)"
            ),
        ] = None,
        simulate: Annotated[
            str | None,
            typer.Option(
                metavar="PROFILE",
                help="after the live run, simulate the same plan on this profile YAML into "
                "RUN/sim/ and measure its fidelity (docs/simulator.md)",
            ),
        ] = None,
        simulate_set: Annotated[
            list[str] | None,
            typer.Option(
                "--simulate-set",
                metavar="PATH=VALUE",
                help="with --simulate: override a field of the simulated scenario only, e.g. "
                "scheduler.policy=priority (repeat)",
            ),
        ] = None,
        history: Annotated[
            Path | None,
            typer.Option(
                metavar="FILE",
                help="add the finished run to this history store (docs/history.md)",
            ),
        ] = None,
    ) -> None:
        """Run a scenario open-loop against its target and write a run directory."""
        doc, scn = scenario_with(file, overrides, "--set")
        twin = None
        if simulate_set and simulate is None:
            console.print("--simulate-set needs --simulate PROFILE", markup=False, soft_wrap=True)
            raise typer.Exit(2)
        if simulate is not None:  # before the live run: a bad profile costs nothing
            from fairbench.cli.simulate import simulated_scenario

            twin = simulated_scenario(doc, scn, file, simulate, simulate_set, seed)
        from fairbench.pipeline import run_scenario  # after the checks: it loads the stack
        from fairbench.report import write_run_report
        from fairbench.run import RunOptions
        from fairbench.run.memory import release_freed_memory

        options = RunOptions(out=out_dir, seed=seed, workers=workers, base_url=target_url)
        if ray_resource and ray is None:
            console.print("--ray-resource needs --ray ADDRESS", markup=False, soft_wrap=True)
            raise typer.Exit(2)
        if ray is not None:
            from fairbench.run.ray_cluster import import_ray

            options.ray, options.ray_resources = ray, tuple(ray_resource or ())
            try:
                import_ray()
            except RuntimeError as error:  # one line: how to install it
                console.print(str(error), markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(2) from None
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            RunElapsed(),
            console=console,
            disable=quiet,
            transient=False,
        ) as bar:
            task = bar.add_task(f"{scn.name}", total=None, detail="planning")

            def progress(c: LiveCounters) -> None:
                line = getattr(c, "line", None)  # a simulation says its own (run.measure)
                bar.update(
                    task,
                    total=c.planned,
                    completed=c.done,
                    detail=line
                    or (
                        f"sent {c.sent} · in flight {c.in_flight} · errors {c.errors} · "
                        f"lag {c.last_lag_ns / 1e6:.2f} ms"
                    ),
                )

            try:
                # FileExistsError: cli.main; the records stay in memory for the report below
                outcome = run_scenario(scn, options, progress, keep_records=True)
            except RuntimeError as error:
                if options.ray is None or not str(error).startswith("--ray"):
                    raise
                console.print(
                    str(error), markup=False, highlight=False, soft_wrap=True
                )  # placement: one line, the flags
                raise typer.Exit(2) from None
            bar.update(task, detail="writing the report")
            write_run_report(outcome.run_dir, outcome.records)
            outcome.records = None  # freed before the history, the twin or the tables
            release_freed_memory()  # and given back: Arrow's pool would keep its pages
            bar.update(task, detail="done")
        summary = outcome.summary
        if history is not None and not outcome.stopped:
            from fairbench.history.errors import HistoryError
            from fairbench.history.rundata import add_runs

            try:
                add_runs(history, [outcome.run_dir])
            except HistoryError as error:  # the run is written; only the add failed
                console.print(str(error), markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(2) from None
        if as_json:
            sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
        elif quiet:  # the run directory, and what makes its figures wrong (report.terminal)
            from fairbench.report.terminal import loud_lines

            for line in loud_lines(summary):
                out.print(line, highlight=False)
            out.print(f"run directory: {outcome.run_dir}", markup=False, highlight=False)
        else:
            from fairbench.report.headline import headline_table
            from fairbench.report.terminal import results_table, verdict_lines

            out.print(results_table(summary))
            out.print(headline_table(summary))
            for line in verdict_lines(summary):
                out.print(line, highlight=False)
            out.print(f"run directory: {outcome.run_dir}", markup=False, highlight=False)
        if twin is not None and not outcome.stopped:
            from fairbench.report.twin import SimulationMismatch, simulate_and_compare

            if not quiet:
                console.print(
                    f"simulating the same plan: {twin.line}", markup=False, highlight=False
                )
            try:
                lines = simulate_and_compare(outcome.run_dir, summary, twin.scn, twin.line, seed)
            except SimulationMismatch as error:
                console.print(str(error), markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(1) from None
            for line in lines:  # stdout is the summary's JSON alone with --json
                (console if as_json else out).print(
                    line, markup=False, highlight=False, soft_wrap=True
                )
        if outcome.exit_code:
            raise typer.Exit(outcome.exit_code)
