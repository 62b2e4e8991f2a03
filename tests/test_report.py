"""Reports: self-contained HTML, Markdown, A/B and history pages, and a real browser."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from fairbench.analysis.series import cdf, detect_step
from fairbench.decide.compare import compare_dirs
from fairbench.pipeline import run_scenario
from fairbench.report import (
    comparison_report,
    history_report,
    pareto_report,
    write_run_report,
)
from fairbench.run import RunOptions
from fairbench.workload.scenario import parse_scenario

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


def sim_run(
    tmp_path: Path, name: str, policy: str = "fifo", seed: int = 1, rate: float = 20
) -> Path:
    data = {**SCENARIO, "scheduler": {**SCENARIO["scheduler"], "policy": policy}}
    data["tenants"] = [
        {**data["tenants"][0], "arrival": {"process": "poisson", "rate": rate}},
        data["tenants"][1],
    ]
    run_dir = run_scenario(parse_scenario(data), RunOptions(out=tmp_path / name, seed=seed)).run_dir
    write_run_report(run_dir)
    return run_dir


def assert_self_contained(page: str) -> None:
    assert page.count("js-plotly-lazy") >= 1
    assert not re.search(r"<script[^>]+src=", page)  # nothing to fetch
    assert not re.search(r"<link[^>]+href=[\"']https?:", page)
    assert page.count("plotly.js v") <= 2  # the library is embedded once (its banner)


def test_a_run_writes_a_self_contained_report_and_markdown(tmp_path: Path) -> None:
    run = sim_run(tmp_path, "r")
    page = (run / "report.html").read_text()
    assert_self_contained(page)
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
    md = (run / "summary.md").read_text()
    assert md.startswith("## fairbench: report-test — VALID")
    assert "| tenant a |" in md and "| class batch |" in md


def test_ab_history_and_pareto_pages(tmp_path: Path) -> None:
    a, b = sim_run(tmp_path, "a", "fifo"), sim_run(tmp_path, "b", "vtc")
    page = comparison_report(
        compare_dirs([a], [b], resamples=200), [a], [b], "A/B", "-  policy: fifo\n+  policy: vtc"
    )
    assert_self_contained(page)
    assert "policy: vtc" in page and "Verdicts (B vs A)" in page and 'id="ab-cdf-tenant"' in page
    summaries = [
        {"overall": {"latency_ms": {"ttft": {"p99": v}}}}
        for v in [100, 101, 99, 100, 102, 130, 131, 129, 132, 130]
    ]
    page = history_report(summaries, [f"n{k}" for k in range(10)], ["ttft_p99"])
    assert "ttft_p99: +29.9% from run n5" in page
    page = pareto_report(
        ["x", "y"],
        [{"overall": {"goodput": {"requests_per_s": 1.0}}}] * 2,
        "goodput",
        "ttft_p99",
        ("max", "min"),
    )
    assert 'id="pareto"' in page


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


def browser_check(
    page_path: Path, screenshot: Path
) -> tuple[int, int, list[str], list[str], float]:
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
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
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
        # open: the verdict and tables are there, and the figures in view are drawn
        page.wait_for_function(
            f"[...document.querySelectorAll('.js-plotly-lazy')].filter({drawn}).length >= 2",
            timeout=20_000,
        )
        loaded = time.perf_counter() - start
        # then every figure draws as it scrolls into view
        height = page.evaluate("document.body.scrollHeight")
        for y in range(0, height + 1000, 600):
            page.evaluate(f"window.scrollTo(0, {y})")
            page.wait_for_timeout(60)
        with contextlib.suppress(Exception):  # the assertion below says what did not draw
            page.wait_for_function(
                f"[...document.querySelectorAll('.js-plotly-lazy')].every({drawn})", timeout=20_000
            )
        plots = page.evaluate("document.querySelectorAll('.js-plotly-lazy').length")
        rendered = page.evaluate(
            f"[...document.querySelectorAll('.js-plotly-lazy')].filter({drawn}).length"
        )
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
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
    keep = os.environ.get("FAIRBENCH_SCREENSHOT_DIR")
    if keep:  # CI can keep it for people to look at
        shutil.copy(shot, Path(keep) / "report.png")


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
