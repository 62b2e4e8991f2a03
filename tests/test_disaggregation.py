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


def _with(mode: str) -> dict:
    return {**BLOCK, "disaggregation": {**BLOCK["disaggregation"], "decode_admission": mode}}


@pytest.mark.parametrize("mode", ["pooled", "reserve", "kv_aware"])
def test_ttft_parts_sum_to_ttft_for_every_request(mode: str) -> None:
    config = parse_scheduler_config(_with(mode))
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
        ({"jitter": {"dist": "constant", "value": "1ms", "share": 1.5}}, "share"),
    ],
)
def test_bad_kv_transfer_is_one_line_naming_the_field(patch: dict, field: str) -> None:
    block = {"disaggregation": {"kv_transfer": patch}}
    with pytest.raises(SchedulerConfigError) as error:
        parse_scheduler_config(block)
    assert len(error.value.lines) == 1
    assert field in error.value.lines[0]


def _hand_link(jobs: list[Job], bandwidth: float, latency_ns: int) -> dict[int, int]:
    """The KV link by hand: one prefill replica, one FIFO link; transfers in the order their
    prefills ended (ties: admission order), each leaving when the link is free and taking its
    bytes / bandwidth, then latency. Returns each job's link-free time + latency (no jitter)."""
    sent = sorted(
        (j for j in jobs if j.kv_arrived_ns >= 0), key=lambda j: (j.prefill_done_ns, j.admit_ns)
    )
    free, out = 0, {}
    for job in sent:
        start = max(job.prefill_done_ns, free)
        free = start + round(job.prompt_tokens * KV_BYTES / bandwidth * 1e9)
        out[job.id] = free + latency_ns
    return out


def test_simulated_transfers_queue_on_the_link_as_by_hand() -> None:
    """A slow link (2 GB/s: a 4,000-token prompt's 524 MB hold it 262 ms) so transfers queue
    behind each other; with a constant 3 ms jitter every KV arrives exactly when the hand
    computation says, and some waited for the link (the queueing is exercised)."""
    block = {
        **BLOCK,
        "disaggregation": {
            **BLOCK["disaggregation"],
            "kv_transfer": {
                "bandwidth": "2GB/s",
                "latency": "1ms",
                "jitter": {"dist": "constant", "value": "3ms"},
            },
        },
    }
    result = simulate(_jobs(), parse_scheduler_config(block))
    hand = _hand_link(result.jobs, 2e9, 1_000_000)
    assert hand
    queued = 0
    for job in result.jobs:
        if job.id in hand:
            assert job.kv_arrived_ns == hand[job.id] + 3_000_000, job.id
            own = round(job.prompt_tokens * KV_BYTES / 2e9 * 1e9) + 4_000_000
            queued += job.kv_arrived_ns - job.prefill_done_ns > own
    assert queued > 10


def test_simulated_jitter_is_what_the_hand_link_leaves() -> None:
    """Uniform 10-30 ms jitter: what each transfer took beyond the hand computation (queue,
    bytes, latency) lies in [10, 30] ms, and its mean is near 20 ms."""
    block = {
        **BLOCK,
        "disaggregation": {
            **BLOCK["disaggregation"],
            "kv_transfer": {
                "bandwidth": "50GB/s",
                "latency": "1ms",
                "jitter": {"dist": "uniform", "low": "10ms", "high": "30ms"},
            },
        },
    }
    result = simulate(_jobs(), parse_scheduler_config(block))
    hand = _hand_link(result.jobs, 50e9, 1_000_000)
    extra = np.array([j.kv_arrived_ns - hand[j.id] for j in result.jobs if j.id in hand]) / 1e6
    assert len(extra) > 250
    assert extra.min() >= 10 - 1e-6 and extra.max() <= 30 + 1e-6
    assert np.mean(extra) == pytest.approx(20, abs=1.5)


def test_jitter_share_is_a_rare_stall() -> None:
    """`share`: that share of transfers stall (uniform 150-400 ms here), the rest get `min`."""
    spec = KvTransferSpec(
        jitter={"dist": "uniform", "low": "150ms", "high": "400ms", "share": 0.004, "min": "1ms"}
    )
    draws = spec.jitter.sample_s(np.random.default_rng(7), 500_000)  # type: ignore[union-attr]
    stalled = draws > 0.001
    assert (draws[~stalled] == 0.001).all()
    assert draws[stalled].min() >= 0.15 and draws[stalled].max() <= 0.4
    # binomial: 2,000 expected, sd ~45
    assert abs(int(stalled.sum()) - 2000) < 200


def test_jitter_without_share_draws_as_before() -> None:
    """No `share`: the same draws as the distribution alone (configs written before it keep
    their transfers, and the golden runs their bytes)."""
    spec = KvTransferSpec(jitter={"dist": "uniform", "low": "1ms", "high": "3ms"})
    draws = spec.jitter.sample_s(np.random.default_rng(3), 1000)  # type: ignore[union-attr]
    assert np.array_equal(draws, np.random.default_rng(3).uniform(0.001, 0.003, 1000))


def _stalled_link(monkeypatch: pytest.MonkeyPatch, stall_s: float) -> None:
    """The first transfer stalls `stall_s`; every other one has no jitter."""
    drawn = []

    def draw(self: KvLink) -> float:
        drawn.append(1)
        return stall_s if len(drawn) == 1 else 0.0

    monkeypatch.setattr(KvLink, "_draw_s", draw)


def _three(mode: str) -> list[Job]:
    """A at 0, B at 50 ms, C at 100 ms: short prompts, 20 tokens each, through one prefill
    replica and two decode replicas of one slot each; A's transfer stalls 500 ms."""
    config = parse_scheduler_config(
        {
            "policy": "fifo",
            "max_num_seqs": 1,
            "disaggregation": {
                "prefill_replicas": 1,
                "decode_replicas": 2,
                "kv_transfer": {"bandwidth": "50GB/s", "latency": "1ms"},
                "decode_admission": mode,
            },
        }
    )
    jobs = [Job(i, "t", "interactive", 100, 20, i * 50_000_000) for i in range(3)]
    return simulate(jobs, config).jobs


@pytest.mark.parametrize("mode", ["pooled", "reserve", "kv_aware"])
def test_a_stalled_transfer_delays_others_only_when_it_holds_a_decode_slot(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reserve` binds round-robin and holds the slot while the KV is in flight (SGLang's
    plain request pool): C, bound to A's replica, cannot start decoding until A's stalled KV
    arrives. `kv_aware` binds C to the replica with the least backlog and holds no slot in
    flight, so C starts when its own KV is there; `pooled` (the default) never binds early."""
    _stalled_link(monkeypatch, 0.5)
    a, b, c = _three(mode)
    assert all(j.status == "finished" for j in (a, b, c))
    assert a.kv_arrived_ns - a.prefill_done_ns >= 500_000_000  # the stall
    assert b.decode_admit_ns == b.kv_arrived_ns  # B's replica is free either way
    c_wait = c.decode_admit_ns - c.kv_arrived_ns
    if mode == "reserve":
        assert (a.replica, b.replica, c.replica) == (0, 1, 0)
        assert c.decode_admit_ns >= a.kv_arrived_ns and c_wait > 300_000_000
    else:
        assert c_wait == 0


@pytest.mark.parametrize("mode", ["reserve", "kv_aware"])
def test_bound_replicas_keep_token_times_on_their_own_replica(mode: str) -> None:
    """Each decode replica is an engine of its own; a request's tokens are read from the
    replica it was bound to (the records' token times), and the run is deterministic."""
    config = parse_scheduler_config(_with(mode))
    first, again = simulate(_jobs(), config), simulate(_jobs(), config)
    assert [j.first_token_ns for j in first.jobs] == [j.first_token_ns for j in again.jobs]
    used = {j.replica for j in first.jobs if j.status == "finished" and j.max_tokens > 1}
    assert used == {0, 1}
    for job in first.jobs:
        if job.status == "finished" and job.max_tokens > 1:
            times = first.token_times(job)
            assert times[0] == job.first_token_ns and times[-1] == job.done_ns
            assert len(times) == job.max_tokens


def test_decode_admission_must_be_known() -> None:
    with pytest.raises(SchedulerConfigError) as error:
        parse_scheduler_config({"disaggregation": {"decode_admission": "eager"}})
    assert len(error.value.lines) == 1 and "decode_admission" in error.value.lines[0]
