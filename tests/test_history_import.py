"""`history import`: a Prometheus range-query export of TTFT histograms and queue lengths into
the store, p99 by histogram_quantile's interpolation with an interval no finer than the buckets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairbench.history import store
from fairbench.history.errors import HistoryError
from fairbench.history.prometheus import entries, histogram_quantile

REPO = Path(__file__).resolve().parents[1]
LES = ["0.1", "0.25", "0.5", "1", "+Inf"]


def _export(tmp_path: Path, hours: int = 3) -> Path:
    """Two pods' TTFT histograms scraped every 15 min (pod b resets once), and a queue gauge."""
    result = []
    per_step = {"0.1": 500, "0.25": 900, "0.5": 985, "1": 998, "+Inf": 1000}  # cumulative
    for pod in ("a", "b"):
        for le in LES:
            values, total = [], 0
            for k in range(hours * 4 + 1):
                total = 0 if (pod == "b" and k == 6) else total + per_step[le]
                values.append([1_800_000_000 + 900 * k, str(total)])
            result.append(
                {
                    "metric": {
                        "__name__": "vllm:time_to_first_token_seconds_bucket",
                        "le": le,
                        "pod": pod,
                    },
                    "values": values,
                }
            )
    queue = [[1_800_000_000 + 60 * k, str(k % 5)] for k in range(hours * 60)]
    result.append({"metric": {"__name__": "vllm:num_requests_waiting"}, "values": queue})
    path = tmp_path / "export.json"
    path.write_text(
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})
    )
    return path


def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    les = [0.1, 0.25, 0.5, 1.0, float("inf")]
    value, low, high = histogram_quantile(les, [500, 900, 985, 998, 1000], 0.99)
    # rank 990 lies in (0.5, 1]: 0.5 + 0.5 * (990 - 985) / (998 - 985)
    assert value == pytest.approx(0.5 + 0.5 * 5 / 13)
    # ranks 990 -/+ 1.96*sqrt(1000*0.99*0.01) = 983.8..996.2: buckets (0.25, 0.5] to (0.5, 1]
    assert (low, high) == (0.25, 1.0)
    _, low, high = histogram_quantile(les, [500_000, 900_000, 985_000, 998_000, 1_000_000], 0.99)
    assert (low, high) == (0.5, 1.0)  # many requests: the bucket alone bounds it
    value, _, high = histogram_quantile(les, [10, 20, 30, 40, 100], 0.99)
    assert value == 1.0 and high == float("inf")  # in +Inf: the last finite edge, no upper end


def test_an_export_becomes_hourly_points(tmp_path: Path) -> None:
    got = entries(_export(tmp_path), "prod", 3600.0)
    ttft = [e for e in got if e.points[0][0] == "ttft_p99"]
    assert len(ttft) == 3
    first = ttft[0].points[0]
    # hour 0: 4 increments per pod, 2 pods -> 8 x the per-step histogram, same shape
    assert first[2] == pytest.approx((0.5 + 0.5 * 5 / 13) * 1e3)
    assert first[3] <= first[2] <= first[4] and first[6] == 8000
    queue = [e for e in got if e.points[0][0] == "queue_depth_mean"]
    assert len(queue) == 3 and queue[0].points[0][2] == pytest.approx(2.0)
    db = tmp_path / "h.duckdb"
    assert store.add(db, got)[0] == len(got)
    assert store.add(db, entries(_export(tmp_path), "prod", 3600.0)) == (0, len(got))
    rows = store.read(db, "ttft_p99", "overall", "prod")
    assert [r.started_at for r in rows] == sorted(r.started_at for r in rows)


def test_bad_exports_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"status": "success", "data": {"resultType": "vector", "result": []}}')
    with pytest.raises(HistoryError, match="range-query"):
        entries(bad, "prod", 3600.0)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairbench.cli",
            "history",
            "import",
            str(bad),
            "--db",
            str(tmp_path / "h.duckdb"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
