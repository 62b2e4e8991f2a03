"""`fairbench run`: the main job. Registered on the app by `fairbench.cli.main.main`.

With `--simulate PROFILE`, a live run is followed by its simulation: the same plan in virtual
time on the profile (fairbench.cli.simulate.simulated_scenario says which engine mode and
policy), written under RUN/sim/, and the fidelity files `fairbench fidelity RUN RUN/sim` writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fairbench.cli.inputs import SET_HELP, scenario_with

if TYPE_CHECKING:
    from fairbench.cli.simulate import Simulation
    from fairbench.run.executor import LiveCounters

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get full rows


def _ms(value: float | None) -> str:
    return "-" if value is None else (f"{value:.0f}" if value >= 100 else f"{value:.1f}")


def results_table(summary: dict[str, Any]) -> Table:
    """One row per group; latency in ms from the intended send time, p50/p99."""
    from fairbench.report.markdown import window_note

    note = window_note(summary)
    table = Table(
        title="latency ms (from intended send) p50/p90/p99" + (f"; {note}" if note else ""),
        title_justify="left",
    )
    for col in ("group", "ok/err/t-o/rej/cx", "TTFT", "TPOT", "ITL max", "E2E", "req/s", "SLO"):
        table.add_column(col, justify="left" if col == "group" else "right", no_wrap=True)
    rows = [("overall", summary["overall"])]
    rows += [(f"tenant {k}", v) for k, v in summary["tenants"].items()]
    rows += [(f"class {k}", v) for k, v in summary["slo_classes"].items()]
    for name, block in rows:
        c = block["counts"]
        lat = block["latency_ms"]
        att = block["slo_attainment"]
        table.add_row(
            name,
            f"{c['ok']}/{c['error']}/{c['timeout']}/{c['rejected']}/{c['cancelled']}",
            *(
                "/".join(
                    ("≥" if p in (lat[k].get("lower_bound") or []) else "") + _ms(lat[k].get(p))
                    for p in ("p50", "p90", "p99")
                )
                for k in ("ttft", "tpot", "itl_max", "e2e")
            ),
            f"{block['throughput']['requests_per_s'] or 0:.1f}",
            "-" if att is None else f"{att:.0%}",
        )
    return table


def verdict_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    if summary["valid"]:
        lines.append("[bold green]VALID[/]")
    else:
        lines.append("[bold red]INVALID[/]")
        lines += [f"  [red]- {reason}[/]" for reason in summary["invalid_reasons"]]
    health = summary["generator_health"]
    lag = health["send_lag_ms"]
    if summary.get("closed_loop"):
        cap = health["closed_loop"]["concurrency_cap"]
        lines.append(
            f"[bold yellow]CLOSED LOOP[/]: at most {cap} requests in flight; send lag is "
            "the wait for a slot, and arrivals were not open-loop"
        )
    if health.get("virtual_time"):
        lines.append("generator: virtual time (simulated; no send lag)")
    else:
        lines.append(
            f"generator send lag p50/p99/max: {_ms(lag.get('p50'))}/"
            f"{_ms(lag.get('p99'))}/{_ms(lag.get('max'))} ms "
            f"(threshold p99 {health['send_lag_threshold_ms']:g} ms)"
        )
        delay, error = health.get("receive_delay_ms"), health.get("receive_error_ms")
        if delay and error:
            lines.append(
                f"generator receive delay p50/p99/max: {_ms(delay.get('p50'))}/"
                f"{_ms(delay.get('p99'))}/{_ms(delay.get('max'))} ms, kernel-stamped; its effect "
                f"on first-token stamps p99 {_ms(error.get('p99'))} ms "
                f"(threshold {health['receive_error_threshold_ms']:g} ms)"
            )
        else:
            lines.append("generator receive delay: not measured (no kernel receive stamps)")
    lines += [f"[yellow]warning: {w}[/]" for w in summary.get("warnings", [])]
    lines.append(f"accounting: {summary['accounting']['line']}")
    comp = summary.get("completion")
    if comp and not comp["ok"]:
        lines.append(
            f"[bold yellow]TAIL CENSORED[/]: {comp['line']}: percentiles marked ≥ are lower bounds"
        )
    elif comp and comp["unfinished"]:
        lines.append(f"unfinished: {comp['line']}")
    from fairbench.report.markdown import fairness_line

    lines.append(fairness_line(summary).rstrip("."))
    return lines


def _ended_early(run_dir: Path) -> int:
    """How many ok live requests produced fewer tokens than they asked for."""
    import pandas as pd

    records = pd.read_parquet(run_dir / "records.parquet", columns=["status", "output_tokens",
                                                                      "max_tokens"])  # fmt: skip
    ok = records[records["status"] == "ok"]
    return int((ok["output_tokens"] < ok["max_tokens"]).sum())


class SimulationMismatch(Exception):
    """The simulated twin replayed another plan than the live run (never expected: the digests
    are compared before the live run starts); exit 1."""


def simulate_and_compare(
    run_dir: Path, summary: dict[str, Any], twin: Simulation, seed: int | None, quiet: bool
) -> list[str]:
    """Simulate the live run's plan into RUN/sim/ and write the fidelity files there, as
    `fairbench fidelity RUN RUN/sim` does; the headline lines to print. The live run's verdict
    stays the exit code: a simulation that cannot be compared says why in a line."""
    from fairbench.decide.fidelity import FidelityRefused
    from fairbench.pipeline import run_scenario
    from fairbench.report import write_run_report
    from fairbench.report.fidelity_outputs import mape_line, measure_fidelity
    from fairbench.run import RunOptions

    sim_dir = run_dir / "sim"
    if not quiet:
        console.print(f"simulating the same plan: {twin.line}", markup=False, highlight=False)
    sim = run_scenario(twin.scn, RunOptions(out=sim_dir, seed=seed, workers=1))
    write_run_report(sim.run_dir)
    digest = str(sim.summary.get("plan_digest", ""))
    if digest != summary.get("plan_digest"):  # checked before the live run: this is a bug
        raise SimulationMismatch(
            f"simulated: {sim_dir}: its plan {digest[:19]}… is not the live run's "
            f"{str(summary.get('plan_digest'))[:19]}…; fidelity not measured"
        )
    lines = [f"simulated: {sim_dir} ({twin.line}); plan {digest[:19]}…, the live run's"]
    try:
        fid, written = measure_fidelity(run_dir, sim_dir)
    except FidelityRefused as error:
        return [*lines, f"fidelity not measured: {error}"]
    lines.append(f"fidelity (sim vs live): {mape_line(fid)}")
    short = _ended_early(run_dir)
    if short:
        lines.append(
            f"note: {short} live requests ended before their max_tokens (EOS or a stop; the "
            "engine may not honour ignore_eos), the simulated ones ran to it: output-length "
            "figures differ for that reason, not the simulator's speed"
        )
    lines.append("wrote " + ", ".join(str(p) for p in written))
    return lines


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
        quiet: Annotated[bool, typer.Option("--quiet", help="no progress display")] = False,
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
            TimeElapsedColumn(),
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
                outcome = run_scenario(scn, options, progress)  # FileExistsError: cli.main
            except RuntimeError as error:
                if options.ray is None or not str(error).startswith("--ray"):
                    raise
                console.print(
                    str(error), markup=False, highlight=False, soft_wrap=True
                )  # placement: one line, the flags
                raise typer.Exit(2) from None
            bar.update(task, detail="writing the report")
            write_run_report(outcome.run_dir)
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
        else:
            out.print(results_table(summary))
            from fairbench.report.headline import headline_table

            out.print(headline_table(summary))
            for line in verdict_lines(summary):
                out.print(line, highlight=False)
            out.print(f"run directory: {outcome.run_dir}", markup=False, highlight=False)
        if twin is not None and not outcome.stopped:
            try:
                lines = simulate_and_compare(outcome.run_dir, summary, twin, seed, quiet)
            except SimulationMismatch as error:
                console.print(str(error), markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(1) from None
            for line in lines:  # stdout is the summary's JSON alone with --json
                (console if as_json else out).print(
                    line, markup=False, highlight=False, soft_wrap=True
                )
        if outcome.exit_code:
            raise typer.Exit(outcome.exit_code)
