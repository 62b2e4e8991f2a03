"""Agentic chains (issue 39 item 2): a session of steps — model calls separated by tool waits,
some steps fanning out k parallel calls that are joined — planned from the seed, run closed
loop inside a session in the simulator and the live executor, a failed step ending its session
as one cancelled record per unsent call.

What would break if it were wrong: a step sent before its predecessor's calls all returned
plus the tool time; a fan-out whose calls are not sent together; a failed call whose session
goes on, or whose unsent calls vanish from the records; a plan that differs between two builds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fairbench.plan.materialize import materialize
from fairbench.plan.model import PlannedRequest
from fairbench.plan.sessions import session_steps
from fairbench.run.executor import ExecOptions, Executor
from fairbench.run.records import JournalWriter, check_accounting, read_journal
from fairbench.targets.base import Done, Failed, Started, TargetEvent, Token
from fairbench.targets.mock import MockTarget
from fairbench.targets.sim import run_sim
from fairbench.workload.scenario import ScenarioError, parse_scenario
from fairbench.workload.sessions import agent_workloads

TOOL_NS = 40_000_000


def agent_scenario(
    agent: dict[str, Any] | None = None, seed: int = 2, kind: str = "sim", **run: Any
) -> Any:
    agent = agent or {
        "steps": {"dist": "uniform", "low": 3, "high": 8},
        "tool_time": {"dist": "constant", "value": "40ms"},
        "fan_out": {"every": 3, "k": 4},
    }
    scn: dict[str, Any] = {
        "name": "agents",
        "workloads": {
            "agent": {
                "prompt_tokens": {"dist": "uniform", "low": 20, "high": 60},
                "output_tokens": {"dist": "uniform", "low": 5, "high": 30},
                "session": {"agent": agent},
            },
            "one": {"prompt_tokens": 50, "output_tokens": 5},
        },
        "tenants": [
            {"id": "bot", "mix": "agent", "arrival": {"process": "poisson", "rate": "4/s"}},
            {"id": "solo", "mix": "one", "arrival": {"process": "poisson", "rate": "2/s"}},
        ],
        "run": {"duration": "5s", "seed": seed, **run},
        "scheduler": {"policy": "fifo", "prefix_cache": {"blocks": 65536}},
    }
    if kind == "sim":
        scn["target"] = {"kind": "sim"}
    else:
        del scn["scheduler"]
    return parse_scenario(scn)


def dumped(scn: Any) -> dict[str, Any]:
    """The scenario as a dict again (without the chat default think_time an agent refuses)."""
    raw = scn.model_dump(mode="json", exclude_none=True)
    raw["workloads"]["agent"]["session"].pop("think_time", None)
    return raw


def by_step(plan: Any) -> dict[int, list[list[int]]]:
    """session id -> its steps, each the rows of its calls."""
    out: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i in range(len(plan)):
        sid, turn = int(plan.sessions["session_id"][i]), int(plan.sessions["turn"][i])
        if sid >= 0:
            out[sid][turn].append(i)
    return {sid: [steps[t] for t in sorted(steps)] for sid, steps in out.items()}


def test_the_plan_fans_out_every_third_step_and_is_deterministic() -> None:
    plan = materialize(agent_scenario())
    again = materialize(agent_scenario())
    assert plan.digest == again.digest
    assert plan.digest != materialize(agent_scenario(seed=3)).digest
    sessions = by_step(plan)
    assert len(sessions) > 10
    for steps in sessions.values():
        assert 3 <= len(steps) <= 8
        for number, calls in enumerate(steps, start=1):
            assert len(calls) == (4 if number % 3 == 0 else 1)
            offsets = {int(plan.columns["offset_ns"][r]) for r in calls}
            assert len(offsets) == 1  # a fan-out's calls are due together
        first = int(plan.columns["offset_ns"][steps[0][0]])
        for number, calls in enumerate(steps[1:], start=1):
            # the earliest time: the session's arrival plus the tool times before the step
            assert int(plan.columns["offset_ns"][calls[0]]) == first + number * TOOL_NS
    structure = session_steps(plan)
    assert len(structure.starts) - 1 == sum(len(s) for s in sessions.values())


def test_a_10000_session_agent_plan_is_deterministic() -> None:
    raw = dumped(agent_scenario())
    raw["tenants"][0]["arrival"]["rate"] = "2000/s"
    a, b = materialize(parse_scenario(raw)), materialize(parse_scenario(raw))
    assert a.digest == b.digest
    assert int(a.sessions["session_id"].max()) + 1 >= 10_000


def test_in_the_sim_a_step_waits_for_all_its_predecessors_calls_plus_the_tool_time() -> None:
    scn = agent_scenario()
    plan = materialize(scn)
    rows, _ = run_sim(plan, scn)
    assert check_accounting(len(plan), rows).holds
    fan_outs = 0
    for steps in by_step(plan).values():
        for prev, calls in itertools.pairwise(steps):
            done = max(rows[r]["t_done_ns"] for r in prev)
            sent = {rows[r]["t_sent_ns"] for r in calls}
            assert sent == {done + TOOL_NS}  # never before the join plus the tool time
            if len(calls) > 1:
                fan_outs += 1  # all k sent at once
        for calls in steps:
            assert all(rows[r]["status"] == "ok" for r in calls)
    assert fan_outs > 5


def test_the_next_step_begins_with_every_call_of_the_fan_out() -> None:
    scn = agent_scenario()
    plan = materialize(scn)
    rows, _ = run_sim(plan, scn)
    checked = 0
    for steps in by_step(plan).values():
        for prev, calls in itertools.pairwise(steps):
            grown = sum(
                int(plan.columns["prompt_tokens"][r]) + rows[r]["output_tokens"] for r in prev
            )
            history = rows[prev[0]]["prompt_tokens"] - int(plan.columns["prompt_tokens"][prev[0]])
            for r in calls:
                own = int(plan.columns["prompt_tokens"][r])
                assert rows[r]["prompt_tokens"] == history + grown + own
            checked += len(prev) > 1
    assert checked > 5


def test_in_the_sim_a_failed_call_cancels_the_rest_of_its_session() -> None:
    scn = agent_scenario(timeout="60ms")
    plan = materialize(scn)
    rows, _ = run_sim(plan, scn)
    assert check_accounting(len(plan), rows).holds
    ended = 0
    for steps in by_step(plan).values():
        statuses = [[rows[r]["status"] for r in calls] for calls in steps]
        bad = next((i for i, s in enumerate(statuses) if any(x != "ok" for x in s)), None)
        if bad is None:
            continue
        for later in steps[bad + 1 :]:
            for r in later:
                assert rows[r]["status"] == "cancelled"
                assert rows[r]["error_detail"].startswith(f"not sent: step {bad + 1} (")
                assert rows[r].get("t_sent_ns") is None
        ended += bad + 1 < len(steps)
    assert ended > 0


@pytest.mark.parametrize(
    ("session", "field"),
    [
        ({"turns": 3, "agent": {"steps": 3}}, "session.turns"),
        ({"agent": {"steps": 3}, "think_time": {"dist": "constant", "value": "1s"}}, "think_time"),
        ({"agent": {"steps": 3, "fan_out": {"every": 1, "k": 3}}}, "fan_out.every"),
        ({"agent": {"steps": 3, "fan_out": {"every": 2, "k": 1}}}, "fan_out.k"),
        ({"context_limit": 100}, "session.turns"),
    ],
)
def test_bad_agent_blocks_are_one_line_errors(session: dict[str, Any], field: str) -> None:
    raw = agent_scenario().model_dump(mode="json", exclude_none=True)
    raw["workloads"]["agent"]["session"] = session
    with pytest.raises(ScenarioError) as error:
        parse_scenario(raw)
    lines = str(error.value).splitlines()
    assert len(lines) == 1 and field in lines[0]


class Agentic:
    """A mock target that fails step 2's calls of odd sessions, and records when it was sent
    what."""

    def __init__(self, fail_step: int | None = None) -> None:
        self.sent: dict[int, int] = {}
        self.fail_step = fail_step

    async def handler(self, req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        self.sent[req.request_id] = req.prompt_tokens
        yield Started()
        if req.turn == self.fail_step and req.session_id % 2:
            yield Failed("http_5xx", "boom", http_status=500)
            return
        for _ in range(3):
            await asyncio.sleep(0.002)
            yield Token(1)
        yield Done(3)


async def live(tmp_path: Path, plan: Any, target: Agentic) -> dict[int, dict[str, Any]]:
    journal = JournalWriter(tmp_path / "journal.jsonl")
    options = ExecOptions(agent_workloads=("agent",))  # as fairbench.run.measure sets it
    await Executor(plan, MockTarget(target.handler), journal, options).run()
    journal.close()
    rows = read_journal(tmp_path / "journal.jsonl")
    assert check_accounting(len(plan), rows).holds
    return {r["request_id"]: r for r in rows}


def live_plan() -> Any:
    raw = dumped(agent_scenario(kind="mock"))
    raw["workloads"]["agent"]["session"]["agent"]["steps"] = 4
    raw["workloads"]["agent"]["session"]["agent"]["fan_out"] = {"every": 2, "k": 3}
    raw["run"]["duration"] = "1s"
    raw["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9"}
    return materialize(parse_scenario(raw))


async def test_live_steps_join_their_fan_out_and_wait_for_the_tool(tmp_path: Path) -> None:
    plan = live_plan()
    rows = await live(tmp_path, plan, Agentic())
    sessions = by_step(plan)
    assert len(sessions) >= 2
    for steps in sessions.values():
        assert [len(c) for c in steps] == [1, 3, 1, 3]
        for prev, calls in itertools.pairwise(steps):
            due = max(rows[r]["t_done_ns"] for r in prev) + TOOL_NS
            for r in calls:
                assert rows[r]["status"] == "ok"
                assert rows[r]["t_intended_ns"] == due  # latency from when it became due
                assert rows[r]["t_sent_ns"] >= due  # never before the join plus the tool


async def test_live_a_failed_fan_out_call_cancels_the_rest(tmp_path: Path) -> None:
    plan = live_plan()
    target = Agentic(fail_step=2)
    rows = await live(tmp_path, plan, target)
    ended = 0
    for sid, steps in by_step(plan).items():
        statuses = [[rows[r]["status"] for r in calls] for calls in steps]
        if sid % 2:
            assert statuses == [["ok"], ["error"] * 3, ["cancelled"], ["cancelled"] * 3]
            for calls in steps[2:]:
                for r in calls:
                    assert r not in target.sent
                    assert "not sent: step 2 (error) of its" in rows[r]["error_detail"]
            ended += 1
        else:
            assert all(s == "ok" for step in statuses for s in step)
    assert ended > 0


def test_the_run_names_agent_workloads_for_the_cancel_reason() -> None:
    """fairbench.run.measure passes these to the executor: an agent's cancel reason says
    "step N", a chat's "turn N" (tests/test_sessions*.py check both messages)."""
    assert agent_workloads(agent_scenario()) == ("agent",)
    raw = dumped(agent_scenario())
    raw["workloads"]["agent"]["session"] = {"turns": 3}
    assert agent_workloads(parse_scenario(raw)) == ()


def test_an_agent_scenario_parses_again_with_every_default_spelt_out() -> None:
    """A run directory's scenario.yaml is the whole dump, the chat default think_time included,
    and the report parses it again: an agent's default think_time is not a conflict."""
    scn = agent_scenario()
    again = parse_scenario(scn.model_dump(mode="json"))
    assert again == scn
    raw = dumped(scn)
    raw["workloads"]["agent"]["session"]["think_time"] = {"dist": "constant", "value": "1s"}
    with pytest.raises(ScenarioError, match=r"session\.think_time: an agent waits"):
        parse_scenario(raw)


def test_the_shipped_agent_scenario_runs_in_the_sim() -> None:
    """scenarios/agent-research.yaml (docs/sessions.md runs it): agent chains with tool waits
    and a fan-out of 4 every third step, beside a chat tenant's conversations."""
    from fairbench.workload.scenario import load_scenario

    root = Path(__file__).resolve().parents[1]
    scn = load_scenario(root / "scenarios" / "agent-research.yaml")
    plan = materialize(scn)
    rows, _ = run_sim(plan, scn)
    assert check_accounting(len(plan), rows).holds
    tenants = plan.names("tenant")
    agents = by_step(plan)
    research = [s for s in agents.values() if tenants[s[0][0]] == "research-agent"]
    chats = [s for s in agents.values() if tenants[s[0][0]] == "chat-app"]
    assert len(research) > 10 and len(chats) > 50
    assert all(len(s[2]) == 4 for s in research if len(s) >= 3)  # step 3 fans out
    assert all(len(calls) == 1 for s in chats for calls in s)
    assert all(r["status"] == "ok" for r in rows)
