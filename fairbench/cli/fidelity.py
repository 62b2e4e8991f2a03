"""`fairbench fidelity` and `fairbench profile`: the simulator's calibration loop.

`profile` fits a cost profile from a live engine (fairbench.targets.profile, its files in
`targets.profile.files`); `fidelity` measures how far a simulated run of a plan is from a real
run of it (fairbench.report.fidelity_outputs: the measurement of decide.fidelity and its
files); `fairbench run --simulate PROFILE` closes the loop on one live run (its twin scenario
is workload/twin.py's, its run report/twin.py's). The commands parse flags, call one of those
and print. Kept apart from `analysis` so the commands of the loop read together. Registered on
the app by `fairbench.cli.main.main`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fairbench.cli import profile as cli_profile
from fairbench.cli.inputs import UsageFailure

out = Console(width=None if sys.stdout.isatty() else 160)


def register(app: typer.Typer) -> None:
    @app.command()
    def fidelity(
        real: Annotated[Path, typer.Argument(help="the real run's directory", metavar="REAL_RUN")],
        sim: Annotated[
            Path, typer.Argument(help="the simulated run of the same plan", metavar="SIM_RUN")
        ],
        noise: Annotated[
            Path | None,
            typer.Option(
                "--noise",
                help="a second real run of the same plan: the run-to-run noise floor",
                metavar="RUN2",
            ),
        ] = None,
        factor: Annotated[
            float,
            typer.Option(
                "--noise-factor",
                min=0.0,
                help="an error is within noise when |error| <= FACTOR x the noise floor",
                metavar="FACTOR",
            ),
        ] = 1.0,
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="write fidelity.json, fidelity.md and fidelity.html here (default SIM_RUN)",
                metavar="DIR",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
    ) -> None:
        """How far a simulated run is from a real run of the same plan, per tenant and class."""
        from fairbench.decide.fidelity import FidelityRefused
        from fairbench.report.fidelity_outputs import mape_line, measure_fidelity

        try:
            fid, written = measure_fidelity(real, sim, noise, factor, out_dir)
        except FidelityRefused as error:
            raise UsageFailure(f"cannot measure fidelity: {error}") from None
        if as_json:
            sys.stdout.write(json.dumps(fid.as_dict(), indent=2) + "\n")
            return
        from fairbench.report.fidelity import fidelity_table

        out.print(fidelity_table(fid))
        out.print(mape_line(fid), markup=False, highlight=False)
        out.print("wrote " + ", ".join(str(p) for p in written), markup=False, highlight=False)

    cli_profile.register(app)
