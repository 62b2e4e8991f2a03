"""What the commands that decide across runs share: the consoles they print on, the options
they spell the same way (--confidence, --resamples, --ray, --ray-resource), where their
points run, the progress bar, and how failed points are printed.

It exists so that `compare`, `ab`, `sweep`, `knee`, `gate` and `report` (cli/compare.py,
cli/sweeps.py, cli/gate.py, cli/report.py) keep one spelling of each flag. It imports
`cli.inputs` and, lazily, `decide.points`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fairbench.cli.inputs import CONFIDENCE_HELP, UsageFailure, run_dir

if TYPE_CHECKING:
    from fairbench.decide.points import PointRunner, PointsFailed

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)  # one problem, one line, however long

CONFIDENCE = Annotated[str, typer.Option("--confidence", help=CONFIDENCE_HELP, metavar="PCT")]
RESAMPLES = Annotated[
    int, typer.Option("--resamples", min=100, help="bootstrap resamples per metric", metavar="N")
]
RAY = Annotated[
    str | None,
    typer.Option(
        metavar="ADDRESS",
        help="run each point as a Ray task: auto (RAY_ADDRESS / `ray start`), local, or "
        "HOST:PORT (docs/ray.md)",
    ),
]
RAY_RESOURCE = Annotated[
    list[str] | None,
    typer.Option(metavar="NAME", help="with --ray: point k needs one unit of the k-th (cycled)"),
]


def point_runner(ray: str | None, resources: list[str] | None) -> PointRunner:
    """Where the command's points run, chosen once from --ray and --ray-resource: this machine,
    or Ray tasks (a missing ray package, an address where no cluster answers or a resource the
    cluster lacks is one line naming the flag, exit 2)."""
    if resources and ray is None:
        raise UsageFailure("--ray-resource needs --ray ADDRESS")
    from fairbench.decide.points import make_runner
    from fairbench.run.ray_cluster import RaySetupError

    try:
        return make_runner(ray, resources or ())
    except RaySetupError as error:
        raise UsageFailure(str(error)) from None


@contextlib.contextmanager
def points_bar(title: str) -> Iterator[tuple[Console, Callable[[int, int], None]]]:
    """A progress bar on a terminal (points done of all, time), and the console to print each
    point's line on without tearing the bar; `advance(done, total)` moves it."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=False,
    ) as bar:
        task = bar.add_task(title, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield bar.console, advance


def points_failed(error: PointsFailed) -> typer.Exit:
    """Print each failed point's line; the exit to raise (2: bad input, 1: a failed run)."""
    for line in error.lines:
        err.print(line, markup=False, highlight=False)
    return typer.Exit(error.exit_code)


def compared_dirs(paths: list[Path]) -> list[Path]:
    """Run directories a comparison reads (each must hold summary, records and scenario)."""
    return [run_dir(p, "summary.json", "records.parquet", "scenario.yaml") for p in paths]
