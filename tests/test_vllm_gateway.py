"""The gateway on a real engine: FIFO, VTC and DWRR at the gateway, one vLLM, three pairs each,
and `fairbench compare`'s own verdict that VTC and DWRR protect the polite tenant.

The vLLM CPU build of tests/test_vllm_engine.py (skipped, with the reason, without
FAIRBENCH_VLLM_PYTHON) serves the tiny Llama of tests/engines/make_tiny_llama.py on one core;
`scenarios/gateway-vllm-vtc.yaml` puts the reference scheduler in front of it as a gateway
(`target: {kind: reference, upstreams: [...]}`), so fairbench starts the gateway itself, once
per run, with the run's policy. The engine is started once: only the gateway's policy changes
between runs. A polite chat tenant (2 req/s) shares it with a document flood for 8 s whose
rate is set from a probe of the engine (`fairbench profile`, two rounds) so the plan asks for
the engine's whole time by tests/engines/load.py's `engine_load` (a lower bound: really more):
12/s on the one-core VMs this test was sized on, where that was about 600 output tokens/s asked
of an engine that served 155–450, and 28.5/s on one whose engine stepped 2.5 times faster. So a
queue builds at the gateway, where the policy orders it (max_inflight = vLLM's
--max-num-seqs), whatever the core's speed: at a fixed 12/s that faster engine never queued.

The design. Three seeds, each one plan, each run under all three policies, the order rotated
(seed 1: F V D, seed 2: V D F, seed 3: D F V) so that drift in the engine's speed (the
neighbours' load on a shared box) hits every arm alike. `fairbench compare --a FIFO-s --b X-s`
(repeated for the three seeds) then pairs the runs by plan digest, and with k = 3 pairs its
interval is the hull of a hierarchical bootstrap and a t interval over the three per-pair
changes (fairbench/decide/compare.py): `better` only when that interval excludes 0 and the
change passes the metric's practical threshold. Nothing here re-derives significance.

What must hold:
- every run: valid; every planned request is accounted for (planned = ok + error + timeout +
  rejected + cancelled, no request missing or twice, records.parquet holds one row per planned
  request) and ended ok; the gateway's /metrics were scraped, its queue was not empty
  (otherwise the policy decided nothing), and whenever it held a queue the engine had its full
  budget in flight or had said it was full itself (its scraped waiting queue, KV use or a stale
  scrape: the gateway then holds back by design) — a policy can cost capacity only by idling
  the engine;
- compare's verdict on `ttft_p99.tenant.chat` is `better` for VTC over FIFO, and for DWRR over
  FIFO, and compare's printed table shows that verdict on the row;
- capacity, as the issue asks: total output throughput within 5% of FIFO's. The summary's
  figure (output tokens of the window's ok requests ÷ the window) cannot tell: with every
  request ending ok it counts what was asked, the same under any policy. What the engine did
  per second is tokens over the makespan (drain included), and that is what is held: the test
  fails where a challenger's paired change against FIFO (three seeds, a 95% t interval) lies
  wholly outside ±5% (`check_capacity`). A point bound on three runs would judge the engine's
  own speed: on a shared two-core box it once moved from 155 to 318 tokens/s between runs
  with the neighbours' load, and even on a quiet VM FIFO's three seeds spread 5.8%. Work
  conservation, above, is the reason a policy cannot cost more: it can only idle the engine,
  and every scrape of every run says it did not.

Why DWRR is expected to win too: the tenants' weights are equal (the default 1), and DWRR's
quantum is 1,024 tokens of cost (prompt + max_tokens; reference_scheduler/policies/dwrr.py).
A chat request costs 46–136, so one chat turn empties chat's queue, and a flood turn ends with
under Max + quantum = 1,872 of deficit, at most 5 documents of 348–848. Chat asks for ~180 of
cost per second against the flood's ~7,200: far under its half, so theory says chat's wait is
a few slot releases under DWRR (as under VTC, whose counter lift makes the returning chat
tenant the least served), while under FIFO it is the flood's whole backlog.

The run shape is what makes the verdict reliable: the old flood (8 req/s for 20 s) sat at the
engine's knee, where its FIFO chat p99 was 2.1 s in one run and the overload vanishes whenever
the engine runs fast; 12 req/s keeps the engine overloaded in every run here, so FIFO's chat
p99 is seconds and VTC's and DWRR's are under 1.2 s, a change of −89% or more in every pair.
8 s rather than 10 s keeps the test near its 5-minute budget on the loaded box (each run is
25–45 s with the drain and the run's own start and report).
Measured, 2026-12-01, on the shared two-core machine under a deliberate neighbour load (chat
TTFT p99 for seeds 1 / 2 / 3; compare's mean change and 95% interval):
- 12/s for 10 s, load average 8–10, 7 min 14 s: FIFO 19.3 / 22.4 / 8.1 s, VTC 1.02 / 0.68 /
  0.83 s (−93.8% [−102.9%, −84.7%], better), DWRR 1.20 / 0.65 / 0.84 s (−93.5% [−102.8%,
  −84.3%], better);
- as shipped, 12/s for 8 s, load average 6–7, 5 min 18 s: FIFO 15.9 / 14.4 / 11.9 s, VTC 0.86 /
  0.45 / 0.45 s (−95.9% [−98.9%, −92.9%], better), DWRR 0.70 / 0.49 / 0.81 s (−95.1% [−99.5%,
  −90.8%], better).
The summary's throughput was the same under every policy on each seed (688, 666, 586 tokens/s
as shipped: every request completed); tokens over the makespan moved from 155 to 318 between
runs with the neighbours' load. vLLM's own waiting queue stayed at 0 in every run.

The generator's health is relaxed (send lag p99 2 s, rate ratio 0.8): the gateway shares the
generator's core on a two-core box, and with the neighbours' load (load average 10 on two
cores) a DWRR run's sends were up to 1.2 s late (p99 1.35 s) while its engine took 2.4 times as
long as the FIFO run's before it. TTFT is from the intended send, so a late send counts against
the run it happened in, and compare's interval over three pairs carries it as noise; the
latencies judged are seconds. The receive-error check is relaxed to the run's timeout, i.e.
off: when a response's first two tokens arrive in one read, its bound is the whole span since
the previous read on the connection, which for a flood request that queued 10 s at the gateway
is the request's send. One VTC run read 10.5 s of "receive error" on 4 flood requests whose
receive delay was 1–3 ms; that bound says nothing about the polite tenant's stamps. This judges
the gateway; generator validity has tests of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fairbench.analysis import server_metrics as sm
from tests.cli import CLI, REPO
from tests.engines.load import operating_point, probe
from tests.engines.vllm_server import VLLMServer

SCENARIO = REPO / "scenarios" / "gateway-vllm-vtc.yaml"
POLITE = "chat"
MAX_INFLIGHT = 4  # the scenario's upstream budget, = the engine's --max-num-seqs
BASELINE = "fifo"
CHALLENGERS = ("vtc", "dwrr")
# one plan per seed; the order rotates so engine drift hits every policy alike
SCHEDULE = (
    (1, ("fifo", "vtc", "dwrr")),
    (2, ("vtc", "dwrr", "fifo")),
    (3, ("dwrr", "fifo", "vtc")),
)
RELAX = (
    "health.max_send_lag_p99=2s",
    "health.min_rate_ratio=0.8",
    "health.max_receive_error_p99=120s",  # = run.timeout: see the docstring
)
ROW = f"ttft_p99.tenant.{POLITE}"
# the flood's rate asks for this share of the probed engine (tests/engines/load.py). At 1.0 (the
# scenario's 12/s on the one-core VMs this test was sized on, 2026-12-01) the engine sat at its
# knee: on 2026-12-03 the probe found an engine six times slower (1.5-2/s), the 8 s flood was 12
# requests, FIFO's chat p99 only 1.5-3.4 s, and VTC over FIFO was −33% [−67%, +1%], "no
# significant change". At 1.5 the backlog grows by half the engine's time for all of the 8 s,
# whatever the core's speed, so FIFO's chat waits behind seconds of flood in every seed.
# Measured at 1.5 the same day, beside the full test suite: flood 3/s; chat p99 FIFO 9.0 / 7.6 /
# 7.9 s, VTC 2.1 / 1.5 / 1.6 s (−78.7% [−83.1%, −74.3%], better), DWRR 2.2 / 2.1 / 2.3 s
# (−73.3% [−79.9%, −66.8%], better); 5 min 30 s.
LOAD = 1.5
pytestmark = pytest.mark.engine


def off_the_engines_core() -> list[str]:
    """The generator and the gateway it starts run on the cores vLLM was not given
    (VLLMServer.confine gives it the first), so the engine's load is not what they measure."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or len(cores) > 8:
        return []
    return ["taskset", "-c", ",".join(str(c) for c in cores[1:])]


def summary_of(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def makespan_tokens_per_s(run: Path) -> float:
    """Output tokens served ÷ (the last request's end − the first request's send)."""
    records = pd.read_parquet(run / "records.parquet")
    span_ns = records["t_done_ns"].max() - records["t_sent_ns"].min()
    return float(records["output_tokens"].sum()) / (span_ns / 1e9)


def warm_up(url: str) -> None:
    """A few requests straight to the engine before t0, so the first run does not pay for the
    engine's first batches (its kernels for new shapes) alone."""
    words = " ".join(["kato"] * 600)
    for length in (50, 300, 600):
        body = {"model": "tiny", "prompt": " ".join(words.split()[:length]), "max_tokens": 8}
        request = urllib.request.Request(
            url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 200


def cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """fairbench as a user runs it: its own process, off the engine's core."""
    return subprocess.run(
        [*off_the_engines_core(), *CLI, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250"},  # compare's table unwrapped, one row a line
    )


def run_dir(out: Path, policy: str, seed: int) -> Path:
    return out / f"{policy}-{seed}"


def test_vtc_and_dwrr_at_the_gateway_protect_the_polite_tenant_on_vllm(
    tmp_path: Path, vllm_model: tuple[str, Path]
) -> None:
    python, model = vllm_model
    out = tmp_path / "runs"
    # Prefix caching off: every policy replays one plan per seed, so a later run's prompts are
    # an earlier run's, and with the cache on (the tiny model's KV cache holds every prompt of
    # a plan) their prefills were nearly free: 17% more throughput for whichever ran second.
    # The workload shares no prefixes, so the cache has nothing else to do here.
    no_cache = ("--no-enable-prefix-caching",)
    engine = VLLMServer(
        python, model, tmp_path / "vllm.log", max_num_seqs=MAX_INFLIGHT, extra=no_cache
    )
    with engine as server:
        warm_up(server.url)
        probe(cli, server.url, tmp_path / "probe.yaml")
        flood = operating_point(tmp_path / "probe.yaml", SCENARIO, "flood", LOAD)
        sys.stderr.write(f"operating point {flood} (load {LOAD:g})\n")
        sets = [f"target.upstreams.0.url={server.url}", flood, *RELAX]
        for seed, order in SCHEDULE:
            for policy in order:
                args = ["run", str(SCENARIO), "--quiet", "--seed", str(seed)]
                args += ["--out", str(run_dir(out, policy, seed))]
                for item in [*sets, f"scheduler.policy={policy}"]:
                    args += ["--set", item]
                proc = cli(*args, timeout=240)
                assert proc.returncode == 0, (
                    policy,
                    seed,
                    proc.stdout[-3000:],
                    proc.stderr[-3000:],
                    server.tail(),
                )
    for seed, _ in SCHEDULE:
        for policy in (BASELINE, *CHALLENGERS):
            check_run(run_dir(out, policy, seed))
    for policy in CHALLENGERS:
        check_verdict(out, policy)
    check_capacity(out)


def starved_scrapes(metrics: pd.DataFrame, max_inflight: int) -> tuple[int, int]:
    """Scrapes at which the gateway held a queue while its upstream had a free slot and was not
    saturated by its own account: capacity a policy would have cost (the only way it can: the
    engine's own speed is not the policy's). Also returned: the scrapes at which the upstream
    was saturated (its scraped waiting queue or KV use, or a scrape of it too old — by design
    the gateway then holds requests back, whatever the policy; on the loaded box a stale vLLM
    scrape once held one slot free in FIFO's third run)."""
    by_scrape = {
        name: metrics[metrics["metric"] == name].groupby("t_ns")["value"].sum()
        for name in ("scheduler_queue_depth", "gateway_inflight", "gateway_upstream_saturated")
    }
    both = pd.concat(by_scrape, axis=1)
    both["gateway_upstream_saturated"] = both["gateway_upstream_saturated"].fillna(0)
    both = both.dropna()
    held = both[(both["scheduler_queue_depth"] > 0) & (both["gateway_inflight"] < max_inflight)]
    saturated = held["gateway_upstream_saturated"] > 0
    return int((~saturated).sum()), int(saturated.sum())


def check_run(run: Path) -> None:
    """What must hold of every run, whatever its policy."""
    summary = summary_of(run)
    assert summary["valid"], (run.name, summary["invalid_reasons"])
    accounting = summary["accounting"]
    planned = accounting["planned"]
    assert accounting["holds"] and accounting["missing"] == 0, (run.name, accounting)
    assert accounting["duplicates"] == 0, (run.name, accounting)
    assert sum(accounting["counts"].values()) == planned, (run.name, accounting)
    assert accounting["counts"]["ok"] == planned, (run.name, accounting)
    records = pd.read_parquet(run / "records.parquet")
    assert len(records) == planned and records["request_id"].is_unique, (run.name, len(records))
    target = json.loads((run / "run.json").read_text())["target"]
    assert target["mode"] == "gateway" and target["upstreams"][0].startswith("u0 "), target
    metrics = pd.read_parquet(run / "server_metrics.parquet")
    _, queued = sm.gauge(metrics, "scheduler_queue_depth")
    assert queued.max() > 0, f"{run.name}: the gateway never queued; the policy decided nothing"
    # the last scrape is up to one interval before the end: it may miss the last few
    dispatched = sm.histogram_run(metrics, "gateway_dispatch_wait_seconds")
    assert dispatched is not None and 0 < dispatched["count"] <= planned, (run.name, dispatched)
    # work-conserving under every policy: a queue at the gateway means a full engine, unless
    # the engine said it was full itself (then holding back is the gateway's design)
    starved, held_back = starved_scrapes(metrics, MAX_INFLIGHT)
    assert starved == 0, run.name
    _, engine_waiting = sm.gauge(metrics, "gateway_upstream_waiting")  # vLLM's own queue
    ttft = summary["tenants"][POLITE]["latency_ms"]["ttft"]
    sys.stderr.write(
        f"{run.name}: polite TTFT p50/p99 ms {ttft['p50']:.0f}/{ttft['p99']:.0f}; output tok/s "
        f"{summary['overall']['throughput']['output_tokens_per_s']:.1f} (makespan "
        f"{makespan_tokens_per_s(run):.1f}); gateway queue max {queued.max():.0f}, vLLM waiting "
        f"max {engine_waiting.max():.0f}; scrapes held back by the engine's own saturation "
        f"{held_back}\n"
    )


CAPACITY_BOUND = 0.05  # the issue's: total output throughput within 5% of FIFO's


def check_capacity(out: Path) -> None:
    """Each challenger's output tokens over the makespan (drain included: what the engine did
    per second) against FIFO's on the same seed: the paired changes' mean and its 95% t
    interval over the three seeds. Failed where that interval lies wholly outside ±5%: a
    policy that significantly costs (or, suspiciously, adds) more than 5% of the engine's
    throughput. A point bound on three runs would judge the engine's own run-to-run speed
    (FIFO's three seeds spread 5.8% on a quiet VM, 155-318 tok/s on a loaded one)."""
    from scipy import stats

    fifo = [makespan_tokens_per_s(run_dir(out, BASELINE, seed)) for seed, _ in SCHEDULE]
    for policy in CHALLENGERS:
        mine = [makespan_tokens_per_s(run_dir(out, policy, seed)) for seed, _ in SCHEDULE]
        changes = [m / f - 1 for m, f in zip(mine, fifo, strict=True)]
        k = len(changes)
        mean = sum(changes) / k
        sd = (sum((c - mean) ** 2 for c in changes) / (k - 1)) ** 0.5
        half = float(stats.t.ppf(0.975, k - 1)) * sd / k**0.5
        sys.stderr.write(
            f"capacity {policy}: makespan tok/s {[round(v) for v in mine]} against "
            f"{BASELINE}'s {[round(v) for v in fifo]}: {mean:+.1%} [{mean - half:+.1%}, "
            f"{mean + half:+.1%}] (fails only wholly outside ±{CAPACITY_BOUND:.0%})\n"
        )
        outside = mean - half > CAPACITY_BOUND or mean + half < -CAPACITY_BOUND
        assert not outside, (policy, mine, fifo, mean, half)


def check_verdict(out: Path, policy: str) -> None:
    """compare, FIFO as A and `policy` as B over the three seeds: its own verdict on the polite
    tenant's TTFT p99 row is `better`, and its printed table says so on that row."""
    pairs: list[str] = []
    for seed, _ in SCHEDULE:
        pairs += ["--a", str(run_dir(out, BASELINE, seed)), "--b", str(run_dir(out, policy, seed))]
    proc = cli("compare", *pairs, "--json", timeout=180)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    comparison = json.loads(proc.stdout)
    assert comparison["pairs"] == len(SCHEDULE), comparison["design"]
    row = next(v for v in comparison["verdicts"] if v["metric"] == ROW)
    pct = lambda v: "none" if v is None else f"{v:+.1%}"  # noqa: E731  (no verdict: no interval)
    sys.stderr.write(
        f"compare {BASELINE} -> {policy}: {ROW} {row['a_runs']} -> {row['b_runs']} ms, change "
        f"{pct(row['change'])} [{pct(row['ci_low'])}, {pct(row['ci_high'])}], p "
        f"{row['p_value']}: {row['verdict']} {row.get('reason') or ''}\n"
    )
    assert row["verdict"] == "better", (policy, row)
    table = cli("compare", *pairs, timeout=180)
    assert table.returncode == 0, (table.stdout[-3000:], table.stderr[-3000:])
    shown = [line for line in table.stdout.splitlines() if f"{ROW} " in line]
    assert shown and "better" in shown[0], table.stdout  # what compare prints
