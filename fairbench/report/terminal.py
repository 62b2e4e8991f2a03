"""What `fairbench run` prints after a run: the per-group latency table and the verdict lines
(VALID or INVALID, generator health, warnings, accounting, completion, fairness).

It exists so that the command line only prints: the terminal rendering of a summary lives with
the other renderings of it (`headline` for the intervals table, `markdown` for summary.md), and
can be called and tested without typer. The golden outputs (tests/golden/run-*.txt) hold these
lines byte for byte. Imports this package's `markdown` (the window note, the fairness line).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from fairbench.report.markdown import fairness_line, window_note


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
