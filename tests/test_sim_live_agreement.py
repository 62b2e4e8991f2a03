"""`target: sim` and the live reference server agree on every request's fate.

One noise-free plan (constant arrivals, a constant-step cost model, one batch slot, FIFO) is run
through the simulator and through the real-time reference server. The plan is built so that
each request's fate has a wide margin (hundreds of milliseconds, several engine steps) from the
instant that decides it, so the server's step lag cannot flip a status:

- phase 1, eight interactive requests 20 ms apart, 10 tokens each (800 ms of service at 80 ms
  a step, few steps so that the server's per-step lag adds up to little): the
  first five finish; the sixth is mid-stream at its 4.4 s timeout; the last two time out in the
  queue (and are cancelled in the engine, freeing the slot);
- phase 2, five batch requests 100 ms apart, 20 tokens planned: admission degrades those that
  arrive with a queue (`degrade_depth: 1`) to 10 tokens; the grace period (4.1 s after the last
  send) ends with one mid-stream and one still queued, both cancelled.

Statuses and served token counts must be equal request by request; the timing differences are
printed (the server runs on a loaded machine's wall clock, so they are recorded, not bounded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fairbench.analysis.blocks import unloaded_ns
from fairbench.pipeline import run_scenario
from fairbench.plan.materialize import materialize
from fairbench.run.rundir import RunOptions
from fairbench.targets.sim import run_sim
from fairbench.workload.loading import parse_scenario
from fairbench.workload.models import Scenario
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import parse_scheduler_config

STEP_MS = 80


def agreement_scenario(kind: str) -> Scenario:
    return parse_scenario(
        {
            "name": f"agree-{kind}",
            "workloads": {
                "short": {"endpoint": "chat", "prompt_tokens": 32, "output_tokens": 10},
                "long": {
                    "endpoint": "chat",
                    "prompt_tokens": 32,
                    "output_tokens": 20,
                    "slo_class": "batch",
                },
            },
            "tenants": [
                {
                    "id": "alpha",
                    "mix": "short",
                    "arrival": {
                        "process": "onoff",
                        "rate": "50/s",
                        "on": "0.16s",
                        "off": "60s",
                        "within": "constant",
                    },
                },
                {
                    "id": "beta",
                    "slo_class": "batch",
                    "mix": "long",
                    "arrival": {"process": "constant", "rate": "10/s"},
                    "phases": [{"start": 0, "end": 5.9, "multiplier": 0}],
                },
            ],
            "run": {"duration": "6.35s", "seed": 1, "timeout": "4.4s", "grace": "4.1s"},
            "target": {"kind": kind},
            "scheduler": {
                "policy": "fifo",
                "profile": {
                    "name": "step80",
                    "constant_step_ms": STEP_MS,
                    "kv_cache_tokens": 100000,
                    "max_num_seqs": 1,
                },
                "admission": {"degrade_depth": 1, "degrade_max_tokens": 10},
            },
        }
    )


EXPECTED = (
    ["ok"] * 5 + ["timeout"] * 3 + ["ok"] * 3 + ["cancelled"] * 2
)  # by request id, as the margins above decide


def records(tmp_path: Path, kind: str) -> pd.DataFrame:
    outcome = run_scenario(
        agreement_scenario(kind), RunOptions(out=tmp_path / kind, workers=1, progress=False)
    )
    assert outcome.summary["accounting"]["holds"]
    return pd.read_parquet(tmp_path / kind / "records.parquet").set_index("request_id")


def test_sim_and_reference_agree_on_every_status(tmp_path: Path) -> None:
    sim = records(tmp_path, "sim").sort_index()
    live = records(tmp_path, "reference").sort_index()
    assert list(sim["status"]) == EXPECTED  # the plan does what it was built to do
    assert list(live["status"]) == list(sim["status"])
    ok = sim["status"] == "ok"
    assert list(live.loc[ok, "output_tokens"]) == list(sim.loc[ok, "output_tokens"])
    # degradation: planned 20 tokens stays the record's max_tokens; 10 were served
    assert list(sim.loc[8:10, "output_tokens"]) == [20, 20, 10]
    assert set(sim["max_tokens"].loc[8:]) == set(live["max_tokens"].loc[8:]) == {20}
    # a cut-off request has no t_done and keeps what it received before the cut
    cut = sim["status"] != "ok"
    assert sim.loc[cut, "t_done_ns"].isna().all() and live.loc[cut, "t_done_ns"].isna().all()
    assert sim.loc[5, "output_tokens"] > 0 and sim.loc[11, "output_tokens"] > 0
    assert (sim.loc[[6, 7, 12], "output_tokens"] == 0).all()
    assert set(sim.loc[sim["status"] == "timeout", "error_detail"]) == {
        "no terminal event within 4.4s"
    }
    # recorded, not bounded: how far the wall-clock server ran behind the simulator
    diffs: dict[str, Any] = {}
    for column in ("t_first_token_ns", "t_done_ns"):
        delta = (live.loc[ok, column] - sim.loc[ok, column]) / 1e6
        diffs[column] = [round(float(x), 1) for x in delta]
    print(f"\nlive - sim (ms) for the ok requests {list(sim.index[ok])}: {diffs}")
    tokens = live.loc[cut, "output_tokens"] - sim.loc[cut, "output_tokens"]
    print(f"live - sim tokens received by the cut-off requests: {tokens.to_dict()}")


def test_sim_is_deterministic_to_the_byte() -> None:
    scn = agreement_scenario("sim")
    plan = materialize(scn)
    first, info = run_sim(plan, scn)
    second, _ = run_sim(plan, scn)
    assert repr(first) == repr(second)
    assert info["steps"] == run_sim(materialize(scn), scn)[1]["steps"]


def test_grace_and_timeout_bound_what_the_sim_lets_finish() -> None:
    """With a generous timeout and grace the same plan runs to completion (nothing is cut),
    so the cut-offs above are the run's settings at work, not the simulator's."""
    scn = agreement_scenario("sim")
    relaxed = scn.model_copy(
        update={"run": scn.run.model_copy(update={"timeout": 600.0, "grace": 60.0})}
    )
    rows, _ = run_sim(materialize(relaxed), relaxed)
    assert {r["status"] for r in rows} == {"ok"}


def test_a_timed_out_job_stops_holding_capacity_in_the_sim() -> None:
    """One slot, 10 ms steps. A (100 tokens, 1 s of service) times out at 0.5 s; B (5 tokens)
    arrived at 0.3 s behind it. Cancelled in the engine at 0.5 s, A frees the slot and B is done
    by 0.55 s, inside its own 0.8 s deadline; had A kept the slot, B would wait until 1 s."""
    config = parse_scheduler_config(
        {
            "policy": "fifo",
            "profile": {"constant_step_ms": 10.0, "kv_cache_tokens": 10000, "max_num_seqs": 1},
        }
    )
    a = Job(0, "t", "interactive", 4, 100, 0)
    b = Job(1, "t", "interactive", 4, 5, 300_000_000)
    result = simulate([a, b], config, timeout_ns=500_000_000, stop_ns=10_000_000_000)
    assert a.status == "cancelled" and a.done_ns == 500_000_000
    assert b.status == "finished" and b.admit_ns == 500_000_000 and b.done_ns == 550_000_000
    assert result.end_ns == b.done_ns


def _overhead_scenario(
    overhead_ms: float, output_tokens: int, timeout: str, rate: str = "2/s", slots: int = 256
) -> Scenario:
    return parse_scenario(
        {
            "name": "overhead",
            "workloads": {
                "w": {"endpoint": "chat", "prompt_tokens": 32, "output_tokens": output_tokens}
            },
            "tenants": [{"id": "t", "mix": "w", "arrival": {"process": "constant", "rate": rate}}],
            "run": {"duration": "3s", "seed": 1, "timeout": timeout, "grace": "5s"},
            "target": {"kind": "sim"},
            "scheduler": {
                "policy": "fifo",
                "profile": {
                    "constant_step_ms": 5.0,
                    "kv_cache_tokens": 100000,
                    "request_overhead_ms": overhead_ms,
                    "max_num_seqs": slots,
                },
            },
        }
    )


def test_the_profiles_request_overhead_is_in_every_simulated_latency() -> None:
    """A profile's `request_overhead_ms` (what `fairbench profile` fits as the time outside
    the engine's steps in every TTFT) delays each request's arrival at the simulated engine:
    with the engine idle between requests, every first token and every end come exactly that
    much later, while the send stays the planned one; and a client's timeout still runs from
    the send, not from the engine's arrival."""
    base, slow = (_overhead_scenario(ms, 10, "60s") for ms in (0.0, 40.0))
    plan = materialize(base)
    assert plan.digest == materialize(slow).digest  # the plan does not change
    fast_rows, _ = run_sim(plan, base)
    slow_rows, _ = run_sim(plan, slow)
    assert len(fast_rows) == len(slow_rows) == len(plan) > 3
    for f, s in zip(fast_rows, slow_rows, strict=True):
        assert f["status"] == s["status"] == "ok"
        assert f["t_sent_ns"] == s["t_sent_ns"] == f["t_intended_ns"]
        assert s["t_first_token_ns"] - f["t_first_token_ns"] == 40_000_000
        assert s["t_done_ns"] - f["t_done_ns"] == 40_000_000
    # One slot; 100 tokens of 5 ms steps take 0.5 s, past a 0.2 s timeout; a request every
    # 0.1 s. Each is cut 0.2 s after its send, on the client's side and in the engine, which
    # frees the slot then: the next request, waiting since its arrival, gets its first token
    # one step later (at 0.205 s after the first send, not 0.245 s, where the engine's clock
    # would have started at the delayed arrival).
    late = _overhead_scenario(40.0, 100, "0.2s", rate="10/s", slots=1)
    rows = run_sim(materialize(late), late)[0]
    for row in rows:
        assert row["status"] == "timeout"
        assert row["t_end_ns"] - row["t_sent_ns"] == 200_000_000
    assert rows[1]["t_first_token_ns"] - rows[0]["t_sent_ns"] == 205_000_000


def test_a_request_alone_pays_the_overhead_too() -> None:
    """Slowdown divides E2E by the latency alone: in a sim run both contain the profile's
    request overhead, so the basis grows by exactly it."""
    base, slow = (_overhead_scenario(ms, 10, "60s") for ms in (0.0, 40.0))
    df = pd.DataFrame(run_sim(materialize(base), base)[0])
    fast_ns, _ = unloaded_ns(df, base)
    slow_ns, _ = unloaded_ns(df, slow)
    assert np.all(slow_ns - fast_ns == pytest.approx(40e6))
