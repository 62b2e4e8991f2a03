"""How fast a report opens in a real browser, for a 100,000-request run. Target: under 2 s.

"Open" means the verdict and tables are painted and the figures in view are drawn (the rest
draw as they scroll into view). The baseline, measured in the same run, is a page holding only
plotly.js and one tiny figure: what any plotly report costs before it shows anything.

    python benchmarks/bench_report.py   (needs Debian's chromium and the playwright package)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import plotly.graph_objects as go
from _common import finish, show, verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fairbench.report.html import fig_html
from fairbench.report.html import page as html_page
from tests.test_report import CHROMIUM, browser_check, sim_run


def main() -> None:
    if CHROMIUM is None:
        print("no chromium on this machine: apt-get install chromium")
        sys.exit(2)
    tmp = Path(tempfile.mkdtemp(prefix="fb-report-"))
    base = tmp / "baseline.html"
    base.write_text(
        html_page(
            "baseline",
            [
                fig_html(go.Figure(go.Scatter(x=[1, 2], y=[1, 2])), "a"),
                fig_html(go.Figure(go.Scatter(x=[1, 2], y=[2, 1])), "b"),
            ],
        )
    )
    run = sim_run(tmp, "big", "vtc", rate=1600)
    rows = []
    times = {}
    for name, page in (
        ("plotly.js + 2 tiny figures (baseline)", base),
        ("report of a 100k-request run", run / "report.html"),
    ):
        best = min(browser_check(page, tmp / "shot.png")[4] for _ in range(3))
        times[name] = best
        rows.append([name, f"{page.stat().st_size / 1e6:.1f}", f"{best:.2f}"])
    base_t = next(iter(times.values()))
    for row, t in zip(rows, times.values(), strict=True):
        row.append(f"{t / base_t:.2f}")
    show(
        "opening a report in headless chromium (best of 3)",
        ["page", "MB", "open s", "ratio to baseline"],
        rows,
    )
    verdict(times["report of a 100k-request run"] < 2.0, "the report opens in under 2 s")
    finish()


if __name__ == "__main__":
    main()
