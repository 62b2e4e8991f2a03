"""Prefill/decode disaggregation (issue 34): the KV link's queueing, the TTFT parts, the config."""

from __future__ import annotations

import numpy as np
import pytest

from fairbench.targets.sim import ttft_parts
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import SchedulerConfigError, parse_scheduler_config
from reference_scheduler.scheduler.disaggregation import KvLink, KvTransferSpec

KV_BYTES = 131072  # h100-llama3-8b: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 B


def test_kv_link_is_a_fifo_queue_per_replica_by_hand() -> None:
    """10 GB/s, 1 ms latency, 5 ms constant jitter; 1000 tokens = 131.072 MB -> 13.1072 ms on
    the wire. Three transfers ready at 0, 1 ms, 40 ms on replica 0, one at 0 on replica 1."""
    spec = KvTransferSpec(
        bandwidth="10GB/s", latency="1ms", jitter={"dist": "constant", "value": "5ms"}
    )
    link = KvLink(spec, KV_BYTES, replicas=2, seed=0)
    wire = 13_107_200  # only the bytes hold the link; latency and jitter are the transfer's own
    own = 1_000_000 + 5_000_000
    first = link.transfer(0, 0, 1000)
    second = link.transfer(0, 1_000_000, 1000)  # waits for the first's bytes to leave the link
    third = link.transfer(0, 40_000_000, 1000)  # the link is free again by then
    other = link.transfer(1, 0, 1000)  # its own link: no wait
    assert first == wire + own
    assert second == 2 * wire + own
    assert third == 40_000_000 + wire + own
    assert other == first


def test_jitter_follows_its_distribution() -> None:
    spec = KvTransferSpec(
        bandwidth="50GB/s",
        latency="0ms",
        jitter={"dist": "lognormal", "median": "2ms", "p99": "80ms"},
    )
    draws = spec.jitter.sample_s(np.random.default_rng(1), 200_000)  # type: ignore[union-attr]
    assert np.median(draws) == pytest.approx(0.002, rel=0.03)
    assert np.quantile(draws, 0.99) == pytest.approx(0.080, rel=0.08)


def _jobs(n: int = 300, seed: int = 3) -> list[Job]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(30e6, n)).astype(np.int64)  # ~33/s
    jobs = []
    for i in range(n):
        long = i % 7 == 0
        jobs.append(
            Job(
                i,
                "b" if long else "a",
                "batch" if long else "interactive",
                int(4000 if long else rng.integers(20, 200)),
                int(rng.integers(1, 200)),
                int(t[i]),
                priority=1 if long else 0,
            )
        )
    return jobs


BLOCK = {
    "policy": "fifo",
    "max_num_seqs": 8,
    "max_num_batched_tokens": 2048,
    "disaggregation": {
        "prefill_replicas": 1,
        "decode_replicas": 2,
        "kv_transfer": {
            "bandwidth": "50GB/s",
            "latency": "1ms",
            "jitter": {"dist": "lognormal", "median": "2ms", "p99": "80ms"},
        },
    },
}


def test_ttft_parts_sum_to_ttft_for_every_request() -> None:
    config = parse_scheduler_config(BLOCK)
    result = simulate(_jobs(), config)
    finished = [j for j in result.jobs if j.status == "finished"]
    assert len(finished) == len(result.jobs)
    waited = 0
    for job in finished:
        parts = ttft_parts(job)
        queue = job.admit_ns - job.arrival_ns
        ttft = job.first_token_ns - job.arrival_ns
        rest = (
            ttft - queue - parts["prefill_ns"] - parts["kv_transfer_ns"] - parts["decode_wait_ns"]
        )
        assert min(queue, *parts.values()) >= 0
        if job.max_tokens <= 1:  # finished in the prefill pool
            assert rest == 0
            continue
        # what is left is the decode pool's first step: from its admission to the first token
        assert rest == job.first_token_ns - job.decode_admit_ns > 0
        tokens_ns = job.prompt_tokens * KV_BYTES / 50e9 * 1e9 + 1e6
        assert parts["kv_transfer_ns"] >= tokens_ns - 1
        waited += parts["decode_wait_ns"] > 0
    assert waited > 0  # 8 slots per decode replica: some KV arrives to a full pool


def test_colocated_parts_sum_exactly_and_nothing_else_changes() -> None:
    block = {k: v for k, v in BLOCK.items() if k != "disaggregation"}
    result = simulate(_jobs(), parse_scheduler_config(block))
    for job in result.jobs:
        parts = ttft_parts(job)
        assert parts["kv_transfer_ns"] == parts["decode_wait_ns"] == 0
        assert (
            job.admit_ns - job.arrival_ns + parts["prefill_ns"]
            == job.first_token_ns - job.arrival_ns
        )


def test_same_config_same_simulation() -> None:
    config = parse_scheduler_config(BLOCK)
    a, b = simulate(_jobs(), config), simulate(_jobs(), config)
    assert [j.first_token_ns for j in a.jobs] == [j.first_token_ns for j in b.jobs]
    assert [j.kv_arrived_ns for j in a.jobs] == [j.kv_arrived_ns for j in b.jobs]


def test_jitter_moves_the_tail_into_transfer() -> None:
    calm = {**BLOCK, "disaggregation": {**BLOCK["disaggregation"], "kv_transfer": {}}}
    noisy = simulate(_jobs(), parse_scheduler_config(BLOCK))
    quiet = simulate(_jobs(), parse_scheduler_config(calm))
    kv = lambda r: np.array([ttft_parts(j)["kv_transfer_ns"] for j in r.jobs])  # noqa: E731
    assert np.quantile(kv(noisy), 0.99) > 3 * np.quantile(kv(quiet), 0.99)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"bandwidth": "fast"}, "bandwidth"),
        ({"jitter": {"dist": "lognormal", "median": "2ms"}}, "jitter"),
        ({"latency": "-1ms"}, "latency"),
    ],
)
def test_bad_kv_transfer_is_one_line_naming_the_field(patch: dict, field: str) -> None:
    block = {"disaggregation": {"kv_transfer": patch}}
    with pytest.raises(SchedulerConfigError) as error:
        parse_scheduler_config(block)
    assert len(error.value.lines) == 1
    assert field in error.value.lines[0]
