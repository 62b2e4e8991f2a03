"""Shared helpers for benchmark scripts: a rich table and a pass/fail line per target."""

from __future__ import annotations

import resource
import sys

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 160)


def peak_rss_mb() -> float:
    """Peak resident set of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def show(title: str, columns: list[str], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if col != columns[0] else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)


_failed: list[str] = []


def verdict(ok: bool, text: str) -> None:
    console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/]: {text}")
    if not ok:
        _failed.append(text)


def finish() -> None:
    """Exit 1 when any target was missed, so scripts and CI can tell."""
    sys.exit(1 if _failed else 0)
