"""Multi-turn sessions: what a conversation's turns are made of, decided from the scenario.

Why a module of its own: a session turns one arrival into several requests whose send times
depend on each other (turn k+1 is due when turn k completed plus a think time), and whose prompts
grow with the conversation. Everything that can be decided up front is decided here, from named
random streams: how many turns, each turn's think time, each turn's new user text (a prompt
recipe) and output length. What cannot — when a turn completes, how many tokens it returned —
is read at run time, and the prompt is rebuilt from it by `conversation_ids`.

The conversation rule (one rule, used live and in the simulator):
turn k's prompt = turn 1's user text, turn 1's output, …, turn k−1's output, turn k's user
text, each rendered exactly (an output of n tokens as n words derived from its turn's seed), so
turn k's prompt begins with turn k−1's whole prompt and output and a prefix cache sees real
hits. Past `context_limit` tokens the oldest are dropped and the last `context_limit` kept:
vLLM's `truncate_prompt_tokens` rule.
"""

from __future__ import annotations

import numpy as np

from fairbench.workload.models import (
    ConstantTime,
    ExponentialTime,
    Scenario,
    TimeDist,
    TraceArrival,
    TraceSpec,
    UniformTime,
)
from fairbench.workload.prompts import _words

__all__ = [
    "agent_workloads",
    "conversation_ids",
    "output_ids",
    "sample_seconds",
    "session_problems",
    "step_word",
    "trace_sessions",
    "truncate",
    "whole_prompts",
]

_NO_THINK = ConstantTime(dist="constant", value=0.0)
# what each trace format has instead of a conversation id, for the refusal
_TRACE_FIELDS = {
    "mooncake": "timestamp, input_length, output_length, hash_ids",
    "azure": "TIMESTAMP, ContextTokens, GeneratedTokens",
}

_OUTPUT_DOMAIN = 0x07E7_0017  # a domain of its own: no output shares words with a prompt seed


def sample_seconds(dist: TimeDist, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` durations in seconds from `dist` (all >= 0)."""
    if isinstance(dist, ConstantTime):
        return np.full(n, float(dist.value))
    if isinstance(dist, ExponentialTime):
        return rng.exponential(dist.mean, size=n)
    if isinstance(dist, UniformTime):
        return rng.uniform(dist.low, dist.high, size=n)
    raise TypeError(f"unknown time distribution {dist!r}")  # pragma: no cover - schema


def output_ids(prompt_seed: int, n: int) -> np.ndarray:
    """The words standing for a turn's `n` output tokens: fixed by the turn's seed, so the live
    generator and the simulator render the same conversation from the same token counts."""
    return _words((_OUTPUT_DOMAIN, int(prompt_seed)), max(int(n), 0))


def truncate(ids: np.ndarray, limit: int) -> np.ndarray:
    """The last `limit` ids (vLLM's truncate_prompt_tokens); all of them if `limit` <= 0."""
    return ids[-limit:] if 0 < limit < len(ids) else ids


def conversation_ids(history: list[np.ndarray], user: np.ndarray, limit: int) -> np.ndarray:
    """Turn k's prompt: the conversation so far (`history`: turn 1's user ids, its output ids,
    …) then this turn's user ids, truncated to `limit` (0: no limit)."""
    return truncate(np.concatenate([*history, user]) if history else user, limit)


def trace_sessions(spec: TraceSpec) -> bool:
    """Whether a trace's conversations replay as sessions (fairbench.workload.conversations)."""
    return (
        spec.sessions if spec.sessions is not None else spec.format in ("conversation", "bailian")
    )


def whole_prompts(spec: TraceSpec) -> bool:
    """Whether a session trace's input tokens are each turn's whole prompt (see TraceSpec)."""
    return (spec.turn_input or ("whole" if spec.format == "bailian" else "new")) == "whole"


def agent_workloads(scn: Scenario) -> tuple[str, ...]:
    """The workloads whose sessions are agentic chains (their turns are steps)."""
    return tuple(
        name
        for name, wl in scn.workloads.items()
        if wl.session is not None and wl.session.agent is not None
    )


def step_word(workload: str, agents: tuple[str, ...] | frozenset[str]) -> str:
    """What a session's numbered unit is called in a message: "step" for an agent's chain, where
    the unit is a step of one or k calls, "turn" for a chat."""
    return "step" if workload in agents else "turn"


def session_problems(scn: Scenario) -> list[str]:
    """What a scenario asks of sessions that cannot be done, one line each, naming the field:
    embeddings have no conversation, a trace gives its own requests (and turns: a session
    workload cannot be in a trace tenant's mix), only some trace formats have conversation ids,
    and the disaggregated simulator runs independent requests only."""
    problems = []
    users = {name for name, wl in scn.workloads.items() if wl.session is not None}
    for name in sorted(users):
        session = scn.workloads[name].session
        assert session is not None
        at = f"workloads.{name}.session"
        if session.agent is not None and session.turns is not None:
            problems.append(
                f"{at}.turns: a session is a chat (turns) or an agent (agent.steps), not both; "
                "remove one"
            )
        elif session.agent is None and session.turns is None:
            problems.append(f"{at}.turns: required (how many turns), or give agent: {{steps: ...}}")
        # compared with the default, not read from model_fields_set: a run directory's
        # scenario.yaml holds every default spelt out, and is parsed again to report on
        if session.agent is not None and session.think_time != _NO_THINK:
            problems.append(
                f"{at}.think_time: an agent waits for its tools; use {at}.agent.tool_time"
            )
        if scn.workloads[name].endpoint == "embeddings":
            problems.append(
                f"workloads.{name}.session: embeddings have no conversation; remove session "
                "or use endpoint chat or completions"
            )
    for i, tenant in enumerate(scn.tenants):
        if isinstance(tenant.arrival, TraceArrival) and users & set(scn.mix_of(tenant)):
            problems.append(
                f"tenants[{i}].mix: a trace gives its own requests (and, with sessions, its "
                f"own turns and think times), so a workload with a session "
                f"({', '.join(sorted(users & set(scn.mix_of(tenant))))}) cannot be in its mix; "
                "give the trace a workload without session"
            )
    replayed = set()
    for name, spec in scn.traces.items():
        at = f"traces.{name}"
        if spec.sessions and spec.format in _TRACE_FIELDS:
            problems.append(
                f"{at}.sessions: the {spec.format} format has no conversation id (its columns: "
                f"{_TRACE_FIELDS[spec.format]}); use format conversation (docs/sessions.md), "
                "bailian or burstgpt (v2.0's Session ID), or remove sessions"
            )
        elif trace_sessions(spec):
            replayed.add(name)
        elif spec.turn_input is not None:
            problems.append(f"{at}.turn_input: only read with sessions; remove it")
    by_trace = False
    for i, tenant in enumerate(scn.tenants):
        if isinstance(tenant.arrival, TraceArrival) and tenant.arrival.trace in replayed:
            by_trace = True
            embedded = [
                m
                for m in scn.mix_of(tenant)
                if m in scn.workloads and scn.workloads[m].endpoint == "embeddings"
            ]
            if embedded:
                problems.append(
                    f"tenants[{i}].mix: {embedded[0]} is embeddings, which have no conversation, "
                    f"and trace {tenant.arrival.trace!r} replays conversations; use a chat or "
                    "completions workload"
                )
    disaggregated = scn.scheduler.get("disaggregation") is not None
    if (users or by_trace) and scn.target.kind == "sim" and disaggregated:
        problems.append(
            "scheduler.disaggregation: the simulator runs sessions colocated only, for now; "
            "remove disaggregation or the workloads' session"
        )
    return problems
