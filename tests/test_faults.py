"""Every injected fault ends as the right record; nothing is lost; stalls do not hold up sends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import parse_scenario
from tests.cli import run_cli

# fault kind -> (status, error kind) the generator must record
EXPECTED = {
    "stall_first_token": ("timeout", None),
    "stall_mid_stream": ("timeout", None),
    "slow_loris": ("timeout", None),
    "drop_mid_stream": ("error", "dropped"),
    "http_500": ("error", "http_5xx"),
    "overload_503": ("rejected", "overloaded"),
    "rate_limit_429": ("rejected", "rate_limited"),
    "bad_json": ("error", "bad_stream"),
    "missing_done": ("error", "stream_incomplete"),
    "truncated_event": ("error", "stream_incomplete"),
}


def test_every_fault_becomes_the_right_record(tmp_path: Path) -> None:
    tenants = [
        {
            "id": kind.replace("_", "-"),
            "mix": "chat",
            "arrival": {"process": "constant", "rate": "4/s"},
        }
        for kind in EXPECTED
    ]
    tenants.append(
        {"id": "control", "mix": "chat", "arrival": {"process": "poisson", "rate": "10/s"}}
    )
    rules = [
        {
            "kind": kind,
            "rate": 1.0,
            "tenants": [kind.replace("_", "-")],
            "seconds": 5,
            "retry_after_s": 2,
            "bytes_per_s": 40,
        }
        for kind in EXPECTED
    ]
    scenario = {
        "name": "faults",
        "workloads": {"chat": {"endpoint": "chat", "prompt_tokens": 20, "output_tokens": 8}},
        "tenants": tenants,
        "run": {"duration": "3s", "timeout": "1500ms", "grace": "10s", "seed": 4},
        "target": {"kind": "reference", "faults": {"seed": 1, "rules": rules}},
        "scheduler": {"policy": "fifo"},
    }
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "run"
    result = run_cli("run", str(path), "--out", str(out), "--quiet", "--workers", "1")
    assert result.returncode in (0, 1), result.stderr
    records = pd.read_parquet(out / "records.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting"]["holds"]
    by_tenant = records.groupby("tenant")
    for kind, (status, error_kind) in EXPECTED.items():
        rows = by_tenant.get_group(kind.replace("_", "-"))
        assert set(rows["status"]) == {status}, (kind, rows["status"].tolist())
        got = set(rows["error_kind"].where(rows["error_kind"].notna(), None))
        if status != "timeout":
            assert got == {error_kind}, (kind, got)
        if status == "rejected":
            assert set(rows["retry_after_s"]) == {2.0}
    control = by_tenant.get_group("control")
    assert set(control["status"]) == {"ok"}
    # A stalled server must not hold up the schedule: everything went out, nothing early, and
    # while each stalled request waited for its timeout the control tenant kept sending.
    # (How late sends may be is the benchmarks' question, bench_reliability.py; not a test's.)
    assert records["t_sent_ns"].notna().all()
    assert (records["t_sent_ns"] >= records["t_intended_ns"]).all()
    control_sent = control["t_sent_ns"].to_numpy()
    stalls = by_tenant.get_group("stall-first-token")
    early = stalls[stalls["t_intended_ns"] < 1.5e9]  # their 1.5 s wait lies inside the 3 s plan
    assert len(early) >= 5
    for _, row in early.iterrows():
        waiting = (control_sent > row["t_sent_ns"]) & (control_sent < row["t_intended_ns"] + 1.5e9)
        assert waiting.any(), row["request_id"]
    # The lag is measured from the records and reported.
    lag_ms = (records["t_sent_ns"] - records["t_intended_ns"]).to_numpy() / 1e6
    reported = summary["generator_health"]["send_lag_ms"]
    assert reported["max"] == pytest.approx(lag_ms.max(), abs=1e-4)
    assert reported["p99"] == pytest.approx(np.percentile(lag_ms, 99), abs=1e-4)
    # What the server injected is what the generator recorded, kind by kind.
    metrics = pd.read_parquet(out / "server_metrics.parquet")
    injected = metrics[metrics["metric"] == "scheduler_faults_injected_total"]
    last = injected[injected["t_ns"] == injected["t_ns"].max()]
    counts = {
        json.loads(lbl)["kind"]: v for lbl, v in zip(last["labels"], last["value"], strict=True)
    }
    for kind in EXPECTED:
        assert counts.get(kind) == len(by_tenant.get_group(kind.replace("_", "-"))), kind


def test_fault_config_errors_are_one_line() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(
            {
                "workloads": {"c": {"prompt_tokens": 5}},
                "tenants": [{"id": "a", "mix": "c", "arrival": {"process": "poisson", "rate": 1}}],
                "run": {"duration": "5s"},
                "target": {
                    "kind": "reference",
                    "faults": {"rules": [{"kind": "gremlins", "rate": 2}]},
                },
            }
        )
    lines = info.value.lines
    assert any(line.startswith("target.faults.rules[0].kind: must be one of") for line in lines)
    assert "target.faults.rules[0].rate: must be <= 1.0, got 2" in lines
