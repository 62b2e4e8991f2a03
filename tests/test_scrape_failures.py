"""A scraper that fails, or was not ready, is reported on the run: never a silent gap.

The scraper runs in its own process; it reports back through shared counters and the last
error, and its report (`scrape.json`) becomes the run's `scrape` entry in run.json and lines in
summary.json's `warnings`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from fairbench.pipeline import run_scenario
from fairbench.run.rundir import RunOptions
from fairbench.run.scrape import ScraperProcess, scrape_report
from fairbench.workload.loading import parse_scenario
from tests.loopback import free_port, serve_in_thread


def tiny(metrics_url: str) -> dict:
    return {
        "name": "scrape-fail",
        "workloads": {"w": {"endpoint": "chat", "prompt_tokens": 8, "output_tokens": 2}},
        "tenants": [{"id": "a", "mix": "w", "arrival": {"process": "constant", "rate": "5/s"}}],
        "run": {"duration": "1s", "grace": "5s", "timeout": "10s"},
        "target": {"kind": "reference", "metrics_url": metrics_url, "scrape_interval": "0.1s"},
        "scheduler": {
            "policy": "fifo",
            "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 10000},
        },
    }


def failing_app() -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(status=500, text="# TYPE q gauge\nq 1\n")  # a body that would parse

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


@pytest.mark.parametrize("how", ["http_500", "refused"])
def test_failed_scrapes_are_warnings_on_the_run(tmp_path: Path, how: str) -> None:
    out = tmp_path / "run"
    if how == "http_500":
        with serve_in_thread(failing_app()) as url:
            outcome = run_scenario(
                parse_scenario(tiny(f"{url}/metrics")),
                RunOptions(out=out, workers=1, progress=False),
            )
        expected = "HTTP 500"
    else:
        url = f"http://127.0.0.1:{free_port()}/metrics"
        outcome = run_scenario(
            parse_scenario(tiny(url)), RunOptions(out=out, workers=1, progress=False)
        )
        expected = "ClientConnectorError"
    assert outcome.summary["accounting"]["holds"]
    warnings = [w for w in outcome.summary["warnings"] if w.startswith("server metrics: ")]
    assert any("scrapes failed" in w and expected in w for w in warnings), warnings
    assert any("no scrape succeeded" in w for w in warnings), warnings
    summary = json.loads((out / "summary.json").read_text())
    header = json.loads((out / "run.json").read_text())
    assert summary["warnings"] == outcome.summary["warnings"]
    scrape = header["target"]["scrape"]
    assert scrape["scrapes"] == 0 and scrape["failures"] >= 2 and expected in scrape["last_error"]
    assert header["target"]["scrape_warnings"] == warnings


def test_a_scraper_not_ready_in_time_says_so(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    scraper = ScraperProcess(url, tmp_path / "server_metrics.parquet", 0.05, ready_timeout_s=0)
    assert not scraper.wait_ready()  # a spawned interpreter cannot be up at once
    scraper.start(1)
    scraper.stop_sync(1)
    report = scrape_report(tmp_path)
    assert report["scrape"]["ready"] is False
    assert any("was not ready within 0 s" in w for w in report["scrape_warnings"])
    assert scrape_report(tmp_path / "elsewhere") == {}  # no scraper ran: nothing to say
