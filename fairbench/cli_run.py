"""`fairbench run`: registered on the app by `fairbench.cli.main`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    del app
