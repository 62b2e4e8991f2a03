"""The watcher: what the gateway learns about each upstream between requests.

One task, each upstream on its own intervals: scrape /metrics (saturation, and the correction
of the gateway's own count, pool.py and capacity.py), probe /health of an unhealthy one, and
read an SGLang or TGI engine's description once (its capacity, where the file gave none).
After each round it calls `pump`, since what it learned may let queued requests go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp
import orjson

from reference_scheduler.gateway.capacity import DESCRIPTION, learn_description
from reference_scheduler.gateway.config import DispatchSpec
from reference_scheduler.gateway.pool import Pool, Upstream
from reference_scheduler.gateway.relay import upstream_headers

log = logging.getLogger("reference_scheduler.gateway")


class Watcher:
    def __init__(
        self,
        pool: Pool,
        dispatch: DispatchSpec,
        keys: list[str | None],
        now: Callable[[], int],
        pump: Callable[[], None],
    ) -> None:
        self.pool = pool
        self.dispatch = dispatch
        self.keys = keys
        self.now = now
        self.pump = pump
        self.session: aiohttp.ClientSession | None = None
        self.scrape_failing: set[int] = set()  # upstreams whose scrape failure was logged
        self.described: set[int] = set()  # upstreams whose description was read (or tried)

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Scrape each upstream's /metrics and probe unhealthy ones, each on its own interval."""
        self.session = session
        d = self.dispatch
        tick = min(d.scrape_interval_s, d.probe_interval_s)
        scrape_due = [0] * len(self.pool.upstreams)
        probe_due = [0] * len(self.pool.upstreams)
        while True:
            now = self.now()
            jobs = []
            for up in self.pool.upstreams:
                if up.spec.engine in DESCRIPTION and up.index not in self.described:
                    self.described.add(up.index)
                    jobs.append(self.describe(up))
                if up.scraped and now >= scrape_due[up.index]:
                    scrape_due[up.index] = now + int(d.scrape_interval_s * 1e9)
                    jobs.append(self.scrape(up))
                if not up.healthy and now >= probe_due[up.index]:
                    probe_due[up.index] = now + int(d.probe_interval_s * 1e9)
                    jobs.append(self.probe(up))
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
                self.pump()
            await asyncio.sleep(tick)

    async def _get(self, up: Upstream, path: str) -> tuple[int, str]:
        assert self.session is not None
        headers = upstream_headers(self.keys[up.index])
        timeout = aiohttp.ClientTimeout(total=self.dispatch.connect_timeout_s * 2)
        async with self.session.get(up.spec.url + path, headers=headers, timeout=timeout) as resp:
            return resp.status, await resp.text()

    async def scrape(self, up: Upstream) -> None:
        why = ""
        try:
            status, text = await self._get(up, "/metrics")
            if status == 200:
                self.pool.read_scrape(up, text, self.now())
            else:
                why = f"HTTP {status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            why = type(error).__name__
        if why and up.index not in self.scrape_failing:
            self.scrape_failing.add(up.index)
            known = up.capacity.known
            log.warning(
                "upstream %s: /metrics scrape failed (%s); %s",
                up.name,
                why,
                "its capacity is known, so the gateway's own count stays in charge, uncorrected"
                if known
                else "it counts as saturated once its last good scrape is older than "
                "stale_after_s (engine: none turns scraping off)",
            )
        elif not why:
            self.scrape_failing.discard(up.index)

    async def describe(self, up: Upstream) -> None:
        """SGLang's /get_server_info or TGI's /info, once: its sequences and KV tokens."""
        path = DESCRIPTION[up.spec.engine][0]
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            status, text = await self._get(up, path)
            if status == 200:
                learn_description(up.capacity, up.spec.engine, orjson.loads(text))
                cap = up.capacity
                if cap.known:
                    log.info(
                        "upstream %s: capacity %s sequences, %s KV tokens (%s; %s)",
                        up.name,
                        cap.seqs,
                        cap.kv_tokens,
                        cap.seqs_from or "-",
                        cap.kv_from or "-",
                    )

    async def probe(self, up: Upstream) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, asyncio.TimeoutError):
            status, _ = await self._get(up, "/health")
            if status == 200:
                up.healthy = True
                up.failures = 0
                log.warning("upstream %s is healthy again", up.name)
