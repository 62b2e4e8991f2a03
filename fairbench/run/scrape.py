"""Server-side Prometheus metrics, scraped during a live run into a long-format time series.

Parsed with prometheus-client's own text parser. Rows: t_ns (run clock, relative to t0),
metric, labels (JSON, sorted keys), value, type and family (from the exposition's TYPE line).
Stored as `server_metrics.parquet`; fairbench.analysis.server_metrics turns it into rates and
quantiles.

A scrape that fails (connection refused, a non-200 answer, an exposition that does not parse)
is counted with its last error, and a scraper that was not ready when t0 was chosen says so: the
scraper process writes `scrape.json` into the run directory when it stops, and `scrape_report`
turns it into the run's `scrape` entry and warning lines (run.json's target, summary.json's
`warnings`), so missing server metrics are reported on the run rather than swallowed.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    import aiohttp


def parse_prometheus(text: str, t_ns: int) -> list[dict[str, Any]]:
    """One row per sample. Counters are named `*_total` whatever the exporter wrote (the parser
    normalises them: TGI's `tgi_request_count` becomes `tgi_request_count_total`); `*_created`
    samples (a series' creation time, not a measurement) are left out."""
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            rows.append(
                {
                    "t_ns": t_ns,
                    "metric": sample.name,
                    "labels": json.dumps(sample.labels, sort_keys=True),
                    "value": float(sample.value),
                    "type": family.type,
                    "family": family.name,
                }
            )
    return rows


SCHEMA = pa.schema(
    [
        ("t_ns", pa.int64()),
        ("metric", pa.string()),
        ("labels", pa.string()),
        ("value", pa.float64()),
        ("type", pa.string()),  # counter | gauge | histogram | summary | unknown
        ("family", pa.string()),  # a histogram's samples share it
    ]
)


class Scraper:
    """Scrapes `url` every `interval_s` into `path`, a row group every `group_scrapes` scrapes.

    Rows go to disk as the run goes, not into a list held to the end: a server exports ~70
    samples a scrape, ~50 MB an hour as Python dicts, which a long soak would see as a leak.
    """

    def __init__(
        self, url: str, path: Path, interval_s: float = 1.0, group_scrapes: int = 60
    ) -> None:
        self.url = url
        self.path = path
        self.interval_s = interval_s
        self.group_scrapes = group_scrapes
        self.rows: list[dict[str, Any]] = []  # not yet written
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        self._pending_scrapes = 0
        self._writer: pq.ParquetWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[None] | None = None

    async def scrape_once(self, session: aiohttp.ClientSession, t0_ns: int) -> None:
        import aiohttp  # here, not at import: a simulated run never loads it (issue 35)

        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                text = await resp.text()
                status = resp.status
            if status != 200:
                raise ValueError(f"HTTP {status}")
            self.rows.extend(parse_prometheus(text, time.perf_counter_ns() - t0_ns))
            self.scrapes += 1
            self._pending_scrapes += 1
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
            self.failures += 1
            text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            self.last_error = text[:ERROR_CHARS]

    async def baseline(self) -> None:
        """One scrape before t0 is chosen, stamped on the raw clock (`rebase` makes it the
        run's): the baseline then lies before t0 whatever the machine's load."""
        import aiohttp

        async with aiohttp.ClientSession() as session:
            await self.scrape_once(session, 0)

    def rebase(self, t0_ns: int) -> None:
        """The rows scraped before t0 was known, on the run's clock (negative: before t0)."""
        for row in self.rows:
            row["t_ns"] -= t0_ns

    def _write_group(self) -> None:
        rows, self.rows, self._pending_scrapes = self.rows, [], 0
        if self._writer is None:
            self._writer = pq.ParquetWriter(str(self.path), SCHEMA)
        if rows:
            self._writer.write_table(pa.Table.from_pylist(rows, schema=SCHEMA))

    async def _loop(self, t0_ns: int) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            while True:
                await self.scrape_once(session, t0_ns)
                if self._pending_scrapes >= self.group_scrapes:
                    # Off the event loop: encoding a row group must not delay a send. Shielded,
                    # so that stop() can wait for a write in progress instead of racing it.
                    self._writing = asyncio.ensure_future(asyncio.to_thread(self._write_group))
                    await asyncio.shield(self._writing)
                await asyncio.sleep(self.interval_s)

    def start(self, t0_ns: int) -> None:
        self._task = asyncio.create_task(self._loop(t0_ns))

    async def stop(self, t0_ns: int) -> None:
        """One last look after the run, then the file is complete."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writing is not None:
            await self._writing
        import aiohttp

        async with aiohttp.ClientSession() as session:
            await self.scrape_once(session, t0_ns)
        self._write_group()
        assert self._writer is not None
        self._writer.close()


ERROR_CHARS = 200  # the last error's text, as shared with the parent process
REPORT_NAME = "scrape.json"


def _scrape_main(
    url: str,
    path: str,
    interval_s: float,
    t0: Any,
    stop: Any,
    counts: Any,
    ready: Any,
    error: Any,
    go: Any,
    based: Any,
    baseline_ok: Any,
) -> None:
    """The scraper process: on `go`, the baseline scrape (then `based`); on t0, a scrape every
    interval until told to stop; then one last look."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's own signal handling stops us
    os.nice(5)  # background work: when a core is short, the generator's sends come first

    async def main() -> None:
        scraper = Scraper(url, Path(path), interval_s)
        ready.set()
        while not t0.value and not stop.is_set() and not go.is_set():
            await asyncio.sleep(0.002)
        if go.is_set() and not t0.value and not stop.is_set():
            await scraper.baseline()  # stamped on the raw clock: t0 is not chosen yet
            baseline_ok.value = scraper.scrapes > 0
            based.set()
            while not t0.value and not stop.is_set():
                await asyncio.sleep(0.002)
        start = int(t0.value)
        scraper.rebase(start)
        scraper.start(start)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        try:
            await scraper.stop(start)
        finally:
            counts[0], counts[1] = scraper.scrapes, scraper.failures
            if error is not None and scraper.last_error:
                error.value = scraper.last_error.encode("utf-8", "replace")[: ERROR_CHARS - 1]

    asyncio.run(main())


class ScraperProcess:
    """A Scraper in a process of its own, so that parsing an engine's exposition (10–20 ms for
    vLLM's ~450 samples, every second) never stalls the generator's event loop. Launched before
    the run (a spawned interpreter takes a moment to start), waited for before t0 is chosen,
    then released by `start(t0)`.
    CLOCK_MONOTONIC (perf_counter_ns) is shared by processes, so its times are the run's."""

    def __init__(
        self, url: str, path: Path, interval_s: float = 1.0, ready_timeout_s: float = 15.0
    ) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.path = path
        self.ready_timeout_s = ready_timeout_s
        self.was_ready: bool | None = None  # None: never waited for
        self.baseline_failed = False  # its baseline scrape came in time, but failed
        self._t0 = ctx.Value("q", 0, lock=False)
        self._stop = ctx.Event()
        self._counts = ctx.Array("q", 2, lock=False)
        self._error = ctx.Array("c", ERROR_CHARS, lock=False)
        self._ready = ctx.Event()
        self._go = ctx.Event()
        self._based = ctx.Event()
        self._baseline_ok = ctx.Value("b", 0, lock=False)
        self._proc = ctx.Process(
            target=_scrape_main,
            args=(
                url,
                str(path),
                interval_s,
                self._t0,
                self._stop,
                self._counts,
                self._ready,
                self._error,
                self._go,
                self._based,
                self._baseline_ok,
            ),
            daemon=True,
        )
        self._proc.start()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Call before choosing t0: waits for the process, then for its baseline scrape (the
        one counters and histograms are differenced against), which must come before the first
        request ends. Taken here, before t0 exists, it does: released by t0 instead, a niced
        process on a loaded machine scraped 0.2 s after t0, when requests had already ended
        (a two-shard run at load 5, 2026-12-05). A scraper not ready in time, or whose baseline
        did not come in time (the server was slow), or whose baseline scrape failed, is reported
        on the run (see `report`); its first scrape after t0 is then the baseline. True only
        with the baseline in."""
        limit = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        ok = bool(self._ready.wait(limit))
        if ok:
            self._go.set()
            ok = bool(self._based.wait(max(0.0, deadline - time.monotonic())))
            if ok and not self._baseline_ok.value:
                self.baseline_failed = True
                ok = False
        self.was_ready = ok if self.was_ready is None else self.was_ready and ok
        return ok

    def start(self, t0_ns: int) -> None:
        """Scrape every interval from now on (the baseline came in `wait_ready`, before t0;
        without it, the first of these scrapes is the baseline)."""
        self._t0.value = t0_ns

    async def stop(self, t0_ns: int) -> None:
        await asyncio.to_thread(self.stop_sync, t0_ns)

    def stop_sync(self, t0_ns: int) -> None:
        """One last scrape, the file closed, the process gone (killed after 30 s)."""
        self._t0.value = self._t0.value or t0_ns
        self._stop.set()
        self._proc.join(30)
        killed = self._proc.is_alive()
        if killed:
            self._proc.kill()
            self._proc.join(5)
        report = self.report(killed)
        tmp = self.path.with_name(REPORT_NAME + ".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.path.with_name(REPORT_NAME))

    def report(self, killed: bool = False) -> dict[str, Any]:
        """What the scraper did, and a warning line for each way it fell short."""
        scrapes, failures = self.scrapes, self.failures
        last = bytes(self._error.value).decode("utf-8", "replace") or None
        warnings = []
        if self.baseline_failed:
            warnings.append(
                "server metrics: the baseline scrape before t0 failed; the first scrape after "
                "t0, if any, is the baseline, so the server's counters miss the requests that "
                "ended before it"
            )
        elif self.was_ready is False:
            warnings.append(
                f"server metrics: the scraper was not ready within {self.ready_timeout_s:g} s "
                "when the run started; its baseline scrape may come after t0"
            )
        if failures:
            warnings.append(
                f"server metrics: {failures} of {scrapes + failures} scrapes failed"
                + (f" (last: {last})" if last else "")
            )
        if killed:
            warnings.append("server metrics: the scraper did not stop within 30 s and was killed")
        if not scrapes:
            warnings.append("server metrics: no scrape succeeded; the run has no server metrics")
        return {
            "scrapes": scrapes,
            "failures": failures,
            "last_error": last,
            "ready": self.was_ready,
            "warnings": warnings,
        }

    @property
    def scrapes(self) -> int:
        return int(self._counts[0])

    @property
    def failures(self) -> int:
        return int(self._counts[1])


def scrape_report(run_dir: Path) -> dict[str, Any]:
    """The run's `scrape` entry and `scrape_warnings` from the scraper's report, if it ran."""
    path = run_dir / REPORT_NAME
    if not path.exists():
        return {}
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {
            "scrape_warnings": [f"server metrics: the scraper's report {REPORT_NAME} is unreadable"]
        }
    warnings = [str(w) for w in report.pop("warnings", [])]
    return {"scrape": report, "scrape_warnings": warnings}
