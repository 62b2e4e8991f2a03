"""Server-side Prometheus metrics, scraped during a live run into a long-format time series.

Parsed with prometheus-client's own text parser. Rows: t_ns (run clock, relative to t0),
metric, labels (JSON, sorted keys), value. Stored as `server_metrics.parquet`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families


def parse_prometheus(text: str, t_ns: int) -> list[dict[str, Any]]:
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            rows.append(
                {
                    "t_ns": t_ns,
                    "metric": sample.name,
                    "labels": json.dumps(sample.labels, sort_keys=True),
                    "value": float(sample.value),
                }
            )
    return rows


class Scraper:
    def __init__(self, url: str, interval_s: float = 1.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self.rows: list[dict[str, Any]] = []
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def scrape_once(self, session: aiohttp.ClientSession, t0_ns: int) -> None:
        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                text = await resp.text()
            self.rows.extend(parse_prometheus(text, time.perf_counter_ns() - t0_ns))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            self.failures += 1

    async def _loop(self, t0_ns: int) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                await self.scrape_once(session, t0_ns)
                await asyncio.sleep(self.interval_s)

    def start(self, t0_ns: int) -> None:
        self._task = asyncio.create_task(self._loop(t0_ns))

    async def stop(self, t0_ns: int) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        async with aiohttp.ClientSession() as session:  # one last look, after the run
            await self.scrape_once(session, t0_ns)

    def save(self, path: Path) -> None:
        schema = pa.schema(
            [
                ("t_ns", pa.int64()),
                ("metric", pa.string()),
                ("labels", pa.string()),
                ("value", pa.float64()),
            ]
        )
        pq.write_table(pa.Table.from_pylist(self.rows, schema=schema), str(path))
