"""The commands that decide across runs, registered on the app by `fairbench.cli.main.main`:
`compare` and `ab` (cli/compare.py), `sweep`, `pareto` and `knee` (cli/sweeps.py), `gate`
(cli/gate.py) and `report` (cli/report.py).

It exists so that main.py registers them in one place while each command module stays small;
it imports only those modules.
"""

from __future__ import annotations

import typer

from fairbench.cli import compare as cli_compare
from fairbench.cli import gate as cli_gate
from fairbench.cli import report as cli_report
from fairbench.cli import sweeps as cli_sweeps


def register(app: typer.Typer) -> None:
    """`compare` and `ab`."""
    cli_compare.register(app)


def register_sweeps(app: typer.Typer) -> None:
    """`sweep`, `pareto` and `knee`."""
    cli_sweeps.register(app)


def register_gate(app: typer.Typer) -> None:
    """`gate`."""
    cli_gate.register(app)


def register_report(app: typer.Typer) -> None:
    """`report`."""
    cli_report.register(app)
