"""Sessions in the live executor: the schedule is of sessions (open loop), inside a session the
loop is closed — turn k+1 is sent no earlier than turn k's completion plus its think time, with
the conversation so far and the output the target actually returned as its prompt. A turn that
fails ends its session, one cancelled record per unsent turn; shards split sessions whole.

Nothing here asserts how late a send may be (that is the machine's; benchmarks measure it)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.plan.materialize import materialize
from fairbench.plan.model import PlannedRequest
from fairbench.run.executor import ExecOptions, Executor
from fairbench.run.records import JournalWriter, check_accounting, read_journal
from fairbench.targets.base import Done, Failed, Started, TargetEvent, Token
from fairbench.targets.mock import MockTarget
from fairbench.workload.prompts import text_of
from fairbench.workload.scenario import parse_scenario
from fairbench.workload.sessions import output_ids

THINK_NS = 30_000_000


def plan_of(turns: int = 3, rate: str = "20/s", duration: str = "1s") -> Any:
    scn = parse_scenario(
        {
            "workloads": {
                "chat": {
                    "prompt_tokens": {"dist": "uniform", "low": 5, "high": 20},
                    "output_tokens": 10,
                    "session": {
                        "turns": turns,
                        "think_time": {"dist": "constant", "value": "30ms"},
                    },
                },
                "one": {"prompt_tokens": 8, "output_tokens": 3},
            },
            "tenants": [
                {"id": "chat", "mix": "chat", "arrival": {"process": "poisson", "rate": rate}},
                {"id": "solo", "mix": "one", "arrival": {"process": "poisson", "rate": "10/s"}},
            ],
            "run": {"duration": duration, "seed": 5},
        }
    )
    return materialize(scn)


def returned(req: PlannedRequest) -> int:
    """What the mock returns: not the planned max_tokens, so the conversation must use it."""
    return 2 + req.request_id % 4


class Recorder:
    """A mock target that remembers what it was sent, and when."""

    def __init__(self, fail_turn: int | None = None) -> None:
        self.prompts: dict[int, str] = {}
        self.fail_turn = fail_turn

    async def handler(self, req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        self.prompts[req.request_id] = req.prompt()
        yield Started()
        if self.fail_turn is not None and req.turn == self.fail_turn and req.session_id % 2:
            yield Failed("http_5xx", "boom", http_status=500)
            return
        n = returned(req)
        for _ in range(n):
            await asyncio.sleep(0.002)
            yield Token(1)
        yield Done(n)


async def execute(tmp_path: Path, plan: Any, target: Any, **kw: Any) -> dict[int, dict[str, Any]]:
    journal = JournalWriter(tmp_path / "journal.jsonl")
    ex = Executor(plan, MockTarget(target.handler), journal, ExecOptions(**kw))
    await ex.run()
    journal.close()
    rows = read_journal(tmp_path / "journal.jsonl")
    assert check_accounting(len(plan), rows).holds
    return {r["request_id"]: r for r in rows}


def sessions_of(plan: Any) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for i, sid in enumerate(plan.sessions["session_id"]):
        if sid >= 0:
            out[int(sid)].append(i)
    return out


async def test_turns_follow_completion_plus_think_with_the_conversation(tmp_path: Path) -> None:
    plan = plan_of()
    target = Recorder()
    rows = await execute(tmp_path, plan, target)
    sessions = sessions_of(plan)
    assert len(sessions) > 5
    for session_rows in sessions.values():
        assert [rows[i]["turn"] for i in session_rows] == [1, 2, 3]
        for prev, row in itertools.pairwise(session_rows):
            a, b = rows[prev], rows[row]
            assert a["status"] == b["status"] == "ok"
            due = a["t_done_ns"] + THINK_NS
            assert b["t_intended_ns"] == due  # latency is measured from when it became due
            assert b["t_sent_ns"] >= due  # never before the last turn completed plus think
            # the prompt as sent: the previous prompt, the output it actually got, new text
            req = plan.request(prev)
            lead = target.prompts[prev] + " " + text_of(output_ids(req.prompt_seed, returned(req)))
            assert target.prompts[row].startswith(lead + " ")
            assert b["prompt_tokens"] == len(target.prompts[row].split())
            assert b["prompt_tokens"] == a["prompt_tokens"] + returned(req) + int(
                plan.columns["prompt_tokens"][row]
            )
        assert rows[session_rows[0]]["t_intended_ns"] == int(
            plan.columns["offset_ns"][session_rows[0]]
        )
    solo = [r for r in rows.values() if r["tenant"] == "solo"]
    assert solo and all(r["session_id"] is None and r["turn"] is None for r in solo)


async def test_a_failed_turn_cancels_the_rest_of_its_session(tmp_path: Path) -> None:
    plan = plan_of(turns=4)
    target = Recorder(fail_turn=2)
    rows = await execute(tmp_path, plan, target)
    failed = 0
    for sid, session_rows in sessions_of(plan).items():
        statuses = [rows[i]["status"] for i in session_rows]
        if sid % 2:
            assert statuses == ["ok", "error", "cancelled", "cancelled"]
            for i in session_rows[2:]:
                assert i not in target.prompts  # never sent
                assert rows[i]["t_sent_ns"] is None
                assert "turn 2 (error)" in rows[i]["error_detail"]
            failed += 1
        else:
            assert statuses == ["ok"] * 4
    assert failed > 0


async def test_shards_split_sessions_whole(tmp_path: Path) -> None:
    """Two executors on one t0, each with every other row (as shards are cut): each session is
    run by the owner of its first turn, and every row is recorded exactly once."""
    plan = plan_of()
    target = Recorder()
    journals = [JournalWriter(tmp_path / f"journal{k}.jsonl") for k in range(2)]
    executors = [
        Executor(
            plan,
            MockTarget(target.handler),
            journals[k],
            ExecOptions(),
            np.arange(k, len(plan), 2),
            worker=k,
        )
        for k in range(2)
    ]
    t0 = time.perf_counter_ns() + 200_000_000
    await asyncio.gather(*(ex.run(t0) for ex in executors))
    rows = []
    for k, journal in enumerate(journals):
        journal.close()
        rows += read_journal(tmp_path / f"journal{k}.jsonl")
    assert check_accounting(len(plan), rows).holds
    assert sum(ex.counters.planned for ex in executors) == len(plan)
    worker = {r["request_id"]: r["worker"] for r in rows}
    for session_rows in sessions_of(plan).values():
        assert len({worker[i] for i in session_rows}) == 1
    assert all(r["status"] == "ok" for r in rows)


async def test_a_stop_mid_session_records_every_turn_once(tmp_path: Path) -> None:
    plan = plan_of(turns=5, duration="2s")
    target = Recorder()
    journal = JournalWriter(tmp_path / "journal.jsonl")
    ex = Executor(plan, MockTarget(target.handler), journal, ExecOptions(grace_s=0.05))

    async def stop_soon() -> None:
        await asyncio.sleep(0.8)
        ex.stop.set()

    stopper = asyncio.create_task(stop_soon())
    await ex.run()
    await stopper
    journal.close()
    rows = read_journal(tmp_path / "journal.jsonl")
    assert check_accounting(len(plan), rows).holds
    unsent = [r for r in rows if r["status"] == "cancelled" and r["t_sent_ns"] is None]
    assert any(r["turn"] and r["turn"] > 1 for r in unsent)
