"""The scraper's baseline scrape comes before t0, whatever the machine's load.

Counters and histograms are differenced against a run's first scrape, so it must precede the
first request's end. It used to be taken by the scraper process once t0 was set: on a loaded
machine the niced process scraped 0.2 s after t0, when requests had already ended. Now
`wait_ready`, called before t0 is chosen, returns only once the baseline is in.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
from aiohttp import web

from fairbench.run.scrape import ScraperProcess, scrape_report
from tests.loopback import serve_in_thread


def test_the_baseline_is_scraped_before_t0_is_chosen(tmp_path: Path) -> None:
    hits: list[int] = []

    async def metrics(_: web.Request) -> web.Response:
        hits.append(time.perf_counter_ns())
        return web.Response(text="# TYPE r counter\nr_total 3\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    path = tmp_path / "server_metrics.parquet"
    with serve_in_thread(app) as url:
        scraper = ScraperProcess(f"{url}/metrics", path, 10.0, ready_timeout_s=60)
        assert scraper.wait_ready()
        assert len(hits) == 1  # the baseline is in before t0 exists
        time.sleep(0.3)  # a slow parent: t0 chosen well after the baseline
        t0 = time.perf_counter_ns()
        scraper.start(t0)
        scraper.stop_sync(t0)
    t_ns = sorted(pq.read_table(path).column("t_ns").to_pylist())
    assert t_ns[0] < -250_000_000  # the baseline, on the run's clock: 0.3 s before t0
    assert abs(t_ns[0] - (hits[0] - t0)) < 250_000_000  # stamped when it was served
    assert t_ns[-1] > 0  # the scrapes after t0 are on the same clock
    report = scrape_report(tmp_path)
    assert report["scrape"]["ready"] is True and report["scrape"]["failures"] == 0


def test_a_failed_baseline_scrape_is_not_ready_and_says_so(tmp_path: Path) -> None:
    from tests.loopback import free_port

    url = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens: the baseline fails
    scraper = ScraperProcess(url, tmp_path / "server_metrics.parquet", 10.0, ready_timeout_s=60)
    assert not scraper.wait_ready()
    t0 = time.perf_counter_ns()
    scraper.start(t0)
    scraper.stop_sync(t0)
    report = scrape_report(tmp_path)
    assert report["scrape"]["ready"] is False
    assert any("baseline scrape before t0 failed" in w for w in report["scrape_warnings"])
    assert not any("was not ready within" in w for w in report["scrape_warnings"])
