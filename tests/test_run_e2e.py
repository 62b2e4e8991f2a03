"""`fairbench run` end to end, as a user runs it: real processes, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fairbench.pipeline import load_partial_run
from tests.cli import run_cli, start_cli


def scenario_file(
    tmp_path: Path, kind: str, duration: str = "3s", rate: str = "20/s", output: int = 8
) -> Path:
    data = {
        "name": f"e2e-{kind}",
        "workloads": {
            "chat": {"endpoint": "chat", "prompt_tokens": 40, "output_tokens": output},
            "emb": {"endpoint": "embeddings", "prompt_tokens": 64},
        },
        "tenants": [
            {
                "id": "alpha",
                "api_key": "sk-secret-alpha",
                "weight": 2,
                "mix": "chat",
                "arrival": {"process": "poisson", "rate": rate},
            },
            {
                "id": "beta",
                "slo_class": "batch",
                "mix": {"chat": 1, "emb": 1},
                "arrival": {"process": "constant", "rate": "5/s"},
            },
        ],
        "run": {"duration": duration, "seed": 3, "grace": "5s", "timeout": "20s"},
        # these tests judge the run directory, sharding and determinism, not this machine's
        # load: the generator's validity has tests of its own (tests/test_health.py)
        "health": {
            "max_send_lag_p99": "10s",
            "max_receive_error_p99": "10s",
            "min_rate_ratio": 0.5,
        },
        "target": {"kind": kind},
        "scheduler": {"policy": "vtc", "profile": "h100-llama3-8b"},
    }
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("kind", ["reference", "sim"])
def test_run_writes_a_complete_run_directory(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "run"
    result = run_cli("run", str(scenario_file(tmp_path, kind)), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr + result.stdout
    # --quiet: no tables, the run directory (a VALID run has nothing loud to say)
    assert result.stdout.strip().splitlines() == [f"run directory: {out}"], result.stdout
    for name in ("scenario.yaml", "plan.parquet", "records.parquet", "summary.json", "run.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    header = json.loads((out / "run.json").read_text())
    records = pd.read_parquet(out / "records.parquet")
    assert summary["valid"] and summary["accounting"]["holds"]
    assert header["plan_digest"] == summary["plan_digest"] and header["status"] == "complete"
    assert len(records) == header["planned"] == summary["accounting"]["planned"]
    assert set(records["status"]) == {"ok"}
    assert set(summary["tenants"]) == {"alpha", "beta"}
    assert summary["tenants"]["alpha"]["latency_ms"]["ttft"]["p50"] > 0
    if kind == "reference":
        assert (out / "server_metrics.parquet").is_file()
        metrics = pd.read_parquet(out / "server_metrics.parquet")
        assert "scheduler_wait_time_seconds_count" in set(metrics["metric"])
    # API keys never reach the run directory
    for path in out.iterdir():
        if path.is_file():
            assert b"sk-secret-alpha" not in path.read_bytes(), path.name


def test_two_worker_processes_share_t0_and_merge_by_request_id(tmp_path: Path) -> None:
    out = tmp_path / "sharded"
    path = scenario_file(tmp_path, "reference", duration="3s", rate="40/s")
    result = run_cli("run", str(path), "--out", str(out), "--quiet", "--workers", "2")
    assert result.returncode == 0, result.stderr + result.stdout
    assert sorted(p.name for p in out.glob("journal-*.jsonl")) == [
        "journal-0.jsonl",
        "journal-1.jsonl",
    ]
    records = pd.read_parquet(out / "records.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting"]["holds"] and set(records["worker"]) == {0, 1}
    assert records["request_id"].is_unique and (records["status"] == "ok").all()
    # the parent scrapes the server for all shards: a baseline before any request ends
    metrics = pd.read_parquet(out / "server_metrics.parquet")
    scrapes = sorted(metrics["t_ns"].unique())
    assert scrapes[0] < records["t_done_ns"].min() and len(scrapes) >= 3
    served = metrics[metrics["metric"] == "scheduler_throughput_tokens_total"]
    assert served[served["t_ns"] == scrapes[-1]]["value"].sum() == records["output_tokens"].sum()
    # both shards aimed at the same clock: intended times are the plan's offsets
    from fairbench.plan.model import load_plan

    offsets = load_plan(out / "plan.parquet").columns["offset_ns"]
    assert (records.sort_values("request_id")["t_intended_ns"].to_numpy() == offsets).all()


def test_same_seed_same_plan_digest_and_sim_results(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, "sim")
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        assert run_cli("run", str(path), "--out", str(out), "--quiet").returncode == 0
    a, b = (pd.read_parquet(out / "records.parquet") for out in runs)
    assert a.equals(b)


def _journal_rows(run_dir: Path) -> list[dict]:
    rows = []
    for journal in run_dir.glob("journal*.jsonl"):
        for line in journal.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written right now
                rows.append(json.loads(line))
    return rows


def start_run(path: Path, out: Path, **popen: object) -> subprocess.Popen[str]:
    """`fairbench run` in its own process, one generator worker, as a user would start it."""
    return start_cli("run", str(path), "--out", str(out), "--quiet", "--workers", "1", **popen)


def test_kill_9_loses_at_most_the_last_second(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    path = scenario_file(tmp_path, "reference", duration="30s", rate="20/s", output=4)
    proc = start_run(
        path, out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    # Estimate t0 from the first flushed record: t0 <= seen_at - t_done (it was done before seen).
    deadline = time.monotonic() + 60
    t0_upper = None
    while time.monotonic() < deadline:
        rows = _journal_rows(out)
        if rows and t0_upper is None:
            seen = time.perf_counter_ns()
            t0_upper = min(seen - r["t_done_ns"] for r in rows if r["t_done_ns"] is not None)
        if len(rows) >= 60:
            break
        time.sleep(0.02)
    assert t0_upper is not None
    kill_rel = time.perf_counter_ns() - t0_upper  # a lower bound on the kill time (run clock)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    outcome = load_partial_run(out)
    summary = outcome.summary
    assert summary["incomplete"] and not summary["valid"]
    assert any("incomplete run" in r for r in summary["invalid_reasons"])
    records = pd.read_parquet(out / "records.parquet")
    recovered = set(records["request_id"])
    from fairbench.plan.model import load_plan

    plan = load_plan(out / "plan.parquet")
    # Each response takes well under 0.5 s here; anything intended more than 1.5 s before the
    # kill was done at least 1 s before it, and must have reached the disk.
    must = [i for i, t in enumerate(plan.columns["offset_ns"]) if t + 1.5e9 <= kill_rel]
    assert must and set(must) <= recovered
    assert summary["accounting"]["missing"] == len(plan) - len(recovered)


def test_ctrl_c_gives_a_clean_partial_run(tmp_path: Path) -> None:
    out = tmp_path / "interrupted"
    path = scenario_file(tmp_path, "reference", duration="60s", rate="10/s")
    proc = start_run(path, out, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_journal_rows(out)) < 15:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting"]["holds"]
    assert summary["accounting"]["counts"]["cancelled"] > 100  # most of the minute never ran
    assert not summary["valid"]
    assert any("stopped" in r for r in summary["invalid_reasons"])
    assert "INVALID" in stdout


def test_closed_loop_runs_say_so(tmp_path: Path) -> None:
    data = yaml.safe_load(scenario_file(tmp_path, "reference", duration="2s").read_text())
    data["run"]["concurrency_cap"] = 1
    data["tenants"][0]["headers"] = {"X-Team": "alpha"}
    path = tmp_path / "closed.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "closed"
    result = run_cli("run", str(path), "--out", str(out), "--quiet")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["closed_loop"] is True
    assert summary["generator_health"]["closed_loop"]["concurrency_cap"] == 1
    assert "CLOSED LOOP" in result.stdout
    records = pd.read_parquet(out / "records.parquet")
    lag = records["t_sent_ns"] - records["t_intended_ns"]
    assert lag.max() > 50_000_000  # one slot: later arrivals waited for it


def test_out_refuses_a_directory_that_holds_a_run(tmp_path: Path) -> None:
    """Appending to another run's journal would merge two runs into one broken one."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "journal.jsonl").write_text("")
    proc = run_cli("run", "scenarios/quickstart.yaml", "--out", str(out), "--quiet")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == f"--out {out} already holds a run; choose a new directory or remove it"
    )
    assert "Traceback" not in proc.stderr
