"""The simulator at fleet speed (issue 35): what it skips must not change what it reports.

Behaviour and equivalence only, no timing (speed is measured by benchmarks/bench_sim.py): the
isolation solo arms run when `analysis.isolation` asks and say so when skipped; in parallel
processes they give the serial answer; a simulated run writes no journal and loses no record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fairbench import pipeline
from fairbench.analysis.isolation import AUTO_MAX_REQUESTS, skip_reason
from fairbench.plan.materialize import materialize
from fairbench.report.markdown import why_none
from fairbench.run.rundir import RunOptions
from fairbench.workload.loading import parse_scenario


def _scenario(isolation: str | None = None, duration: str = "20s") -> dict:
    """Two tenants, one bursty, on one replica: small, contended, and quick to simulate."""
    data: dict = {
        "name": "sim-speed",
        "workloads": {
            "chat": {
                "endpoint": "chat",
                "prompt_tokens": {"dist": "lognormal", "median": 100, "p99": 800},
                "output_tokens": {"dist": "exponential", "mean": 150, "max": 1000},
            }
        },
        "tenants": [
            {"id": "bursty", "mix": "chat", "arrival": {"process": "poisson", "rate": "30/s"}},
            {"id": "steady", "mix": "chat", "arrival": {"process": "poisson", "rate": "8/s"}},
        ],
        "run": {"duration": duration, "seed": 3},
        "target": {"kind": "sim"},
        "scheduler": {"policy": "vtc", "profile": "h100-llama3-8b"},
    }
    if isolation is not None:
        data["analysis"] = {"isolation": isolation}
    return data


def _run(tmp_path: Path, name: str, isolation: str | None) -> tuple[Path, dict]:
    scn = parse_scenario(_scenario(isolation))
    outcome = pipeline.run_scenario(scn, RunOptions(out=tmp_path / name, progress=False))
    return outcome.run_dir, outcome.summary


def test_skip_reason_follows_the_setting_and_the_size() -> None:
    assert skip_reason("on", 10 * AUTO_MAX_REQUESTS, simulated=True) is None
    assert skip_reason("auto", AUTO_MAX_REQUESTS, simulated=True) is None
    above = skip_reason("auto", AUTO_MAX_REQUESTS + 1, simulated=True)
    assert above is not None and "analysis.isolation: on" in above
    off = skip_reason("off", 10, simulated=True)
    assert off is not None and "off" in off
    assert skip_reason("off", 10, simulated=False) is None  # live: no solo arm to skip


def test_isolation_off_skips_the_arms_and_says_so(tmp_path: Path) -> None:
    _, auto = _run(tmp_path, "auto", None)
    _, off = _run(tmp_path, "off", "off")
    assert auto["fairness"]["solo_ttft_p99_ms"]  # small: auto ran the arms
    assert "isolation_skipped" not in auto["fairness"]
    assert auto["metrics"]["overall"]["isolation"]["value"] is not None
    assert off["fairness"]["solo_ttft_p99_ms"] == {}
    assert off["metrics"]["overall"]["isolation"]["value"] is None
    assert off["fairness"]["isolation_skipped"] == skip_reason("off", 1, True)
    assert why_none(off, "isolation") == off["fairness"]["isolation_skipped"]
    # every other figure is the same: only the solo arms were skipped
    for key in ("overall", "tenants", "accounting", "completion"):
        assert off[key] == auto[key]


def test_solo_arms_in_parallel_processes_give_the_serial_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scn = parse_scenario(_scenario(duration="5s"))
    plan = materialize(scn)
    serial = pipeline.solo_ttft_p99(plan, scn, workers=1)
    monkeypatch.setattr(pipeline, "PARALLEL_MIN_REQUESTS", 0)
    parallel = pipeline.solo_ttft_p99(plan, scn, workers=2)
    assert set(serial) == {"bursty", "steady"}
    assert parallel == serial


def test_a_simulated_run_writes_records_and_no_journal(tmp_path: Path) -> None:
    run_dir, summary = _run(tmp_path, "run", "off")
    assert not list(run_dir.glob("journal*.jsonl"))
    records = pd.read_parquet(run_dir / "records.parquet")
    plan = pd.read_parquet(run_dir / "plan.parquet")
    assert len(records) == len(plan) == summary["accounting"]["planned"]
    assert sorted(records["request_id"]) == list(range(len(plan)))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"


def test_progress_counts_ended_requests_and_virtual_time_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """The bar's feed: ended requests rise to the planned count, virtual time never goes back,
    the last word is the summary's; and the records are those of a run nobody watched."""
    scn = parse_scenario(_scenario("off", duration="60s"))
    seen: list[tuple[int, int, float, str, str]] = []

    def watch(c: object) -> None:
        seen.append((c.done, c.planned, c.virtual_s, c.phase, c.line))  # type: ignore[attr-defined]

    watched = pipeline.run_scenario(scn, RunOptions(out=tmp_path / "a", progress=True), watch)
    quiet = pipeline.run_scenario(scn, RunOptions(out=tmp_path / "b", progress=False))
    planned = watched.summary["accounting"]["planned"]
    assert len(seen) >= 3  # at least one mid-run report, the end, and the summary
    assert all(p == planned for _, p, _, _, _ in seen)
    done = [d for d, _, _, _, _ in seen]
    virtual = [v for _, _, v, _, _ in seen]
    assert done == sorted(done) and virtual == sorted(virtual)
    assert 0 < done[0] < planned and done[-1] == planned
    assert "virtual" in seen[0][4] and "ETA" in seen[1][4]
    assert seen[-1][3] == seen[-1][4] == "summarising"
    a = pd.read_parquet(watched.run_dir / "records.parquet")
    b = pd.read_parquet(quiet.run_dir / "records.parquet")
    pd.testing.assert_frame_equal(a, b)
