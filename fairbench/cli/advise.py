"""`fairbench advise`: a scheduler configuration for a scenario's SLOs, searched in simulation
and verified on seeds the search never saw (docs/advise.md).

The command parses flags, calls `fairbench.decide.advise.advise`, writes the page and prints a
table; a search that finds nothing, or input it cannot advise on, is one line and exit 2.
Imports `cli.common`, `cli.inputs` and, lazily, `decide.advise` and `report.advice`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from fairbench.cli.common import err, out, points_bar, points_failed
from fairbench.cli.inputs import SET_HELP, UsageFailure, scenario_with


def _table(doc: dict[str, Any]) -> Table:
    """The verification: each configuration's attainment per target with its interval."""
    seeds = doc["verify_seeds"]
    table = Table(
        title=f"verification on seeds {seeds[0]}-{seeds[-1]} (mean [{doc['confidence']:.0%} "
        "interval], Student t over the seeds; its measured coverage: docs/advise.md)",
        title_justify="left",
    )
    table.add_column("configuration")
    targets = doc["targets"]
    for t in targets:
        table.add_column(f"{t['class']} (needs {t['needs']:.0%})", justify="right")
    table.add_column("gain over own", justify="right")
    table.add_column("meets")
    rec = (doc.get("recommendation") or {}).get("label")

    def cell(e: dict[str, Any]) -> str:
        mean = e.get("mean")
        text = "-" if mean is None else f"{mean:.1%}"
        if e.get("ci_low") is not None and e.get("ci_high") is not None:
            text += f" [{e['ci_low']:.1%}, {e['ci_high']:.1%}]"
        elif mean is not None:
            text += " (no interval)"  # the reason is in advice.json and on the page
        return text

    for v in doc["verification"]:
        gains = ", ".join(
            f"{c} {g['mean']:+.1%}" for c, g in v["gain"].items() if g.get("mean") is not None
        )
        table.add_row(
            v["label"] + (" *" if v["label"] == rec else ""),
            *(cell(v["attainment"][t["class"]]) for t in targets),
            gains or "-",
            "yes" if v["meets"] else "no",
            style="bold" if v["label"] == rec else None,
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command()
    def advise(
        file: Annotated[Path, typer.Argument(help="scenario file", metavar="SCENARIO")],
        trace: Annotated[
            Path | None,
            typer.Option(
                help="replay this trace file instead of the scenario's one trace", metavar="T"
            ),
        ] = None,
        budget: Annotated[
            int,
            typer.Option(
                min=1, max=10_000, help="trials of the search (simulated runs)", metavar="N"
            ),
        ] = 40,
        objective: Annotated[
            list[str] | None,
            typer.Option(
                help="NAME:max or NAME:min (repeat) for the Pareto front; default each SLO "
                "class's slo_attainment, goodput:max, jain_backlogged:max",
                metavar="NAME:SENSE",
            ),
        ] = None,
        seed: Annotated[
            int | None,
            typer.Option(
                help="search seed (plan and sampler); default run.seed", metavar="S", min=0
            ),
        ] = None,
        verify: Annotated[
            int,
            typer.Option(min=2, max=1000, help="verification seeds: S+1000 onwards", metavar="K"),
        ] = 5,
        top: Annotated[
            int, typer.Option(min=1, max=100, help="front candidates to verify", metavar="K")
        ] = 3,
        attainment: Annotated[
            float | None,
            typer.Option(
                min=0.0,
                max=1.0,
                help="SLO attainment every class must reach (0-1); default each class's "
                "percentile / 100",
                metavar="FRAC",
            ),
        ] = None,
        parallel: Annotated[
            int,
            typer.Option(min=1, max=256, help="simulations run at once (processes)", metavar="N"),
        ] = 1,
        overrides: Annotated[
            list[str] | None, typer.Option("--set", help=SET_HELP, metavar="PATH=VALUE")
        ] = None,
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="directory (default: reports/advise-<file>-<UTC time>/)",
                metavar="DIR",
            ),
        ] = None,
    ) -> None:
        """Search scheduler configurations in simulation for the scenario's SLOs, verify the
        best on seeds the search did not see, and write DIR/advice.yaml (a scheduler: block),
        advice.json and advice.html.

        Exit 2, with one line naming the constraint that binds, when no configuration meets
        the SLOs."""
        if not file.is_file():
            raise UsageFailure(f"{file}: no such scenario file")
        raw, scn = scenario_with(file, overrides, "--set")
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        base = out_dir or Path("reports") / f"advise-{file.stem}-{stamp}"
        if (base / "advice.json").exists() or (base / "search").exists():
            raise UsageFailure(
                f"--out {base} already holds an advice search; choose a new directory"
            )
        from fairbench.decide.advise import AdviceRefused, Ask
        from fairbench.decide.advise import advise as run_advice
        from fairbench.decide.points import LocalRunner, PointsFailed

        ask = Ask(
            budget=budget,
            seed=seed,
            verify=verify,
            top=top,
            attainment=attainment,
            objectives=tuple(objective) if objective else None,
            parallel=parallel,
            overrides=tuple(overrides or ()),
        )
        try:
            with points_bar(f"advise {file.name}") as (console, advance):

                def progress(phase: str, done: int, total: int) -> None:
                    advance(done, total)
                    if done == 0 and err.is_terminal:  # a refusal in a log stays one line
                        console.print(f"{phase}: {total} runs", markup=False, highlight=False)

                result = run_advice(file, raw, scn, ask, base, LocalRunner(), progress, trace)
        except AdviceRefused as error:
            raise UsageFailure(str(error)) from None
        except PointsFailed as failure:
            raise points_failed(failure) from None
        from fairbench.decide.advise.outputs import read_advice, run_command
        from fairbench.report.advice import advice_report
        from fairbench.report.html import write_page

        doc = read_advice(base)
        write_page(base / "advice.html", advice_report(doc))
        if result.refused:
            err.print(result.refused, markup=False, highlight=False)
            raise typer.Exit(2)

        out.print(_table(doc))
        p = result.problem
        out.print(f"simulated on profile {p.profile}; {p.fidelity}", markup=False, highlight=False)
        rec = result.recommendation
        assert rec is not None
        what = "keep the scenario's own configuration" if rec.own else f"use {rec.label}"
        sure = "every interval clears its target" if rec.confident else "on average over the seeds"
        out.print(f"advice: {what} (meets every SLO, {sure})", markup=False, highlight=False)
        out.print(f"run it: {run_command(result)}", markup=False, highlight=False, soft_wrap=True)
        out.print(
            f"advice.yaml, advice.json and advice.html in {base} (search {result.elapsed_s:.1f} s)",
            markup=False,
            highlight=False,
        )
