"""Reports: self-contained HTML, Markdown, A/B and history pages, and a real browser."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from fairbench.analysis.series import cdf, detect_step, shares_over_time
from fairbench.decide.compare import compare_dirs
from fairbench.pipeline import run_scenario
from fairbench.report import (
    comparison_report,
    history_report,
    pareto_report,
    write_page,
    write_run_report,
)
from fairbench.report.html import PLOTLY_JS, Colors, install_plotly, plotly_js
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario
from tests.cli import run_cli

SCENARIO = {
    "name": "report-test",
    "workloads": {
        "chat": {"prompt_tokens": 80, "output_tokens": 40},
        "doc": {"endpoint": "completions", "prompt_tokens": 3000, "output_tokens": 60},
    },
    "tenants": [
        {"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": 20}},
        {
            "id": "b",
            "slo_class": "batch",
            "mix": "doc",
            "arrival": {"process": "poisson", "rate": 3},
        },
    ],
    "run": {"duration": "60s", "warmup": "5s", "cooldown": "5s"},
    "target": {"kind": "sim"},
    "scheduler": {"policy": "fifo", "max_num_seqs": 8},
}


# an embeddings tenant: its requests stream no token, and are served when the response arrives
EMBED = {
    **SCENARIO,
    "workloads": {**SCENARIO["workloads"], "emb": {"endpoint": "embeddings", "prompt_tokens": 300}},
    "tenants": [
        *SCENARIO["tenants"],
        {"id": "e", "mix": "emb", "arrival": {"process": "poisson", "rate": 10}},
    ],
}


def sim_run(
    tmp_path: Path,
    name: str,
    policy: str = "fifo",
    seed: int = 1,
    rate: float = 20,
    base: dict[str, Any] = SCENARIO,
) -> Path:
    data = {**base, "scheduler": {**base["scheduler"], "policy": policy}}
    data["tenants"] = [
        {**data["tenants"][0], "arrival": {"process": "poisson", "rate": rate}},
        *data["tenants"][1:],
    ]
    run_dir = run_scenario(parse_scenario(data), RunOptions(out=tmp_path / name, seed=seed)).run_dir
    write_run_report(run_dir)
    return run_dir


def assert_self_contained(path: Path) -> str:
    """The page opens offline: the only script it loads is plotly.min.js beside it (present),
    nothing is fetched from elsewhere, and plotly.js is not inlined in it."""
    page = path.read_text()
    assert page.count("js-plotly-lazy") >= 1
    assert re.findall(r"<script[^>]+src=['\"]([^'\"]+)", page) == [PLOTLY_JS]
    assert (path.parent / PLOTLY_JS).read_bytes().startswith(b"/**\n* plotly.js v")
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)
    assert "plotly.js v" not in page and len(page) < 2_000_000
    return page


def figures_of(page: str) -> dict[str, dict[str, Any]]:
    """Each lazily drawn figure's plotly JSON, by its id."""
    found = re.findall(r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', page)
    return {fid: json.loads(data.replace("<\\/", "</")) for fid, data in found}


def trace_color(trace: dict[str, Any]) -> str | None:
    return (trace.get("line") or {}).get("color") or (trace.get("marker") or {}).get("color")


def assert_readable_figures(page: str, colors: Colors) -> int:
    """Every figure: a legend, a title on every axis with its unit in parentheses, and each
    trace that names a tenant or a class in that tenant's or class's one colour."""
    figs = figures_of(page)
    assert figs
    for fid, fig in figs.items():
        layout = fig["layout"]
        assert layout.get("showlegend") is True, fid
        axes = [k for k in layout if re.fullmatch(r"[xy]axis\d*", k)]
        assert {"xaxis", "yaxis"} <= set(axes), fid
        for axis in axes:
            title = (layout[axis].get("title") or {}).get("text") or ""
            if axis[0] == "x" and layout[axis].get("matches"):
                continue  # a shared x axis of stacked panels: titled on the bottom panel
            assert "(" in title and ")" in title, (fid, axis, title)
        for trace in fig["data"]:
            name = trace.get("name", "")
            for tenant, color in colors.tenants.items():
                if re.search(rf"(tenant {tenant}\b|^{tenant} (service|fair share))", name):
                    assert trace_color(trace) == color, (fid, name)
            for cls, color in colors.classes.items():
                if f"class {cls}" in name:
                    assert trace_color(trace) == color, (fid, name)
    return len(figs)


def test_a_run_writes_a_self_contained_report_and_markdown(tmp_path: Path) -> None:
    run = sim_run(tmp_path, "r", base=EMBED)
    page = assert_self_contained(run / "report.html")
    assert_readable_figures(
        page, Colors.of(["a", "b", "e"], ["batch", "best-effort", "interactive"])
    )
    for fid in (
        "cdf-tenant-ttft",
        "cdf-class-e2e",
        "ttft-p99-time",
        "queue-depth",
        "shares",
        "jain-windows",
        "attainment",
        "events",
        "send-lag",
    ):
        assert f'id="{fid}"' in page, fid
    assert "VALID" in page and "report-test" in page
    # the run header is a table, its raw JSON collapsed
    assert "<td>target.kind</td><td>sim</td>" in page.replace(" class='l'", "")
    assert "<details><summary>run.json (raw)</summary>" in page
    md = (run / "summary.md").read_text()
    assert md.startswith("## fairbench: report-test — VALID")
    assert "| tenant a |" in md and "| class batch |" in md


def test_the_key_table_says_what_warm_up_and_cool_down_left_out(tmp_path: Path) -> None:
    run = sim_run(tmp_path, "r")
    summary = json.loads((run / "summary.json").read_text())
    t = pd.read_parquet(run / "records.parquet")["t_intended_ns"] / 1e9
    lo, hi = summary["window_s"]
    warm, cool, inside = int((t < lo).sum()), int((t > hi).sum()), summary["overall"]["requests"]
    assert warm > 0 and cool > 0 and warm + cool + inside == len(t)
    page = (run / "report.html").read_text()
    assert (
        f"in [{lo:g} s, {hi:g} s] — {inside} of {len(t)} planned. Warm-up (before {lo:g} s) "
        f"excluded {warm}, cool-down (after {hi:g} s) excluded {cool}"
    ) in page
    ok = summary["overall"]["counts"]["ok"]
    assert "<th>ok / in window</th>" in page and f"<td>{ok}/{inside}</td>" in page
    md = (run / "summary.md").read_text()
    assert f"warm-up excluded {warm}, cool-down excluded {cool}" in md


def test_service_shares_count_embeddings_as_the_summary_does(tmp_path: Path) -> None:
    run = sim_run(tmp_path, "r", base=EMBED)
    summary = json.loads((run / "summary.json").read_text())
    df = pd.read_parquet(run / "records.parquet")
    lo, hi = summary["window_s"]
    t = df["t_intended_ns"] / 1e9
    window = df[(t >= lo) & (t <= hi)]
    assert window.loc[window["tenant"] == "e", "t_first_token_ns"].isna().all()  # no token
    weights = {"a": 1.0, "b": 1.0, "e": 1.0}
    # every window of the plotted range serves the embeddings tenant
    plotted = shares_over_time(window, weights, 5.0, start_s=lo, end_s=hi)
    assert plotted["t"] and min(plotted["service"]["e"]) > 0
    # over all windows, the service adds up to the summary's, tenant by tenant
    every = shares_over_time(window, weights, 5.0, start_s=lo)
    total = np.array(every["total_tokens"])
    for tenant, block in summary["fairness"]["tenants"].items():
        got = float((np.array(every["service"][tenant]) * total).sum())
        assert got == pytest.approx(block["service_tokens"], rel=1e-9), tenant
        assert block["share_of_fair"] is not None and block["service_tokens"] > 0


def test_ab_history_and_pareto_pages(tmp_path: Path) -> None:
    a, b = sim_run(tmp_path, "a", "fifo"), sim_run(tmp_path, "b", "vtc")
    comparison = compare_dirs([a], [b], resamples=200)
    path = write_page(
        tmp_path / "ab.html",
        comparison_report(comparison, [a], [b], "A/B", "-  policy: fifo\n+  policy: vtc", tmp_path),
    )
    page = assert_self_contained(path)
    assert_readable_figures(page, Colors.of(["a", "b"], ["batch", "best-effort", "interactive"]))
    assert "policy: vtc" in page and "Verdicts (B vs A)" in page and 'id="ab-cdf-tenant"' in page
    # both arms' values beside the change, CI and verdict
    assert "<th>A</th><th>B</th><th>change (B − A)</th><th>95% CI</th><th>threshold</th>" in page
    p99 = next(v for v in comparison.verdicts if v.metric == "ttft_p99")
    assert f"<td>{p99.a:,.1f} ms</td><td>{p99.b:,.1f} ms</td><td>{p99.diff:+.1%}</td>" in page
    bot = next(v for v in comparison.verdicts if v.metric == "ttft_p99.tenant.a")  # per tenant
    assert f"<td>ttft_p99.tenant.a</td><td>{bot.a:,.1f} ms</td>" in page
    att = next(v for v in comparison.verdicts if v.metric == "slo_attainment")
    assert f"<td>{att.a:.1%}</td><td>{att.b:.1%}</td>" in page
    assert "<a href='a/report.html'>a</a>" in page  # the runs, linked relative to the page
    summaries = [
        {"metrics": {"overall": {"ttft_p99": {"value": v}}}}
        for v in [100, 101, 99, 100, 102, 130, 131, 129, 132, 130]
    ]
    page = history_report(summaries, [f"n{k}" for k in range(10)], ["ttft_p99"])
    assert "ttft_p99: +29.9% from run n5" in page
    assert_readable_figures(page, Colors.of([], []))
    page = pareto_report(
        ["x", "y"],
        [
            {"metrics": {"overall": {"goodput": {"value": v}, "ttft_p99": {"value": 9.0}}}}
            for v in (1.0, 2.0)
        ],
        "goodput",
        "ttft_p99",
        ("max", "min"),
        params=[{"scheduler.policy": "fifo"}, {"scheduler.policy": "vtc"}],
        links=["p0/report.html", "p1/report.html"],
    )
    assert 'id="pareto"' in page and "<th class='l'>scheduler.policy</th>" in page
    assert "<a href='p1/report.html'>#1</a></td><td class='l'>vtc</td>" in page
    assert_readable_figures(page, Colors.of([], []))


def test_plotly_js_is_one_file_shared_by_hard_links(tmp_path: Path) -> None:
    runs = [tmp_path / "reports" / name for name in ("r1", "r2")]
    for run in runs:
        run.mkdir(parents=True)
        install_plotly(run, run.parent)
    install_plotly(runs[0], runs[0].parent)  # again: nothing changes
    shared = tmp_path / "reports" / PLOTLY_JS
    inodes = {(p / PLOTLY_JS).stat().st_ino for p in runs} | {shared.stat().st_ino}
    assert len(inodes) == 1 and shared.read_bytes() == plotly_js()
    # a stale copy (another plotly version) above is replaced, and linked again
    shared.unlink()
    shared.write_bytes(b"/* plotly.js v0 */")
    install_plotly(runs[1], runs[1].parent)
    assert shared.read_bytes() == plotly_js()
    assert (runs[1] / PLOTLY_JS).stat().st_ino == shared.stat().st_ino
    # no directory to share with: the run gets a copy of its own
    lone = tmp_path / "lone"
    lone.mkdir()
    install_plotly(lone, tmp_path / "missing" / "dir")
    assert (lone / PLOTLY_JS).read_bytes() == plotly_js()
    assert not list(tmp_path.rglob(".*.tmp"))  # no temporary file left behind


def test_step_detection_flags_lasting_shifts_not_outliers() -> None:
    rng = np.random.default_rng(0)
    steady = 100 + rng.normal(0, 1, 12)
    assert detect_step(steady) is None
    assert detect_step(np.concatenate([steady[:6], [160.0], steady[7:]])) is None  # one outlier
    step = detect_step(np.concatenate([steady[:6], steady[6:] * 1.2]))
    assert step is not None and step["at"] == 6 and step["shift"] == pytest.approx(0.2, abs=0.03)


def test_cdf_downsampling_keeps_the_ends_exact() -> None:
    values = np.arange(1.0, 100_001.0)
    x, y = cdf(values, max_points=400)
    assert len(x) == 400 and x[0] == 1.0 and x[-1] == 100_000.0 and y[-1] == 1.0


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def launched() -> Iterator[Any]:
    """One headless chromium for the block. A test that opens several pages opens each in a
    context of its own (as fresh as a new browser: no cache, storage or routes carried over)
    in this one browser: a launch is 2-3 s of a loaded machine, and it is not what is tested."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        try:
            yield browser
        finally:
            browser.close()


def browser_check(
    page_path: Path, screenshot: Path, browser: Any = None
) -> tuple[int, int, list[str], list[str], float]:
    """Open `page_path` offline in `browser` (a fresh context of it; a browser of its own if
    None), scroll every figure into view, and take a full-page picture."""
    if browser is None:
        with launched() as own:
            return browser_check(page_path, screenshot, own)
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    try:
        page = context.new_page()
        errors: list[str] = []
        fetched: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        def guard(route):  # type: ignore[no-untyped-def]
            if route.request.url.startswith("file://"):
                route.continue_()
            else:
                fetched.append(route.request.url)
                route.abort()

        page.route("**/*", guard)
        drawn = (
            "d => d.querySelector('.main-svg') && (d.querySelector('.cartesianlayer "
            ".trace') || d.querySelector('canvas'))"
        )
        start = time.perf_counter()
        page.goto(page_path.as_uri())
        # open: the verdict and tables are there, and the figures in view (or within the
        # loader's 600 px margin) are drawn; a long verdict table may push them all below
        page.wait_for_function(
            "typeof Plotly !== 'undefined' && (() => { const near = "
            "[...document.querySelectorAll('.js-plotly-lazy')].filter(d => "
            "d.getBoundingClientRect().top < window.innerHeight + 600); "
            f"return near.filter({drawn}).length >= Math.min(2, near.length); }})()",
            timeout=60_000,
        )
        loaded = time.perf_counter() - start
        # then every figure draws as it scrolls into view. At each step, wait until the figures
        # near the viewport are drawn before scrolling on: the loader draws only what is near
        # the viewport when its observer runs, and on a loaded machine a fixed pause let the
        # scroll pass figures before they were drawn (beside a CPU hog, 9 of 13 were drawn)
        near = (
            "[...document.querySelectorAll('.js-plotly-lazy')].filter(d => { const r = "
            "d.getBoundingClientRect(); "
            "return r.top < window.innerHeight + 600 && r.bottom > -600; })"
        )
        height = page.evaluate("document.body.scrollHeight")
        stuck = False  # a figure that never draws fails the assertion below; wait for it once
        for y in range(0, height + 1000, 600):
            page.evaluate(f"window.scrollTo(0, {y})")
            if not stuck:
                try:
                    page.wait_for_function(f"{near}.every({drawn})", timeout=30_000)
                except Exception:
                    stuck = True
        with contextlib.suppress(Exception):
            page.wait_for_function(
                f"[...document.querySelectorAll('.js-plotly-lazy')].every({drawn})", timeout=30_000
            )
        plots = page.evaluate("document.querySelectorAll('.js-plotly-lazy').length")
        rendered = page.evaluate(
            f"[...document.querySelectorAll('.js-plotly-lazy')].filter({drawn}).length"
        )
        # a full-page picture of a tall page with a dozen figures took over playwright's 30 s
        # default on a loaded CI machine; the picture is for people, not a speed check
        page.screenshot(path=str(screenshot), full_page=True, timeout=180_000)
    finally:
        context.close()
    return plots, rendered, errors, fetched, loaded


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on this machine (.ci/run installs "
    "Debian's chromium; locally: apt-get install chromium)",
)
def test_the_report_renders_in_a_real_browser_offline(tmp_path: Path) -> None:
    pytest.importorskip("playwright", reason="playwright is in the dev extra")
    # a 100k-request run: plots are downsampled (how fast it opens is measured by
    # benchmarks/bench_report.py; speed is not asserted in tests)
    run = sim_run(tmp_path, "big", "vtc", rate=1600)
    shot = tmp_path / "report.png"
    plots, rendered, errors, fetched, _ = browser_check(run / "report.html", shot)
    assert errors == [] and fetched == []
    assert plots >= 13 and rendered == plots
    assert shot.stat().st_size > 50_000
    keep_screenshot(shot, "run-100k.png")


def missing_plotly_notice(page_path: Path, browser: Any) -> bool:
    """Whether the page shows its "plotly.min.js is missing" notice (in a fresh context)."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.route(
            "**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort()
        )
        page.goto(page_path.as_uri())
        return bool(page.is_visible("#no-plotly"))
    finally:
        context.close()


def keep_screenshot(shot: Path, name: str) -> None:
    keep = os.environ.get("FAIRBENCH_SCREENSHOT_DIR")
    if keep:  # CI can keep them for people to look at
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / name)


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on this machine (apt-get install chromium)"
)
def test_every_page_renders_in_a_real_browser_offline(tmp_path: Path) -> None:
    """The A/B, quarterly, sweep and history pages, and a run page moved out of its sweep:
    each opens offline, draws every figure, logs no console error and fetches nothing."""
    pytest.importorskip("playwright", reason="playwright is in the dev extra")
    base = sweep_dir(tmp_path, points=2)
    moved = tmp_path / "moved-run"
    shutil.move(base / "point-000", moved)
    runs = tmp_path / "runs"
    arms = {
        arm: [sim_run(runs, f"{arm}-{seed}", policy, seed, base=EMBED) for seed in (1, 2)]
        for arm, policy in (("A", "fifo"), ("B", "vtc"))
    }
    ab, quarterly, history = runs / "ab.html", runs / "quarterly.html", runs / "history.html"
    for args in (
        ("--compare", str(arms["A"][0]), str(arms["B"][0]), "--out", str(ab)),
        (
            "--quarterly",
            *(f"--a={d}" for d in arms["A"]),
            *(f"--b={d}" for d in arms["B"]),
            "--out",
            str(quarterly),
        ),
        ("--history", *map(str, arms["A"] + arms["B"]), "--out", str(history)),
    ):
        done = run_cli("report", *args)
        assert done.returncode == 0, done.stderr
    pages = {
        "run.png": (moved / "report.html", 13),
        "ab.png": (ab, 4),
        "quarterly.png": (quarterly, 4),
        "sweep.png": (base / "report.html", 1),
        "history.png": (history, 4),
    }
    # a page copied without its plotly.min.js says so, instead of showing empty boxes
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(ab, lone / "ab.html")
    with launched() as browser:
        assert missing_plotly_notice(lone / "ab.html", browser)
        for name, (path, at_least) in pages.items():
            assert_self_contained(path)
            shot = tmp_path / name
            plots, rendered, errors, fetched, _ = browser_check(path, shot, browser)
            assert errors == [] and fetched == [], (name, errors, fetched)
            assert plots >= at_least and rendered == plots, (name, plots, rendered)
            keep_screenshot(shot, name)


def test_report_cli_quarterly_and_history(tmp_path: Path) -> None:
    import subprocess
    import sys

    a, b = sim_run(tmp_path, "a", "fifo"), sim_run(tmp_path, "b", "dwrr")
    cli = [sys.executable, "-m", "fairbench.cli", "report"]
    out = tmp_path / "q.html"
    done = subprocess.run(
        [*cli, "--quarterly", "--a", str(a), "--b", str(b), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "What changed" in page and "policy: dwrr" in page and "Verdicts (B vs A)" in page
    hist = tmp_path / "h.html"
    done = subprocess.run(
        [*cli, "--history", str(a), str(b), "--out", str(hist)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert 'id="history-0"' in hist.read_text()


def sweep_dir(tmp_path: Path, points: int = 3) -> Path:
    """`fairbench sweep` over `points` scheduler policies (two points run in parallel)."""
    scenario = {**EMBED, "run": {"duration": "30s", "warmup": "5s", "cooldown": "5s"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    policies = ["fifo", "vtc", "dwrr", "wfq", "sfq"][:points]
    (tmp_path / "sweep.yaml").write_text(
        yaml.safe_dump(
            {"scenario": "s.yaml", "grid": {"scheduler.policy": policies}, "parallel": 2}
        )
    )
    base = tmp_path / "sweep"
    done = run_cli("sweep", str(tmp_path / "sweep.yaml"), "--out", str(base), timeout=300)
    assert done.returncode == 0, done.stderr
    return base


def test_a_sweep_stores_plotly_once_and_labels_its_points(tmp_path: Path) -> None:
    base = sweep_dir(tmp_path)
    points = sorted(base.glob("point-*"))
    assert len(points) == 3
    copies = [p / PLOTLY_JS for p in points] + [base / PLOTLY_JS]
    # every page has its plotly.min.js, and all of them are one file on disk
    assert len({(c.stat().st_dev, c.stat().st_ino) for c in copies}) == 1
    assert sum(1 for _ in base.rglob("*.js")) == 4 and (base / PLOTLY_JS).stat().st_nlink >= 4
    for path in [base / "report.html", *(p / "report.html" for p in points)]:
        assert_self_contained(path)
    page = (base / "report.html").read_text()
    for k, policy in enumerate(["fifo", "vtc", "dwrr"]):
        assert (
            f"<a href='point-{k:03d}/report.html'>#{k}</a></td><td class='l'>{policy}</td>" in page
        )
    # a run directory moved away keeps a working copy of plotly.js
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(points[0], moved)
    assert_self_contained(moved / "report.html")
