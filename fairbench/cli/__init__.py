"""The `fairbench` command: thin typer commands that parse, call, and print.

`main` holds the app and the plan/validate/schema commands, `run` the main job, `analysis`
compare, ab, sweep, pareto, knee, gate and report. Nothing here computes a figure. Nothing
imports it but the console script and `python -m fairbench.cli`.
"""

from fairbench.cli.main import app, main

__all__ = ["app", "main"]
