"""The `fairbench` command: thin typer commands that parse, call, and print.

`main` holds the app and the plan/validate/schema commands, `run` the main job, `analysis`
compare, ab, sweep, pareto, knee, gate and report, and `inputs` what they all read from the
command line (scenarios with `--a`/`--b`/`--set` overrides, run directories, `--confidence`),
refusing bad input in one line. Nothing here computes a figure. Nothing
imports it but the console script and `python -m fairbench.cli`.
"""

from fairbench.cli.main import app, main

__all__ = ["app", "main"]
