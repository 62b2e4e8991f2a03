"""The `fairbench` command. Each subcommand is a thin edge over pure functions.

Exit codes: 0 success, 1 a measured failure (an INVALID run, a failed gate), 2 bad input (a
scenario, trace or option that cannot be used), 130 interrupted. Bad input prints one line per
problem on stderr, never a traceback.

Help is plain text (no Rich panels): it reads the same in a terminal, a pipe and a CI log, it
shows no type tag such as `<bool>` after a flag, and the golden files in tests/golden/help/ pin
it (`-h` and `--help` on every command, at most 100 columns).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from fairbench._version import __version__
from fairbench.cli.inputs import SET_HELP, UsageFailure, scenario_with
from fairbench.workload.errors import ScenarioError

# The scenario model and the trace readers (pydantic, numpy) are imported by the commands that
# use them: `fairbench --help` and a flag's one-line refusal must not pay for them (issue 35).

PROG = "fairbench"
app = typer.Typer(
    name=PROG,
    help="Open-loop, multi-tenant benchmark for LLM request schedulers.\n\n"
    "Exit codes: 0 success, 1 a measured failure (an INVALID run, a failed gate), "
    "2 bad input, 130 interrupted.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
console = Console()
err = Console(stderr=True, soft_wrap=True)  # one problem, one line, however long

__all__ = ["PROG", "UsageFailure", "app", "main"]


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"{PROG} {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """The group's own options (--version); its help text is the app's."""


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="scenario files", metavar="FILE")],
) -> None:
    """Check scenario files (and the traces they replay); print one line per problem."""
    from fairbench.workload.scenario import load_scenario
    from fairbench.workload.traces import TraceError

    bad = 0
    for path in files:
        try:
            scn = load_scenario(path)
            from fairbench.plan.materialize import materialize  # pyarrow: not for a refusal

            n = len(materialize(scn))
        except ScenarioError as error:
            bad += 1
            for line in error.lines:
                err.print(f"{path}: {line}", markup=False, highlight=False, soft_wrap=True)
            continue
        except TraceError as error:
            bad += 1
            err.print(f"{path}: traces: {error}", markup=False, highlight=False, soft_wrap=True)
            continue
        console.print(
            f"{path}: ok ({len(scn.tenants)} tenants, {n} planned requests)",
            markup=False,
            highlight=False,
        )
    if bad:
        raise typer.Exit(2)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the scenario format (for editor autocompletion)."""
    from fairbench.workload.scenario import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command()
def plan(
    file: Annotated[Path, typer.Argument(help="scenario file", metavar="FILE")],
    seed: Annotated[int | None, typer.Option(help="override run.seed", metavar="N")] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help=SET_HELP, metavar="PATH=VALUE")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="write the plan as Parquet", metavar="FILE")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Materialize a scenario's plan and show what it contains."""
    from fairbench.plan.materialize import materialize

    _, scn = scenario_with(file, overrides, "--set")
    the_plan = materialize(scn, seed)
    rows = the_plan.summary_rows()
    if out is not None:
        the_plan.save(out)
    if as_json:
        payload = {
            "digest": the_plan.digest,
            "requests": len(the_plan),
            "seed": the_plan.seed,
            "duration_s": the_plan.duration_ns / 1e9,
            "tenants": rows,
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    table = Table(
        title=f"plan of {scn.name}: {len(the_plan)} requests over "
        f"{the_plan.duration_ns / 1e9:.1f} s, seed {the_plan.seed}"
    )
    for col in ("tenant", "requests", "rate/s", "CV", "prompt p50/p90/p99", "output p50/p90/p99"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for r in rows:
        table.add_row(
            r["tenant"],
            str(r["requests"]),
            f"{r['rate_per_s']:.2f}",
            f"{r['interarrival_cv']:.2f}",
            f"{r['prompt_p50']:.0f}/{r['prompt_p90']:.0f}/{r['prompt_p99']:.0f}",
            f"{r['output_p50']:.0f}/{r['output_p90']:.0f}/{r['output_p99']:.0f}",
        )
    console.print(table)
    console.print(f"digest {the_plan.digest}", markup=False, highlight=False)
    if out is not None:
        console.print(f"wrote {out}", markup=False, highlight=False)


def _register_optional_commands() -> None:
    """Commands that live in their own modules (kept out of this file to keep it an edge)."""
    from fairbench.cli import advise as cli_advise
    from fairbench.cli import analysis as cli_analysis
    from fairbench.cli import explain as cli_explain
    from fairbench.cli import fidelity as cli_fidelity
    from fairbench.cli import history as cli_history
    from fairbench.cli import metrics as cli_metrics
    from fairbench.cli import run as cli_run

    cli_run.register(app)
    cli_analysis.register(app)
    cli_analysis.register_sweeps(app)
    cli_analysis.register_gate(app)
    cli_analysis.register_report(app)
    cli_metrics.register(app)
    cli_fidelity.register(app)
    cli_history.register(app)
    cli_explain.register(app)
    cli_advise.register(app)


def _say(line: str) -> None:
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def _trace_error(error: BaseException) -> bool:
    """Whether `error` is a trace reader's: checked without importing the readers (numpy) for
    every command, since an error of theirs exists only if something imported them."""
    traces = sys.modules.get("fairbench.workload.traces")
    return traces is not None and isinstance(error, traces.TraceError)


def allocator_settings() -> None:
    """Before NumPy or Arrow is imported, unless the user's environment says otherwise: ask
    NumPy not to madvise its large arrays into huge pages (NUMPY_MADVISE_HUGEPAGE=0), and have
    Arrow allocate with the system's allocator (ARROW_DEFAULT_MEMORY_POOL=system), not its
    bundled mimalloc. No number a run reports depends on either.

    Why (issue 35): where transparent huge pages are `madvise` with `defrag` `madvise` (a
    common kernel default), memory madvised into huge pages may be compacted synchronously as
    it faults in, and a fleet run allocates gigabytes of fresh arrays.
    - NumPy: the 10-minute VTC fleet took 22.0-22.8 CPU s with huge pages and 20.7-20.9
      without (kernel 5.5-6.3 -> 4.5-4.7 s).
    - Arrow's mimalloc: the report's records frame of that fleet (15 columns of 1.9M rows) took
      0.76-0.81 CPU s to convert, 0.73 of it the kernel's, against 0.15 with the system
      allocator (0.13) and 0.19 with jemalloc; `fairbench run scenarios/fleet-80.yaml`, user +
      system CPU, twice each, interleaved: 21.4 / 21.7 s with mimalloc, 19.5 / 20.4 s with the
      system allocator, the same summary.json and records.parquet byte for byte.
    benchmarks/bench_sim.py starts its runs the same way."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def main(argv: list[str] | None = None) -> None:
    """Run the command line; every way out is an exit code, bad input one line per problem."""
    allocator_settings()
    _register_optional_commands()
    try:
        code = app(args=argv, prog_name=PROG, standalone_mode=False)
    except ScenarioError as error:
        for line in error.lines:
            prefix = f"{error.source}: " if error.source else ""
            err.print(prefix + line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except (UsageFailure, FileExistsError) as error:
        for line in str(error).splitlines():
            _say(line)
        sys.exit(2)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as error:
        # A safety net: commands check what they are given, but a path named inside a file (a
        # sweep's scenario, a trace) can still be missing.
        _say(f"{error.filename}: {(error.strerror or 'cannot open').lower()}")
        sys.exit(2)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        name = getattr(mark, "name", None) or "(yaml)"
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        _say(f"{name}:{where}: not valid YAML ({problem})")
        sys.exit(2)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:
        if _trace_error(error):
            for line in str(error).splitlines():
                _say(line)
            sys.exit(2)
        # Usage errors of the (vendored) click library, in one line with where to look; the
        # no-arguments help prints itself.
        if type(error).__name__ == "NoArgsIsHelpError":
            error.show()  # type: ignore[attr-defined]
            sys.exit(2)
        message = getattr(error, "format_message", None)
        if callable(message) and hasattr(error, "exit_code"):
            ctx = getattr(error, "ctx", None)
            where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            _say(f"error: {' '.join(str(message()).split())}{where}")
            sys.exit(2)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
