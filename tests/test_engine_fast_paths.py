"""The engine's per-request shortcuts (issue 35) keep what they replace, exactly.

Each shortcut stands in for a call the engine made per request or per step, so a bug in one
would change which job runs when, and the records. What each pins:
- `take(job, now)`, a policy's dequeue of the job its peek just returned, leaves the policy as
  peek-then-dequeue leaves it: same jobs in the same order, same counters and stats;
- the step's admission gate reads `admission.waiting` for `len(policy)`: the two agree at every
  step, through cancellations (timeouts, the stop), preemption, demotion and rejections;
- `policy_hook` drops only BasePolicy's no-op hooks, never a policy's own;
- Admission's fast path (`open_for`) is taken only without limits, and a replaced spec is seen.
The golden outputs pin whole runs; these fail first, where the shortcut is."""

from __future__ import annotations

import random
from typing import Any

import pytest

from reference_scheduler.core.admission import Admission, AdmissionSpec, refuse_too_long
from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import BasePolicy, policy_hook
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.policies import PRESETS, build_policy
from reference_scheduler.scheduler.config import parse_scheduler_config
from reference_scheduler.scheduler.engine import Engine

SPECS: list[Any] = [
    "fifo",
    "priority",
    "dwrr",
    {"name": "dwrr", "quantum": 50},
    "wfq",
    "sfq",
    "vtc",
    "lcf",
    *PRESETS,
]
CLASSES = ("interactive", "batch", "best-effort")


def _job(i: int, rng: random.Random) -> Job:
    tier = rng.randint(0, 2)
    tenant = rng.randint(0, 4)
    return Job(
        i,
        f"t{tenant}",
        CLASSES[tier],
        rng.randint(1, 5000),
        rng.randint(0, 500),
        i,
        weight=1.0 + tenant % 3,
        priority=tier,
        flow=f"w{i % 2}",
        seq=i,
    )


def _state(value: Any, seen: set[int] | None = None) -> Any:
    """A policy's whole state as plain data (jobs by id, objects by their attributes), to
    compare twins that hold different Job objects."""
    seen = set() if seen is None else seen
    if isinstance(value, Job):
        return ("job", value.id)
    if isinstance(value, int | float | str | bool | type(None)):
        return value
    if isinstance(value, dict):
        return sorted((repr(_state(k, seen)), _state(v, seen)) for k, v in value.items())
    if isinstance(value, list | tuple) or type(value).__name__ == "deque":
        return [_state(v, seen) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(repr(_state(v, seen)) for v in value)
    if id(value) in seen or callable(value):
        return type(value).__name__
    seen.add(id(value))
    names = list(getattr(value, "__dict__", {})) + list(getattr(type(value), "__slots__", ()))
    if not names:
        return type(value).__name__
    return (type(value).__name__, [(n, _state(getattr(value, n, None), seen)) for n in names])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s if isinstance(s, str) else repr(s))
@pytest.mark.parametrize("seed", range(4))
def test_take_is_peek_then_dequeue(spec: Any, seed: int) -> None:
    rng = random.Random(seed)
    plain, fast = build_policy(spec), build_policy(spec)
    plain.bind(40)
    fast.bind(40)
    take = getattr(fast, "take", None)
    twins: dict[int, tuple[Job, Job]] = {}
    running: list[tuple[Job, Job]] = []
    now = 0
    for i in range(1500):
        now += 1_000_000
        op = rng.random()
        if op < 0.45:
            a = _job(i, rng)
            b = Job(**{f: getattr(a, f) for f in ("id", "tenant", "slo_class", "prompt_tokens",
                                                    "max_tokens", "arrival_ns", "weight",
                                                    "priority", "flow", "seq")})  # fmt: skip
            assert plain.enqueue(a, now).accepted and fast.enqueue(b, now).accepted
            twins[i] = (a, b)
        elif op < 0.8:
            a, b = plain.peek(now), fast.peek(now)
            assert (a is None) == (b is None)
            if a is None or b is None:
                continue
            assert a.id == b.id
            assert plain.dequeue(now) is a
            if take is not None:
                take(b, now)
            else:
                assert fast.dequeue(now) is b
            del twins[a.id]
            for policy, job in ((plain, a), (fast, b)):
                policy.charge(job, now, job.prompt_tokens)
            running.append((a, b))
        elif op < 0.9 and running:
            a, b = running.pop(rng.randrange(len(running)))
            for policy, job in ((plain, a), (fast, b)):
                policy.charge(job, now, 0, job.max_tokens)
                policy.release(job, now)
        elif twins:
            a, b = twins.pop(rng.choice(sorted(twins)))
            plain.remove(a)
            fast.remove(b)
        assert len(plain) == len(fast)
        if i % 50 == 0:
            assert _state(plain) == _state(fast)
    assert plain.stats() == fast.stats()
    assert _state(plain) == _state(fast)


def test_policy_hook_skips_only_the_base_no_op() -> None:
    class Counting(BasePolicy):
        def release(self, job: Job, now_ns: int) -> None:
            return None

    assert policy_hook(build_policy("fifo"), "release") is None  # BasePolicy's
    assert policy_hook(build_policy("vtc"), "release") is None
    assert policy_hook(build_policy("three-tier"), "release") is not None  # counts running
    assert policy_hook(Counting(), "release") is not None  # its own, even if it does nothing


def test_admission_fast_path_only_without_limits() -> None:
    adm = Admission(AdmissionSpec())
    assert adm.open_for is adm.spec
    assert Admission(AdmissionSpec(max_queue=3)).open_for is None
    adm.spec = AdmissionSpec(max_queue=1)  # replaced: the engine must go through enter
    assert adm.open_for is not adm.spec
    policy = build_policy("fifo")
    assert adm.enter(Job(1, "t", "batch", 1, 1, 0), 0, policy).accepted
    assert not adm.enter(Job(2, "t", "batch", 1, 1, 0), 0, policy).accepted
    assert adm.open_for is None


def _workload(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    t = 0
    jobs = []
    for i in range(n):
        t += rng.randint(0, 20_000_000)
        tier = rng.randint(0, 2)
        jobs.append(
            Job(i, f"t{rng.randint(0, 3)}", CLASSES[tier], rng.randint(1, 900),
                rng.choice([0, 1, rng.randint(2, 200)]), t, priority=tier)
        )  # fmt: skip
    return jobs


CONFIGS: list[dict[str, Any]] = [
    {"policy": "vtc", "max_num_seqs": 6},
    {"policy": "dwrr", "admission": {"max_queue": 40}, "max_num_seqs": 6},
    {"policy": "three-tier", "preemption": {"mode": "recompute"}, "max_num_seqs": 8},
    {
        "policy": "priority",
        "preemption": {"mode": "swap", "budget": {"count": 3, "window_s": 1}},
        "max_num_seqs": 6,
    },
]


@pytest.mark.parametrize("extra", CONFIGS, ids=lambda c: str(c["policy"]))
def test_admission_waiting_is_the_policy_length_at_every_step(
    extra: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = parse_scheduler_config({"profile": "h100-llama3-8b", "replicas": 3, **extra})
    step = Engine.step
    checked = [0]

    def checking(self: Engine, r: int, now_ns: int) -> Any:
        assert self.admission.waiting == len(self.policy)
        checked[0] += 1
        res = step(self, r, now_ns)
        assert self.admission.waiting == len(self.policy)
        return res

    monkeypatch.setattr(Engine, "step", checking)
    jobs = _workload(1500, 7)
    stop = jobs[-1].arrival_ns + 5_000_000_000
    result = simulate(jobs, config, timeout_ns=3_000_000_000, stop_ns=stop)
    statuses = {job.status for job in result.jobs}
    assert checked[0] > 1000
    # timeouts and the stop cancelled waiting and running jobs, or admission refused some
    assert {"finished", "rejected" if "admission" in extra else "cancelled"} <= statuses
    if "preemption" in extra:
        assert sum(job.preemptions for job in result.jobs) > 0


@pytest.mark.parametrize(
    ("kv_tokens", "block_size", "max_model_len"),
    [(1000, 16, None), (1000, 16, 500), (1000, 7, 2000), (4096, 32, 4096), (100, 1, 99)],
)
def test_one_compare_refuses_exactly_what_refuse_too_long_refuses(
    kv_tokens: int, block_size: int, max_model_len: int | None
) -> None:
    config = parse_scheduler_config(
        {
            "policy": "fifo",
            "profile": {"constant_step_ms": 5.0, "kv_cache_tokens": kv_tokens},
            "block_size": block_size,
            **({"max_model_len": max_model_len} if max_model_len else {}),
        }
    )
    engine = Engine(config)
    limit = min(config.max_model_len, config.kv_blocks * block_size) + 3
    for total in range(max(0, limit - 2 * block_size - 8), limit):
        job = Job(total, "t", "batch", total // 2, total - total // 2, 0)
        expected = refuse_too_long(job, config.max_model_len, block_size, config.kv_blocks)
        job = Job(total, "t", "batch", total // 2, total - total // 2, 0)
        verdict = engine.submit(job, 0)
        assert verdict.accepted == (expected is None), total
        if expected is not None:
            assert verdict == expected and job.status == "rejected"


@pytest.mark.parametrize("weighted", [True, False])
def test_vtc_charges_are_the_plain_formula_bit_for_bit(weighted: bool) -> None:
    """charge and charge_decode skip the membership test and, without configured weights, the
    weights' lookup: the counters must be the plain formula's, and a tenant without a counter
    (never enqueued) is still charged nothing."""
    from reference_scheduler.policies.vtc import Vtc

    rng = random.Random(35)
    weights = {f"t{k}": rng.choice([1.0, 3.0, 0.7]) for k in range(3)} if weighted else {}
    one, batch = Vtc(1.3, 2.1, weights), Vtc(1.3, 2.1, weights)
    jobs = [Job(k, f"t{k}", "c", 10, 10, 0, weight=rng.choice([1.9, 0.3, 2.0])) for k in range(6)]
    plain: dict[str, float] = {}
    for policy in (one, batch):
        for job in jobs[:5]:  # t5 never enqueued: no counter
            policy.enqueue(job, 0)
    for job in jobs[:5]:
        plain[job.tenant] = 0.0
    for step in range(2000):
        entries = [[rng.randint(1, 300), job] for job in rng.sample(jobs, rng.randint(1, 6))]
        prefill = rng.randint(0, 4000)
        for count, job in entries:
            if job.tenant in plain:
                plain[job.tenant] += (1.3 * 0 + 2.1 * count) / weights.get(job.tenant, job.weight)
            one.charge(job, step, 0, count)
        batch.charge_decode(entries, step)
        job = rng.choice(jobs)
        if job.tenant in plain:
            plain[job.tenant] += (1.3 * prefill + 2.1 * 0) / weights.get(job.tenant, job.weight)
        one.charge(job, step, prefill)
        batch.charge(job, step, prefill)
    assert one.counters == plain and batch.counters == plain and "t5" not in plain


def test_group_counts_are_skipped_only_without_limits() -> None:
    """The simulator's engine skips the waiting counts per tenant and class (only /metrics and
    admission limits read them) unless a limit needs them; the server's engine keeps them."""
    plain = parse_scheduler_config({"policy": "fifo", "profile": "h100-llama3-8b"})
    limited = parse_scheduler_config(
        {"policy": "fifo", "profile": "h100-llama3-8b", "admission": {"max_queue_per_tenant": 2}}
    )
    for config, group_counts, counted in [
        (plain, True, True),
        (plain, False, False),
        (limited, False, True),
    ]:
        engine = Engine(config, group_counts=group_counts)
        verdicts = [engine.submit(Job(i, "t", "batch", 10, 10, 0), 0).accepted for i in range(3)]
        assert verdicts == ([True, True, False] if config is limited else [True] * 3)
        assert engine.admission.waiting == len(engine.policy) == sum(verdicts)
        assert dict(engine.admission.by_tenant) == ({"t": sum(verdicts)} if counted else {})
        engine.cancel(engine.policy.peek(0), 1)
        assert engine.admission.waiting == len(engine.policy) == sum(verdicts) - 1
