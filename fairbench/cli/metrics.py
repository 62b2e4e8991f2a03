"""`fairbench metrics`: the metric registry, as a table or as the Markdown of docs/metrics.md."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer) -> None:
    @app.command(name="metrics")
    def metrics(
        markdown: Annotated[
            bool, typer.Option("--markdown", help="print docs/metrics.md (generated) instead")
        ] = False,
    ) -> None:
        """List every metric: name, unit, direction, groups and definition."""
        from fairbench.analysis import registry  # pandas, scipy: for this command only

        if markdown:
            sys.stdout.write(registry.reference_markdown() + "\n")
            return
        table = Table(title="fairbench metrics (headline ones marked *)", title_justify="left")
        for col in ("name", "unit", "better", "groups", "definition"):
            table.add_column(col, overflow="fold")
        for m in registry.METRICS:
            table.add_row(
                m.name + (" *" if m.headline else ""),
                m.unit,
                m.better,
                ", ".join(m.groups),
                m.formula,
            )
        Console(width=None if sys.stdout.isatty() else 160).print(table)
