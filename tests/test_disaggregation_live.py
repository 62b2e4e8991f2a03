"""Prefill/decode disaggregation on the real-time server (issue 34 item 1).

`target: reference` with `scheduler.disaggregation` runs the simulator's two pools and KV link
on the wall clock (reference_scheduler/drivers/realtime_disaggregated.py). These tests hold what
a user reads off such a run: every request's KV transfer takes the link's latency plus its
jitter plus bytes over bandwidth, the TTFT components the server reports fit inside the TTFT the
client measured, and a live run and a simulated run of one plan split TTFT alike.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fairbench.pipeline import run_scenario
from fairbench.run.rundir import RunOptions
from fairbench.workload.loading import parse_scenario
from fairbench.workload.models import Scenario
from reference_scheduler.scheduler.config import SchedulerConfigError
from reference_scheduler.server.config import parse_server_config

LATENCY_MS = 60.0
JITTER_MS = 5.0  # constant: every transfer's stall
PARTS = ("queue_time_ns", "prefill_ns", "kv_transfer_ns", "decode_wait_ns")


def pd_scenario(kind: str) -> Scenario:
    return parse_scenario(
        {
            "name": f"pd-{kind}",
            "workloads": {
                "chat": {"endpoint": "chat", "prompt_tokens": 200, "output_tokens": 8},
            },
            "tenants": [
                {"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": "6/s"}},
                {"id": "b", "mix": "chat", "arrival": {"process": "poisson", "rate": "4/s"}},
            ],
            "run": {"duration": "5s", "seed": 3},
            "target": {"kind": kind},
            "scheduler": {
                "policy": "fifo",
                "profile": "h100-llama3-8b",
                "disaggregation": {
                    "prefill_replicas": 1,
                    "decode_replicas": 1,
                    "kv_transfer": {
                        "bandwidth": "50GB/s",
                        "latency": f"{LATENCY_MS:g}ms",
                        "jitter": {"dist": "constant", "value": f"{JITTER_MS:g}ms"},
                    },
                },
            },
        }
    )


def run_records(tmp_path: Path, kind: str) -> pd.DataFrame:
    outcome = run_scenario(
        pd_scenario(kind), RunOptions(out=tmp_path / kind, workers=1, progress=False)
    )
    assert outcome.summary["accounting"]["holds"]
    return pd.read_parquet(tmp_path / kind / "records.parquet").set_index("request_id")


def test_the_live_server_splits_ttft_into_its_pd_components(tmp_path: Path) -> None:
    live = run_records(tmp_path, "reference")
    ok = live[live["status"] == "ok"]
    assert len(ok) >= 0.9 * len(live) and len(ok) >= 30
    for part in PARTS:
        assert ok[part].notna().all(), part
        assert (ok[part] >= 0).all(), part
    # 200 tokens of Llama-3-8B KV (128 KiB a token) over 50 GB/s: about 0.5 ms on the wire
    kv_ms = ok["kv_transfer_ns"] / 1e6
    floor = LATENCY_MS + JITTER_MS
    assert (kv_ms >= floor - 0.01).all(), kv_ms.min()
    assert kv_ms.median() < floor + 10, kv_ms.median()  # wall-clock wake-ups, not another model
    ttft = ok["t_first_token_ns"] - ok["t_intended_ns"]
    inside = ok[list(PARTS)].sum(axis=1)
    assert (inside <= ttft).all(), (ttft - inside).min()


def test_a_live_and_a_simulated_run_of_one_plan_split_ttft_alike(tmp_path: Path) -> None:
    live = run_records(tmp_path, "reference")
    sim = run_records(tmp_path, "sim")
    assert list(live.index) == list(sim.index)
    both = live.index[(live["status"] == "ok") & (sim["status"] == "ok")]
    assert len(both) >= 30
    for part in ("prefill_ns", "kv_transfer_ns", "decode_wait_ns"):
        diff_ms = (live.loc[both, part] - sim.loc[both, part]).abs().median() / 1e6
        assert diff_ms < 5.0, (part, diff_ms)


def test_the_server_refuses_a_bound_decode_admission_in_one_line() -> None:
    """`reserve` and `kv_aware` run in the simulator only: the server says so, naming the field,
    rather than running `pooled` under another name."""
    block = {"disaggregation": {"decode_replicas": 2, "decode_admission": "kv_aware"}}
    with pytest.raises(SchedulerConfigError) as error:
        parse_server_config({"scheduler": block})
    assert len(error.value.lines) == 1
    assert error.value.lines[0].startswith("scheduler.disaggregation.decode_admission:")
    parse_server_config({"scheduler": {"disaggregation": {"decode_admission": "pooled"}}})
