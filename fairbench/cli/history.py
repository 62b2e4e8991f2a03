"""`fairbench history add|show`: the history store's edge (parse, call fairbench.history, print).

Exit codes: 0 done; 2 bad input (a store that is corrupt or not ours, a run directory that is
not one, an unknown metric or window), one line each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

DB_HELP = "the history store, a DuckDB file (default reports/history.duckdb)"
err = Console(stderr=True, soft_wrap=True)


def _fail(error: Exception) -> typer.Exit:
    err.print(str(error), markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _table(view: dict[str, Any]) -> list[Any]:
    table = Table(
        title=f"{view['metric']} ({view['group']}, {view['scenario']}), in start order",
        title_justify="left",
    )
    for col in ("run", "started (UTC)", "value", "95% CI", "rolling", "rolling 95% CI"):
        table.add_column(col, justify="left" if col in ("run", "started (UTC)") else "right")
    for p, r in zip(view["points"], view["rolling"], strict=True):
        table.add_row(
            p["run"],
            p["time"][:19],
            ("≥ " if p["lower_bound"] else "") + _num(p["value"]),
            f"{_num(p['ci_low'])}..{_num(p['ci_high'])}",
            _num(r["value"]),
            f"{_num(r['ci_low'])}..{_num(r['ci_high'])}",
        )
    lines: list[Any] = [table]
    d = view["drift"]
    if d["status"] == "ok":
        lines.append(
            f"drift, last window vs baseline: {_pct(d['relative'])} (95% CI {_pct(d['ci_low'])}.."
            f"{_pct(d['ci_high'])}; {d['n_window']} vs {d['n_baseline']} runs; {d['method']})"
        )
    else:
        lines.append(f"drift: cannot evaluate: {d['reason']}")
    for name in ("mean", "variance"):
        q = view["queue"].get(name) if "status" not in view["queue"] else None
        if q and q.get("ratio") is not None:
            lines.append(
                f"queue length {name} ratio: {q['ratio']:.2f}× (95% CI {q['ci_low']:.2f}.."
                f"{q['ci_high']:.2f}; {q['method']})"
            )
        else:
            reason = (q or view["queue"]).get("reason") or (q or {}).get("method")
            lines.append(f"queue length {name} ratio: cannot evaluate: {reason}")
    if not view["change_points"]:
        lines.append("change points: none")
    for c in view["change_points"]:
        lines.append(
            f"change point at {c['run']} ({c['time'][:10]}): {_pct(c['shift'])}, 95% interval "
            f"{c['ci_runs'][0]}..{c['ci_runs'][1]}"
        )
    lines.append(f"({view['change_point_method']})")
    return lines


def register(app: typer.Typer) -> None:
    history = typer.Typer(
        help="The history store: runs over weeks, drift and change points (docs/history.md).",
        no_args_is_help=True,
        rich_markup_mode=None,
    )
    app.add_typer(history, name="history")

    @history.command("add")
    def add(
        runs: Annotated[list[Path], typer.Argument(help="run directories", metavar="RUN")],
        db: Annotated[Path, typer.Option(help=DB_HELP, metavar="FILE")] = Path(
            "reports/history.duckdb"
        ),
    ) -> None:
        """Add finished runs to the store (a run added twice is kept once)."""
        from fairbench.history.errors import HistoryError
        from fairbench.history.rundata import add_runs

        try:
            added, already = add_runs(db, runs)
        except HistoryError as error:
            raise _fail(error) from None
        print(f"{db}: added {added} runs, {already} already there")

    @history.command("import")
    def import_(
        export: Annotated[
            list[Path],
            typer.Argument(
                help="a Prometheus range-query JSON export, or text scrape files",
                metavar="FILE",
            ),
        ],
        db: Annotated[Path, typer.Option(help=DB_HELP, metavar="FILE")] = Path(
            "reports/history.duckdb"
        ),
        name: Annotated[
            str, typer.Option(help="the series' scenario name in the store", metavar="NAME")
        ] = "production",
        step: Annotated[
            str, typer.Option(help="one point per this much time", metavar="LENGTH")
        ] = "1h",
    ) -> None:
        """Import a platform's TTFT histograms and queue lengths (docs/history.md)."""
        from fairbench.history.errors import HistoryError
        from fairbench.history.prometheus import import_export
        from fairbench.history.windows import parse_window

        try:
            added, already = import_export(db, export, name, parse_window(step, "--step"))
        except HistoryError as error:
            raise _fail(error) from None
        print(f"{db}: added {added} points of {name}, {already} already there")

    @history.command("show")
    def show(
        metric: Annotated[str, typer.Option(help="a registry metric, e.g. ttft_p99")],
        db: Annotated[Path, typer.Option(help=DB_HELP, metavar="FILE")] = Path(
            "reports/history.duckdb"
        ),
        window: Annotated[
            str, typer.Option(help="the rolling and drift window", metavar="LENGTH")
        ] = "14d",
        baseline: Annotated[
            str | None,
            typer.Option(
                help="the baseline before the window (default: its length)", metavar="LENGTH"
            ),
        ] = None,
        group: Annotated[
            str | None, typer.Option(help="tenant.ID, class.NAME or workload.NAME", metavar="G")
        ] = None,
        scenario: Annotated[
            str | None, typer.Option(help="the scenario's runs (default: the newest run's)")
        ] = None,
        html: Annotated[
            Path | None, typer.Option(help="also write an offline plotly page", metavar="FILE")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
    ) -> None:
        """One metric over time: points, rolling figure, drift, queue ratios, change points."""
        from fairbench.history.errors import HistoryError
        from fairbench.history.view import as_json, history_view
        from fairbench.history.windows import parse_window

        try:
            w = parse_window(window, "--window")
            b = None if baseline is None else parse_window(baseline, "--baseline")
            view = history_view(db, metric, w, b, group, scenario)
        except HistoryError as error:
            raise _fail(error) from None
        if html is not None:
            from fairbench.report.history_page import write_history_page

            write_history_page(html, view)
        if as_json:
            sys.stdout.write(json.dumps(as_json(view), indent=2) + "\n")
            return
        out = Console(width=None if sys.stdout.isatty() else 160)
        for line in _table(view):
            out.print(line, markup=False, highlight=False) if isinstance(line, str) else out.print(
                line
            )
        if html is not None:
            out.print(f"wrote {html}", markup=False, highlight=False)
