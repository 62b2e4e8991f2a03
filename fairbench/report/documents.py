"""The pages `fairbench report` and `fairbench sweep` write from run directories: a history
of runs in the order they started, the A/B document of paired runs with the scenario lines
that differ between the arms, and a sweep's Pareto page.

It exists so that the command line only parses and prints: reading run.json and scenario.yaml
for a page, and choosing what the page shows, happen here. It imports `decide` (the
comparison) and the page builders of this package.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any


def started_at(run: Path) -> str:
    """When a run started (its run.json), for ordering a history; '' when it is not recorded."""
    try:
        meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(meta.get("started_at", "")) if isinstance(meta, dict) else ""


def history_page(runs: list[Path], summaries: list[dict[str, Any]], metrics: list[str]) -> str:
    """The history page of `runs` (their summaries given), charted in the order they started."""
    from fairbench.report.decisions import history_report

    started = [started_at(r) for r in runs]
    order = sorted(range(len(runs)), key=lambda k: started[k])
    return history_report([summaries[k] for k in order], [runs[k].name for k in order], metrics)


def what_changed(a_dir: Path, b_dir: Path) -> str:
    """The scenario lines that differ between arm A and arm B (the scheduler, usually)."""
    a_text = (a_dir / "scenario.yaml").read_text(encoding="utf-8").splitlines()
    b_text = (b_dir / "scenario.yaml").read_text(encoding="utf-8").splitlines()
    diff = [
        line
        for line in difflib.unified_diff(a_text, b_text, "A", "B", lineterm="", n=0)
        if not line.startswith("@@")
    ]
    return "\n".join(diff) or "the scenarios are identical (runs differ by seed or target)"


def ab_page(a_dirs: list[Path], b_dirs: list[Path], target: Path) -> str:
    """The A/B document of the paired runs, for a page written at `target`. Raises
    CompareRefused when the runs cannot be compared."""
    from fairbench.decide.compare import compare_dirs
    from fairbench.report.decisions import comparison_report

    comparison = compare_dirs(a_dirs, b_dirs)
    changed = what_changed(a_dirs[0], b_dirs[0])
    return comparison_report(
        comparison, a_dirs, b_dirs, "Scheduler A/B report", changed, target.parent
    )


def write_sweep_page(
    base: Path, rows: list[dict[str, Any]], labels: list[str], names: list[str], senses: list[str]
) -> Path:
    """A sweep's report.html in `base`: the points on the first two objectives, each linked to
    its run's report."""
    from fairbench.report.decisions import pareto_report
    from fairbench.report.html import write_page

    links = [f"{Path(r['run_dir']).name}/report.html" for r in rows]
    page = pareto_report(
        labels,
        [r["summary"] for r in rows],
        names[0],
        names[1],
        (senses[0], senses[1]),
        params=[r["params"] for r in rows],
        links=links,
        more=list(zip(names[2:], senses[2:], strict=True)),
    )
    return write_page(base / "report.html", page)
