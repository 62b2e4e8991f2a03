"""The scraper writes samples to disk in row groups as the run goes and completes the file."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow.parquet as pq
from aiohttp import web

from tests.loopback import serve

METRICS = '# TYPE q gauge\nq{tenant="a"} 1\nq{tenant="b"} 2\n# TYPE r counter\nr_total 3\n'


def test_samples_reach_disk_in_row_groups(tmp_path: Path) -> None:
    from fairbench.run.scrape import Scraper

    async def main() -> Scraper:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=METRICS)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with serve(app) as url:
            scraper = Scraper(f"{url}/metrics", tmp_path / "m.parquet", 0.01, 3)
            t0 = time.perf_counter_ns()
            scraper.start(t0)
            for _ in range(200):  # bounded: until at least two row groups are on disk
                await asyncio.sleep(0.02)
                if scraper.scrapes >= 8:
                    break
            await scraper.stop(t0)
        return scraper

    scraper = asyncio.run(main())
    assert scraper.failures == 0 and scraper.scrapes >= 8
    meta = pq.ParquetFile(tmp_path / "m.parquet").metadata
    assert meta.num_row_groups >= 3
    table = pq.read_table(tmp_path / "m.parquet").to_pandas()
    assert len(table) == 3 * scraper.scrapes  # every sample of every scrape, none twice
    assert set(table["metric"]) == {"q", "r_total"}
    assert sorted(table.loc[table["metric"] == "q", "labels"].unique()) == [
        '{"tenant": "a"}',
        '{"tenant": "b"}',
    ]
    assert table["t_ns"].is_monotonic_increasing
