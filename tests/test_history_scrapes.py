"""`history import` of text scrape files (prometheus_client's parser): TTFT histograms become p99
points, other histograms in the same scrape stay out, queue gauges are summed over pods and
kept per tenant, and a scrape without a time is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from fairbench.history import store
from fairbench.history.errors import HistoryError
from fairbench.history.prometheus import entries, histogram_quantile

REPO = Path(__file__).resolve().parents[1]
BUCKETS = (0.1, 0.25, 0.5, 1.0)
T0 = 1_800_000_000


def _scrapes(tmp_path: Path, n: int = 8, every: int = 900) -> list[Path]:
    """Scrapes every 15 minutes of one registry that keeps observing: a TTFT histogram, the
    scheduler's wait histogram (far slower, must not leak into TTFT), queue gauges."""
    reg = CollectorRegistry()
    ttft = Histogram(
        "vllm:time_to_first_token_seconds", "TTFT", ["pod"], buckets=BUCKETS, registry=reg
    )
    wait = Histogram("scheduler_wait_time_seconds", "wait", buckets=BUCKETS, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["pod"], registry=reg)
    by = Gauge("scheduler_queue_depth_by", "by", ["dimension", "name"], registry=reg)
    paths = []
    for k in range(n):
        for pod in ("a", "b"):
            for _ in range(90):
                ttft.labels(pod).observe(0.05)
            for _ in range(10):
                ttft.labels(pod).observe(0.3)
            waiting.labels(pod).set(k % 3)
        for _ in range(100):
            wait.observe(5.0)  # all in +Inf: would move a mixed p99 to the last edge
        by.labels("tenant", "vip").set(1 + k % 2)
        path = tmp_path / f"{T0 + every * k}.prom"
        path.write_bytes(generate_latest(reg))
        paths.append(path)
    return paths


def test_scrape_files_become_points_without_other_histograms(tmp_path: Path) -> None:
    got = entries(_scrapes(tmp_path), "prod", 3600.0)
    ttft = [e for e in got if e.points[0][0] == "ttft_p99"]
    # 8 scrapes 15 min apart: increments from scrape 0 to 7 fall in hours 0 (4) and 1 (3)
    assert [e.started_at for e in ttft] == [T0 - T0 % 3600, T0 - T0 % 3600 + 3600]
    first = ttft[0].points[0]
    assert first[6] == 4 * 200 * 1  # four increments of 200 observations, both pods summed
    # 90% at 0.05, 10% at 0.3: p99 interpolated in (0.25, 0.5], never in the wait's +Inf
    value, low, high = histogram_quantile(
        [0.1, 0.25, 0.5, 1.0, float("inf")], [720, 720, 800, 800, 800], 0.99
    )
    assert first[2] == pytest.approx(value * 1e3) and 250 < first[2] <= 500
    assert first[3] == pytest.approx(low * 1e3) and first[4] == pytest.approx(high * 1e3)
    hour = ttft[0].started_at
    queue = {(p[0], p[1]): p[2] for e in got for p in e.points if e.started_at == hour}
    # pods a and b each set k % 3: the fleet's queue is their sum, 2 * (k % 3)
    hour0 = [2 * (k % 3) for k in range(8) if T0 + 900 * k < hour + 3600]
    assert queue[("queue_depth_mean", "overall")] == pytest.approx(sum(hour0) / len(hour0))
    assert ("queue_depth_mean", "tenant.vip") in queue
    db = tmp_path / "h.duckdb"
    assert store.add(db, got) == (len(got), 0)
    assert store.add(db, entries(_scrapes(tmp_path), "prod", 3600.0)) == (0, len(got))
    assert len(store.read(db, "queue_depth_var", "tenant.vip", "prod")) >= 2


def test_a_scrape_without_a_time_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "scrape.prom"
    path.write_text('vllm:num_requests_waiting{pod="a"} 3\n')
    with pytest.raises(HistoryError, match="no timestamp; name the file"):
        entries([path], "prod", 3600.0)
    stamped = tmp_path / "2026-12-03T12:00:00Z.prom"
    stamped.write_text('vllm:num_requests_waiting{pod="a"} 3\n')
    (e,) = entries([stamped], "prod", 3600.0)
    assert e.points[0][:3] == ("queue_depth_mean", "overall", 3.0)
    junk = tmp_path / "1800000000.prom"
    junk.write_text("this is { not an exposition\n")
    done = subprocess.run(
        [sys.executable, "-m", "fairbench.cli", "history", "import", str(junk), "--db",
         str(tmp_path / "h.duckdb")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "text exposition" in done.stderr and not (tmp_path / "h.duckdb").exists()
