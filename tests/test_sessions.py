"""Multi-turn sessions: the plan (turns, earliest times, determinism), the conversation rule
(turn k's prompt begins with turn k−1's prompt and output), and the simulator's closed loop
inside a session (turn k+1 due when turn k completed plus its think time; prefix-cache hits
rising with turns; a turn that did not finish cancels the rest of its session, one record each).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fairbench.plan.materialize import materialize
from fairbench.plan.model import load_plan
from fairbench.plan.sessions import Conversation
from fairbench.run.records import check_accounting
from fairbench.targets.sim import run_sim
from fairbench.workload.scenario import ScenarioError, parse_scenario
from fairbench.workload.sessions import output_ids

ROOT = Path(__file__).resolve().parents[1]


def chat_scenario(
    session: dict[str, Any] | None = None,
    rate: str = "2/s",
    duration: str = "30s",
    prefix: dict[str, Any] | None = None,
    **run: Any,
) -> Any:
    chat: dict[str, Any] = {
        "prompt_tokens": {"dist": "uniform", "low": 40, "high": 120},
        "output_tokens": {"dist": "uniform", "low": 30, "high": 90},
        "session": session
        or {"turns": {"dist": "uniform", "low": 2, "high": 6}, "think_time": "1s"},
    }
    if prefix:
        chat["prefix"] = prefix
    chat["session"].setdefault("think_time", {"dist": "exponential", "mean": "1s"})
    if isinstance(chat["session"]["think_time"], str):
        chat["session"]["think_time"] = {"dist": "constant", "value": chat["session"]["think_time"]}
    return parse_scenario(
        {
            "name": "sessions-test",
            "workloads": {
                "chat": chat,
                "doc": {"endpoint": "completions", "prompt_tokens": 300, "output_tokens": 20},
            },
            "tenants": [
                {"id": "app", "mix": "chat", "arrival": {"process": "poisson", "rate": rate}},
                {"id": "docs", "mix": "doc", "arrival": {"process": "poisson", "rate": "1/s"}},
            ],
            "run": {"duration": duration, "seed": 3, **run},
            "target": {"kind": "sim"},
            "scheduler": {"policy": "fifo", "prefix_cache": {"blocks": 65536}},
        }
    )


def by_session(plan: Any) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for i, sid in enumerate(plan.sessions["session_id"]):
        if sid >= 0:
            out[int(sid)].append(i)
    return out


# ------------------------------------------------------------------ the plan


def test_a_plan_without_sessions_has_no_session_columns() -> None:
    scn = parse_scenario(
        {
            "workloads": {"w": {"prompt_tokens": 10}},
            "tenants": [{"id": "t", "mix": "w", "arrival": {"process": "poisson", "rate": "5/s"}}],
            "run": {"duration": "5s"},
        }
    )
    plan = materialize(scn)
    assert plan.sessions is None
    assert plan.request(0).session_id == -1 and plan.request(0).turn == 0


def test_sessions_expand_into_turns_at_their_earliest_times() -> None:
    plan = materialize(chat_scenario())
    s = plan.sessions
    assert s is not None
    sessions = by_session(plan)
    counts = np.array([len(rows) for rows in sessions.values()])
    assert counts.min() >= 2 and counts.max() <= 6 and len(set(counts)) == 5
    offsets = plan.columns["offset_ns"]
    for rows in sessions.values():
        assert list(s["turn"][rows]) == list(range(1, len(rows) + 1))
        assert s["think_ns"][rows[0]] == 0
        # earliest time: the session's arrival plus every think time before the turn
        expected = offsets[rows[0]] + np.cumsum(s["think_ns"][rows])
        assert np.array_equal(offsets[rows], expected)
        assert np.all(s["think_ns"][rows[1:]] == 1_000_000_000)
    docs = plan.names("tenant") == "docs"
    assert np.all(s["session_id"][docs] == -1) and np.all(s["turn"][docs] == 0)
    # ids number sessions in order of their first turn
    first = [rows[0] for _, rows in sorted(sessions.items())]
    assert first == sorted(first)


def test_a_10000_session_plan_is_deterministic_from_its_seed(tmp_path: Path) -> None:
    session = {
        "turns": {"dist": "uniform", "low": 1, "high": 8},
        "think_time": {"dist": "exponential", "mean": "2s"},
    }
    scn = chat_scenario(session, rate="100/s", duration="100s")
    scn = scn.model_copy(update={"tenants": scn.tenants[:1]})
    scn = parse_scenario(scn.model_dump(mode="json", exclude_none=True))
    a, b = materialize(scn), materialize(scn)
    assert a.sessions is not None
    assert 9_500 < int(a.sessions["session_id"].max()) + 1 < 10_500
    assert a.digest == b.digest
    for name in a.sessions:
        assert np.array_equal(a.sessions[name], b.sessions[name])  # type: ignore[index]
    path = tmp_path / "plan.parquet"
    a.save(path)
    back = load_plan(path)
    assert back.digest == a.digest and back.sessions is not None
    assert np.array_equal(back.sessions["think_ns"], a.sessions["think_ns"])
    other = materialize(scn, seed=4)
    assert other.digest != a.digest


def test_bad_session_fields_name_the_field() -> None:
    with pytest.raises(ScenarioError) as error:
        chat_scenario({"turns": 3, "think_time": {"dist": "uniform", "low": "2s", "high": "1s"}})
    assert "session" in str(error.value) and "think_time" in str(error.value)


# ------------------------------------------------------------------ the conversation


def test_turn_k_prompt_begins_with_turn_k_minus_1_prompt_and_output() -> None:
    plan = materialize(chat_scenario(prefix={"groups": 2, "tokens": 32}))
    rows = max(by_session(plan).values(), key=len)
    conv = Conversation()
    previous = None
    for k, row in enumerate(rows, start=1):
        req = plan.request(row)
        sent = conv.as_sent(req)
        ids = sent.prompt_ids()
        assert sent.prompt_tokens == len(ids) == len(sent.prompt().split())
        assert np.array_equal(ids[-req.prompt_tokens :], req.user_ids())
        if previous is not None:
            prev_req, prev_ids, served = previous
            lead = np.concatenate([prev_ids, output_ids(prev_req.prompt_seed, served)])
            assert np.array_equal(ids[: len(lead)], lead), f"turn {k}"
            assert len(ids) == len(lead) + req.prompt_tokens
        served = 7 * k  # what the target returned, not what was planned
        conv.completed(req, served)
        previous = (req, ids, served)


def test_the_context_limit_keeps_the_last_tokens() -> None:
    session = {"turns": 6, "think_time": "0s", "context_limit": 300}
    plan = materialize(chat_scenario(session))
    rows = next(iter(by_session(plan).values()))
    conv = Conversation()
    whole: list[np.ndarray] = []
    for row in rows:
        req = plan.request(row)
        sent = conv.as_sent(req)
        untruncated = np.concatenate([*whole, req.user_ids()])
        assert sent.prompt_tokens == min(300, len(untruncated))
        assert np.array_equal(sent.prompt_ids(), untruncated[-300:])
        conv.completed(req, req.max_tokens)
        whole += [req.user_ids(), output_ids(req.prompt_seed, req.max_tokens)]
    assert len(untruncated) > 300  # the limit was reached


# ------------------------------------------------------------------ the simulator


def sim_rows(scn: Any) -> tuple[Any, list[dict[str, Any]]]:
    plan = materialize(scn)
    rows, _info = run_sim(plan, scn)
    assert check_accounting(len(plan), rows).holds
    assert len(rows) == len(plan)
    return plan, sorted(rows, key=lambda r: r["request_id"])


def test_sim_sends_turn_k_plus_1_only_after_turn_k_completed_plus_think_time() -> None:
    scn = chat_scenario({"turns": {"dist": "uniform", "low": 2, "high": 5}}, rate="4/s")
    plan, rows = sim_rows(scn)
    think = plan.sessions["think_ns"]
    checked = 0
    for session_rows in by_session(plan).values():
        for prev, row in itertools.pairwise(session_rows):
            a, b = rows[prev], rows[row]
            assert a["status"] == "ok" and b["turn"] == a["turn"] + 1
            assert b["session_id"] == a["session_id"]
            assert b["t_intended_ns"] == a["t_done_ns"] + think[row]
            assert b["t_sent_ns"] >= a["t_done_ns"] + think[row]
            # later than planned: the plan holds the earliest time
            assert b["t_intended_ns"] >= plan.columns["offset_ns"][row]
            # the whole prompt as sent: the previous prompt, its output, the new user text
            new_text = int(plan.columns["prompt_tokens"][row])
            assert b["prompt_tokens"] == a["prompt_tokens"] + a["output_tokens"] + new_text
            checked += 1
    assert checked > 50
    assert all(r["session_id"] is None for r in rows if r["tenant"] == "docs")


def test_sim_prefix_cache_hits_rise_with_turns() -> None:
    scn = chat_scenario({"turns": 5, "think_time": "500ms"}, rate="3/s", duration="40s")
    _, rows = sim_rows(scn)
    rate = {}
    for k in range(1, 6):
        mine = [r for r in rows if r["turn"] == k and r["status"] == "ok"]
        assert len(mine) > 50
        rate[k] = sum(r["cached_tokens"] for r in mine) / sum(r["prompt_tokens"] for r in mine)
    assert rate[1] < 0.05  # no shared prefix: a first turn hits nothing
    for k in range(1, 5):
        assert rate[k + 1] > rate[k], rate


def test_a_turn_that_times_out_cancels_the_rest_of_its_session() -> None:
    # long outputs against a 1.5 s timeout: some turns do not finish
    scn = chat_scenario({"turns": 4, "think_time": "100ms"}, rate="8/s", timeout="1.5s")
    scn = parse_scenario(
        {
            **scn.model_dump(mode="json", exclude_none=True),
            "workloads": {
                **scn.model_dump(mode="json", exclude_none=True)["workloads"],
                "chat": {
                    "prompt_tokens": 2000,
                    "output_tokens": 400,
                    "session": {"turns": 4, "think_time": {"dist": "constant", "value": 0.1}},
                },
            },
        }
    )
    plan, rows = sim_rows(scn)
    unsent = 0
    for session_rows in by_session(plan).values():
        statuses = [rows[i]["status"] for i in session_rows]
        failed = next((k for k, s in enumerate(statuses) if s != "ok"), None)
        if failed is None:
            continue
        for later in session_rows[failed + 1 :]:
            r = rows[later]
            assert r["status"] == "cancelled" and r.get("t_sent_ns") is None
            assert f"turn {failed + 1} (" in r["error_detail"]
            unsent += 1
    assert unsent > 0


def test_the_shipped_sessions_scenario_runs_in_the_sim() -> None:
    from fairbench.workload.scenario import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "sessions-chat.yaml")
    plan, rows = sim_rows(scn)
    assert plan.sessions is not None
    assert {r["turn"] for r in rows if r["turn"]} == {1, 2, 3, 4, 5, 6}


# ------------------------------------------------------------------ per-session figures


def test_session_figures_from_the_records() -> None:
    from fairbench.analysis.sessions import session_block, session_observations
    from fairbench.run.records import records_frame

    scn = chat_scenario({"turns": 4, "think_time": "100ms"}, rate="8/s", timeout="1.5s")
    data = scn.model_dump(mode="json", exclude_none=True)
    data["workloads"]["chat"] = {
        "prompt_tokens": 500,
        "output_tokens": {"dist": "uniform", "low": 20, "high": 150},
        "session": {"turns": 4, "think_time": {"dist": "constant", "value": 0.1}},
    }
    scn = parse_scenario(data)
    plan, rows = sim_rows(scn)
    df = records_frame(rows)
    block = session_block(df, 1.5)
    sessions = by_session(plan)
    assert block["sessions"] == len(sessions)
    complete = [s for s, r in sessions.items() if all(rows[i]["status"] == "ok" for i in r)]
    assert 0 < block["complete"] == len(complete) < len(sessions)
    ok_turns = sum(rows[i]["status"] == "ok" for r in sessions.values() for i in r)
    assert block["turns_completed"] == ok_turns
    obs = session_observations(df, 1.5)
    first = complete[0]
    e2e = rows[sessions[first][-1]]["t_done_ns"] - rows[sessions[first][0]]["t_intended_ns"]
    assert e2e in obs.time[obs.observed]
    assert obs.unfinished == len(sessions) - len(complete)
    p50 = block["session_e2e_ms"]["p50"]
    assert p50["n"] == len(sessions) and p50["ci_method"]
    assert set(block["ttft_by_turn_ms"]) == {"1", "2", "3", "4"}
    # the window keeps whole sessions by their first turn's intended time
    late = session_block(df, 1.5, (10.0, 30.0))
    starts = [rows[r[0]]["t_intended_ns"] / 1e9 for r in sessions.values()]
    assert late["sessions"] == sum(10.0 <= t <= 30.0 for t in starts)
    assert session_block(df[df["session_id"].isna()], 1.5) == {}


def test_what_sessions_cannot_do_is_refused_naming_the_field() -> None:
    data = chat_scenario().model_dump(mode="json", exclude_none=True)
    data["workloads"]["emb"] = {
        "endpoint": "embeddings",
        "prompt_tokens": 10,
        "session": {"turns": 2},
    }
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    assert "workloads.emb.session: embeddings have no conversation" in str(error.value)
    data = chat_scenario().model_dump(mode="json", exclude_none=True)
    data["scheduler"]["disaggregation"] = {"prefill_replicas": 1, "decode_replicas": 1}
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    assert "scheduler.disaggregation: the simulator runs sessions colocated only" in str(
        error.value
    )
