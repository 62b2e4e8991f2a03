"""How fast a report opens in a real browser, for a 100,000-request run (target: under 2 s), and
how much disk a sweep's reports take (target: plotly.js stored once, not once per point).

"Open" means the verdict and tables are painted and the figures in view are drawn (the rest
draw as they scroll into view). The baseline, measured in the same run, is a page holding only
plotly.js and two tiny figures: what any plotly report costs before it shows anything.

The sweep part runs `fairbench sweep` over 6 simulated points and counts the bytes on disk of
every report page and plotly.min.js under the sweep directory (hard links counted once).

    python benchmarks/bench_report.py   (needs Debian's chromium and the playwright package)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import plotly.graph_objects as go
import yaml
from _common import finish, show, verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fairbench.report.html import PLOTLY_JS, fig_html, write_page
from fairbench.report.html import page as html_page
from tests.cli import run_cli
from tests.test_report import CHROMIUM, EMBED, browser_check, sim_run


def disk_bytes(root: Path, pattern: str) -> tuple[int, int]:
    """(files, bytes on disk) of the files matching `pattern`, each inode counted once."""
    seen: dict[tuple[int, int], int] = {}
    files = 0
    for path in root.rglob(pattern):
        st = path.stat()
        seen[(st.st_dev, st.st_ino)] = st.st_size
        files += 1
    return files, sum(seen.values())


def sweep_storage(tmp: Path, points: int = 6) -> None:
    scenario = {**EMBED, "run": {"duration": "20s", "warmup": "2s", "cooldown": "2s"}}
    (tmp / "s.yaml").write_text(yaml.safe_dump(scenario))
    grid = {"scheduler.policy": ["fifo", "vtc", "dwrr"], "scheduler.max_num_seqs": [8, 16]}
    spec = {"scenario": "s.yaml", "grid": grid, "parallel": 2}
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(spec))
    base = tmp / "sweep"
    done = run_cli("sweep", str(tmp / "sweep.yaml"), "--out", str(base), timeout=600)
    if done.returncode != 0:
        print(done.stderr)
        sys.exit(2)
    js_files, js_bytes = disk_bytes(base, PLOTLY_JS)
    html_files, html_bytes = disk_bytes(base, "*.html")
    inlined = (points + 1) * js_bytes  # what inlining it in every page cost
    show(
        f"reports of a {points}-point sweep on disk",
        ["files", "count", "MB on disk"],
        [
            [PLOTLY_JS, str(js_files), f"{js_bytes / 1e6:.1f}"],
            ["report pages (.html)", str(html_files), f"{html_bytes / 1e6:.1f}"],
            ["plotly.js inlined per page (before)", str(points + 1), f"{inlined / 1e6:.1f}"],
        ],
    )
    verdict(js_bytes == len((base / PLOTLY_JS).read_bytes()), "plotly.js is stored once")


def main() -> None:
    if CHROMIUM is None:
        print("no chromium on this machine: apt-get install chromium")
        sys.exit(2)
    tmp = Path(tempfile.mkdtemp(prefix="fb-report-"))
    base = write_page(
        tmp / "baseline" / "baseline.html",
        html_page(
            "baseline",
            [
                fig_html(go.Figure(go.Scatter(x=[1, 2], y=[1, 2])), "a"),
                fig_html(go.Figure(go.Scatter(x=[1, 2], y=[2, 1])), "b"),
            ],
        ),
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
        ["page", "MB (page, without plotly.min.js)", "open s", "ratio to baseline"],
        rows,
    )
    verdict(times["report of a 100k-request run"] < 2.0, "the report opens in under 2 s")
    sweep_storage(tmp)
    finish()


if __name__ == "__main__":
    main()
