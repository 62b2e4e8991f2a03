"""The tables the commands print: after `fairbench run`, the per-group latency table and the
verdict lines (VALID or INVALID, generator health, warnings, accounting, completion, fairness);
the A/B verdict table of `compare` and `ab`; the objectives and front of `sweep` and `pareto`.

It exists so that the command line only prints: the terminal rendering of a result lives with
the other renderings of it (`headline` for the intervals table, `markdown` for summary.md), and
can be called and tested without typer. The golden outputs (tests/golden/run-*.txt) hold the
run's lines byte for byte. Imports `analysis.registry` (how a figure is shown),
`decide.objectives` (the front) and this package's `markdown`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from fairbench.analysis import registry
from fairbench.decide.objectives import front
from fairbench.report.markdown import fairness_line, window_note

if TYPE_CHECKING:
    from fairbench.decide.compare import Comparison


def _ms(value: float | None) -> str:
    """Milliseconds as the table shows them: whole from 100 up, one decimal below."""
    return "-" if value is None else (f"{value:.0f}" if value >= 100 else f"{value:.1f}")


def results_table(summary: dict[str, Any]) -> Table:
    """One row per group; latency in ms from the intended send time, p50/p99."""
    note = window_note(summary)
    table = Table(
        title="latency ms (from intended send) p50/p90/p99" + (f"; {note}" if note else ""),
        title_justify="left",
    )
    for col in ("group", "ok/err/t-o/rej/cx", "TTFT", "TPOT", "ITL max", "E2E", "req/s", "SLO"):
        table.add_column(col, justify="left" if col == "group" else "right", no_wrap=True)
    rows = [("overall", summary["overall"])]
    rows += [(f"tenant {k}", v) for k, v in summary["tenants"].items()]
    rows += [(f"class {k}", v) for k, v in summary["slo_classes"].items()]
    for name, block in rows:
        c = block["counts"]
        lat = block["latency_ms"]
        att = block["slo_attainment"]
        table.add_row(
            name,
            f"{c['ok']}/{c['error']}/{c['timeout']}/{c['rejected']}/{c['cancelled']}",
            *(
                "/".join(
                    ("≥" if p in (lat[k].get("lower_bound") or []) else "") + _ms(lat[k].get(p))
                    for p in ("p50", "p90", "p99")
                )
                for k in ("ttft", "tpot", "itl_max", "e2e")
            ),
            f"{block['throughput']['requests_per_s'] or 0:.1f}",
            "-" if att is None else f"{att:.0%}",
        )
    return table


def verdict_lines(summary: dict[str, Any]) -> list[str]:
    """The lines under the tables, rich markup: the verdict first, then why it may mislead."""
    lines = []
    if summary["valid"]:
        lines.append("[bold green]VALID[/]")
    else:
        lines.append("[bold red]INVALID[/]")
        lines += [f"  [red]- {reason}[/]" for reason in summary["invalid_reasons"]]
    health = summary["generator_health"]
    lag = health["send_lag_ms"]
    if summary.get("closed_loop"):
        cap = health["closed_loop"]["concurrency_cap"]
        lines.append(
            f"[bold yellow]CLOSED LOOP[/]: at most {cap} requests in flight; send lag is "
            "the wait for a slot, and arrivals were not open-loop"
        )
    if health.get("virtual_time"):
        lines.append("generator: virtual time (simulated; no send lag)")
    else:
        lines.append(
            f"generator send lag p50/p99/max: {_ms(lag.get('p50'))}/"
            f"{_ms(lag.get('p99'))}/{_ms(lag.get('max'))} ms "
            f"(threshold p99 {health['send_lag_threshold_ms']:g} ms)"
        )
        delay, error = health.get("receive_delay_ms"), health.get("receive_error_ms")
        if delay and error:
            lines.append(
                f"generator receive delay p50/p99/max: {_ms(delay.get('p50'))}/"
                f"{_ms(delay.get('p99'))}/{_ms(delay.get('max'))} ms, kernel-stamped; its effect "
                f"on first-token stamps p99 {_ms(error.get('p99'))} ms "
                f"(threshold {health['receive_error_threshold_ms']:g} ms)"
            )
        else:
            lines.append("generator receive delay: not measured (no kernel receive stamps)")
    lines += [f"[yellow]warning: {w}[/]" for w in summary.get("warnings", [])]
    lines.append(f"accounting: {summary['accounting']['line']}")
    comp = summary.get("completion")
    if comp and not comp["ok"]:
        lines.append(
            f"[bold yellow]TAIL CENSORED[/]: {comp['line']}: percentiles marked ≥ are lower bounds"
        )
    elif comp and comp["unfinished"]:
        lines.append(f"unfinished: {comp['line']}")
    lines.append(fairness_line(summary).rstrip("."))
    return lines


def loud_lines(summary: dict[str, Any]) -> list[str]:
    """What `fairbench run --quiet` prints above the run directory (rich markup): only what
    makes the figures wrong or misleading — INVALID with its reasons, a closed loop, the
    target's warnings, a tail censored past the limit. A VALID run prints none: a sweep or a
    script of many runs reads the run directory, not tables (issue 35)."""
    lines = verdict_lines(summary)
    loud = ("[bold red]INVALID", "  [red]- ", "[bold yellow]", "[yellow]warning: ")
    return [line for line in lines if line.startswith(loud)]


def verdict_table(comparison: Comparison, title: str, level: float, caption: str) -> Table:
    """A row per metric and group: A, B (≥ for a lower bound; the runs' spread with 2+ pairs),
    the change, its interval, the practical threshold the verdict used, and the verdict."""
    # plain Text: the title and caption carry the user's overrides, whose brackets (a list
    # value: `classes=[premium, interactive]`) rich would read as markup and drop
    table = Table(title=Text(title), caption=Text(caption), title_justify="left")
    cols = ("metric", "A", "B", "change", f"{level * 100:g}% CI", "threshold", "p", "verdict")
    for col in cols:
        table.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
    colour = {"better": "green", "worse": "red", "cannot evaluate": "yellow"}
    for v in comparison.verdicts:
        metric = registry.of_name(v.metric)

        def arm(x: float, bound: bool, runs: list[float], v: Any = v) -> str:
            text = registry.show(v.unit, x, bound)
            finite = [r for r in runs if r is not None and math.isfinite(r)]
            if len(finite) > 1:
                text += (
                    f" ({registry.show(v.unit, min(finite))}–{registry.show(v.unit, max(finite))})"
                )
            return text

        change = lambda x, m=metric: registry.show_change(m, x)  # noqa: E731
        ci = "-" if math.isnan(v.ci_low) else f"[{change(v.ci_low)}, {change(v.ci_high)}]"
        word = f"[{colour.get(v.verdict, 'white')}]{v.verdict}[/]"
        if v.reason and v.verdict not in ("better", "worse"):
            word += f" [dim]({v.reason})[/]"
        table.add_row(
            v.metric,
            arm(v.a, v.a_bound, v.a_runs),
            arm(v.b, v.b_bound, v.b_runs),
            change(v.diff),
            ci,
            "±" + change(v.threshold).lstrip("+"),
            "-" if math.isnan(v.p_value) else f"{v.p_value:.3f}",
            word,
        )
    return table


def front_table(
    title: str,
    labels: list[str],
    summaries: list[dict[str, Any]],
    names: list[str],
    senses: list[str],
) -> Table:
    """A row per run: its objectives, and whether it is on the front (or the best, with one)."""
    values, on_front = front(summaries, names, senses)
    table = Table(title=title, title_justify="left")
    table.add_column("point")
    for name, sense in zip(names, senses, strict=True):
        table.add_column(f"{name} ({sense})", justify="right")
    one = len(names) == 1
    table.add_column("best" if one else "front")
    for label, row, on in zip(labels, values, on_front, strict=True):
        style = "bold" if on else "dim"
        mark = ("yes" if on else "-") if one else ("yes" if on else "dominated")
        table.add_row(label, *(f"{v:.4g}" for v in row), mark, style=style)
    return table
