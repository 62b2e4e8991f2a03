"""Sessions in the `sim` target: closed loop inside a session, open loop across sessions, all
in virtual time.

A session's first turn arrives at its planned time; each later turn is released by the
virtual driver's `follow` hook when the previous turn finished, `think_ns` after its last token
(the turn is *due* then, and every latency of it is measured from then, as live). Its prompt is
the conversation so far, rendered by fairbench.plan.sessions.Conversation from the token counts
the engine actually served, so the prefix cache sees the hits a real conversation gives: block
hashes are hashes of the block's own words, chained, exact wherever two prompts share text.

A turn that did not finish (rejected, timed out, cancelled) ends its session: each of its
session's later turns is recorded once, `cancelled`, saying which turn (an agent's: which step)
ended it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from fairbench.plan.model import Plan
from fairbench.plan.sessions import Conversation, session_steps
from fairbench.workload.scenario import Scenario
from fairbench.workload.sessions import agent_workloads, step_word
from reference_scheduler.core.job import Job
from reference_scheduler.core.prefix_cache import salted
from reference_scheduler.drivers.virtual import SimResult, simulate
from reference_scheduler.scheduler.config import parse_scheduler_config

__all__ = ["content_hashes", "run_sim_sessions"]


def content_hashes(ids: np.ndarray, block_size: int) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks: block j's hash covers blocks 0..j's words,
    so two prompts share a hash exactly where they share every word up to that block's end."""
    out: list[int] = []
    prev = b""
    words = np.ascontiguousarray(ids, dtype="<i4")
    for j in range(len(words) // block_size):
        digest = hashlib.blake2b(
            prev + words[j * block_size : (j + 1) * block_size].tobytes(), digest_size=8
        ).digest()
        out.append(int.from_bytes(digest, "little", signed=True))
        prev = digest
    return tuple(out)


class _Sessions:
    """The `follow` hook's state: each session's conversation and each released turn's job."""

    def __init__(
        self,
        plan: Plan,
        jobs: list[Job],
        block_size: int | None,
        delay_ns: int,
        salts: dict[str, str | None],
    ) -> None:
        self.plan = plan
        self.steps = session_steps(plan)
        self.served: dict[int, int] = {}  # row -> output tokens served, for a step's join
        self.salts = salts  # each tenant's cache_salt (fairbench.workload.cache)
        self.block_size = block_size
        self.delay_ns = delay_ns
        self.conversations: dict[int, Conversation] = {}
        self.jobs: list[Job | None] = list(jobs)  # by plan row; None: not released (yet)
        self.due = plan.columns["offset_ns"].copy()  # when each turn became due

    def hashes(self, tenant: str, ids: np.ndarray) -> tuple[int, ...]:
        assert self.block_size is not None
        return salted(content_hashes(ids, self.block_size), self.salts.get(tenant))

    def first(self, job: Job) -> Job:
        """A session's first turn as sent (its hashes from its words, like its later turns)."""
        req = self.plan.request(job.id)
        if req.session_id >= 0:
            conv = self.conversations.setdefault(req.session_id, Conversation())
            sent = conv.as_sent(req)
            job.prompt_tokens = sent.prompt_tokens
            if self.block_size is not None:
                job.block_hashes = self.hashes(job.tenant, sent.prompt_ids())
        return job

    def follow(self, job: Job) -> list[Job]:
        """The next step's calls once every call of this job's step finished (the join), due
        think (tool) time after the last of them; none while a call is out, and none ever if
        one did not finish (its session then ends: `run_sim_sessions` records the rest)."""
        steps = self.steps
        step = int(steps.step_of[job.id])
        nxt = int(steps.next[step]) if step >= 0 else -1
        if nxt < 0 or job.status != "finished":
            return []
        self.served[job.id] = job.max_tokens  # the tokens served (degradation may cap them)
        calls = [int(r) for r in steps.calls(step)]
        if any(r not in self.served for r in calls):
            return []
        done = self.plan.request(job.id)
        conv = self.conversations[done.session_id]
        conv.joined([(self.plan.request(r), self.served.pop(r)) for r in calls])
        last = max(self.jobs[r].done_ns for r in calls)  # type: ignore[union-attr]
        released = []
        for row in steps.calls(nxt):
            row = int(row)
            req = self.plan.request(row)
            sent = conv.as_sent(req)
            self.due[row] = last + req.think_ns
            call = Job(
                row,
                job.tenant,
                job.slo_class,
                sent.prompt_tokens,
                req.max_tokens,
                int(self.due[row]) + self.delay_ns,
                weight=job.weight,
                priority=job.priority,
                flow=job.flow,
            )
            if self.block_size is not None:
                call.block_hashes = self.hashes(job.tenant, sent.prompt_ids())
            self.jobs[row] = call
            released.append(call)
        return released


class _Due:
    """The plan as records_from reads it, with each turn's due time as its send time."""

    def __init__(self, plan: Plan, due: np.ndarray) -> None:
        self.columns = {**plan.columns, "offset_ns": due}
        self.names = plan.names


def run_sim_sessions(
    plan: Plan,
    scn: Scenario,
    plan_jobs: Callable[..., list[Job]],
    records_from: Callable[..., list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`run_sim` for a plan with sessions: the same records, one per planned request, each with
    session_id and turn, its prompt_tokens the whole prompt as sent. `plan_jobs` and
    `records_from` are fairbench.targets.sim's (passed in: the two modules do not import each
    other), so jobs and records follow the one rule of the sim target.

    No grace period cuts the run: the grace starts after the last send, which with sessions is
    known only at the end, and every turn ends by its own `run.timeout`."""
    assert plan.sessions is not None
    config = parse_scheduler_config(scn.scheduler)
    block_size = config.spec.block_size if config.prefix_caching else None
    timeout_ns = round(scn.run.timeout * 1e9)
    delay_ns = round(config.profile.request_overhead_ms * 1e6)
    planned = plan_jobs(plan, scn, block_size, delay_ns)  # hashes of requests outside sessions
    turn = plan.sessions["turn"]
    salts = {t.id: t.cache_salt for t in scn.tenants}
    state = _Sessions(
        plan,
        [j if turn[j.id] <= 1 else None for j in planned],  # type: ignore[misc]
        block_size,
        delay_ns,
        salts,
    )
    opening = [state.first(j) for j in planned if turn[j.id] <= 1]
    result = simulate(
        opening,
        config,
        timeout_ns=max(0, timeout_ns - delay_ns),
        follow=state.follow,
    )
    placeholder = Job(-1, "", "", 0, 0, 0)
    jobs = [j if j is not None else placeholder for j in state.jobs]
    full = SimResult(jobs, result.decode_ends, result.end_ns, result.steps, None)
    rows = records_from(full, _Due(plan, state.due), timeout_ns, None)  # type: ignore[arg-type]
    sid, ended = plan.sessions["session_id"], {}
    agents = agent_workloads(scn)  # their cancel reasons say "step N", a chat's "turn N"
    for i, row in enumerate(rows):
        row["session_id"] = int(sid[i]) if sid[i] >= 0 else None
        row["turn"] = int(turn[i]) if turn[i] > 0 else None
        if state.jobs[i] is None:  # never sent: an earlier turn of its session did not finish
            req = plan.request(i)
            cause = ended.get(req.session_id, "?")
            rows[i] = {
                "request_id": i,
                "tenant": req.tenant,
                "slo_class": req.slo_class,
                "workload": req.workload,
                "endpoint": req.endpoint,
                "t_intended_ns": req.offset_ns,
                "prompt_tokens": req.prompt_tokens,
                "max_tokens": req.max_tokens,
                "status": "cancelled",
                "error_detail": f"not sent: {cause} of its session ended unfinished",
                "output_tokens": 0,
                "n_chunks": 0,
                "worker": 0,
                "session_id": req.session_id,
                "turn": req.turn,
            }
        elif row["status"] != "ok" and row["turn"] is not None:
            word = step_word(row["workload"], agents)
            ended.setdefault(row["session_id"], f"{word} {row['turn']} ({row['status']})")
    info = {
        "kind": "sim",
        "policy": str(config.spec.policy),
        "profile": config.profile.name,
        "request_overhead_ms": str(config.profile.request_overhead_ms),
        "replicas": str(config.replicas),
        "steps": str(result.steps),
        "sessions": str(int(sid.max()) + 1 if len(sid) and sid.max() >= 0 else 0),
    }
    if config.warnings:
        info["warnings"] = list(config.warnings)
    return rows, info
