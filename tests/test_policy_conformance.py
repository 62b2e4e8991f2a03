"""Every policy keeps the Policy contract: peek agrees with dequeue, each accepted job leaves
exactly once, len is the live count, reset empties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Policy
from reference_scheduler.policies import POLICIES, PRESETS, build_policy

SPECS: list[Any] = [
    "fifo",
    "priority",
    {"name": "priority", "by": "tenant", "ranks": {"t1": 0, "t0": 1}},
    "dwrr",
    {"name": "dwrr", "quantum": 50},
    "wfq",
    "sfq",
    {"name": "sfq", "buckets": 2, "perturb_s": 0.001},
    "vtc",
    "lcf",
    *PRESETS,
]
CLASSES = ["interactive", "batch", "best-effort"]


def make_job(i: int, tenant: int, cls: int, prompt: int, out: int, t: int) -> Job:
    return Job(
        i,
        f"t{tenant}",
        CLASSES[cls],
        prompt,
        out,
        t,
        weight=1.0 + tenant % 3,
        priority=cls,
        flow=f"w{i % 2}",
        seq=i,
    )


def test_registry_names_match_classes() -> None:
    for name, cls in POLICIES.items():
        assert cls.name == name


ops = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "enqueue", "enqueue", "dequeue", "peek", "remove"]),
        st.integers(0, 4),  # tenant
        st.integers(0, 2),  # class
        st.integers(1, 5000),  # prompt
        st.integers(0, 500),  # output
        st.integers(0, 30),  # which waiting job to remove
    ),
    max_size=120,
)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s if isinstance(s, str) else repr(s))
@settings(max_examples=60, deadline=None)
@given(steps=ops)
def test_contract(spec: Any, steps: list[tuple[int, ...]]) -> None:
    policy: Policy = build_policy(spec)
    policy.bind(10_000)
    waiting: dict[int, Job] = {}
    left: set[int] = set()
    now = 0
    for i, (op, tenant, cls, prompt, out, pick) in enumerate(steps):
        now += 1_000_000
        if op == "enqueue":
            job = make_job(i, tenant, cls, prompt, out, now)
            assert policy.enqueue(job, now).accepted
            waiting[job.id] = job
        elif op == "peek":
            peeked = policy.peek(now)
            assert (peeked is None) == (len(policy) == 0)
            if peeked is not None:
                assert policy.dequeue(now) is peeked
                policy.release(peeked, now)
                assert peeked.id in waiting and peeked.id not in left
                left.add(peeked.id)
                del waiting[peeked.id]
        elif op == "dequeue":
            peeked = policy.peek(now)
            job = policy.dequeue(now)
            assert job is peeked
            if job is not None:
                policy.charge(job, now, prefill=job.prompt_tokens, decode=job.max_tokens)
                policy.release(job, now)
                assert job.id in waiting and job.id not in left
                left.add(job.id)
                del waiting[job.id]
        elif op == "remove" and waiting:
            victim = sorted(waiting)[pick % len(waiting)]
            policy.remove(waiting.pop(victim))
            left.add(victim)
        assert len(policy) == len(waiting)
    # Drain: every job still waiting comes out exactly once, then the policy is empty.
    while len(policy):
        now += 1
        job = policy.dequeue(now)
        assert job is not None and job.id in waiting
        policy.release(job, now)
        del waiting[job.id]
    assert not waiting
    assert policy.peek(now) is None and policy.dequeue(now) is None


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s if isinstance(s, str) else repr(s))
def test_reset_empties(spec: Any) -> None:
    policy = build_policy(spec)
    for i in range(20):
        policy.enqueue(make_job(i, i % 3, i % 3, 10, 10, i), i)
    policy.reset()
    assert len(policy) == 0 and policy.peek(99) is None and policy.dequeue(99) is None
    policy.enqueue(make_job(100, 0, 0, 10, 10, 100), 100)
    assert policy.dequeue(101).id == 100


def test_fifo_priority_orders() -> None:
    fifo = build_policy("fifo")
    prio = build_policy("priority")
    jobs = [make_job(i, 0, cls, 10, 10, i) for i, cls in enumerate([2, 0, 1, 0, 2])]
    for job in jobs:
        fifo.enqueue(job, job.arrival_ns)
    assert [fifo.dequeue(9).id for _ in jobs] == [0, 1, 2, 3, 4]
    for job in jobs:
        prio.enqueue(job, job.arrival_ns)
    assert [prio.dequeue(9).id for _ in jobs] == [1, 3, 2, 0, 4]


def test_unknown_policy_option_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"policy\.child\.quantom: not an option of dwrr"):
        build_policy({"name": "dwrr", "child": {"name": "dwrr", "quantom": 1}})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "wfq", "weights": {"t0": 0}}, r"weights\['t0'\] must be a number > 0, got 0"),
        ({"name": "dwrr", "weights": {"t1": -2}}, r"weights\['t1'\] must be a number > 0"),
        ({"name": "vtc", "weights": {"t0": float("inf")}}, r"weights\['t0'\] must be a number"),
        ({"name": "lcf", "weights": {"t0": "2"}}, r"weights\['t0'\] must be a number > 0"),
        ({"name": "sfq", "perturb_s": 1e-12}, r"perturb_s must be at least 1e-9"),
        ({"name": "priority", "by": "tenant", "ranks": {"t0": "1"}}, r"ranks\['t0'\] must be"),
    ],
)
def test_a_weight_or_period_that_would_fail_mid_run_is_refused_first(
    spec: dict[str, Any], message: str
) -> None:
    """A weight divides a share (WFQ, VTC) or scales a quantum (DWRR: 0 never ends a turn);
    an SFQ period under a nanosecond divides by zero. Refused when the spec is built."""
    with pytest.raises(ValueError, match=r"policy: " + message):
        build_policy(spec)
