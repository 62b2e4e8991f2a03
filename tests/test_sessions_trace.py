"""Trace replay with sessions (fairbench.workload.conversations): a trace's conversations become
sessions. The fixtures in tests/data/conversations/ are generated (tests/data/SOURCES.md):
60 conversations of 3-6 turns as our generic JSONL (turn index and recorded latency), the same
conversations as CSV with ISO times and whole prompts, and rows in BurstGPT v2.0's header.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fairbench.plan.materialize import materialize
from fairbench.run.records import check_accounting
from fairbench.targets.sim import run_sim
from fairbench.workload.loading import parse_scenario
from fairbench.workload.scenario import ScenarioError
from fairbench.workload.traces import TraceError, read_trace
from tests.cli import run_cli

DATA = Path(__file__).resolve().parent / "data" / "conversations"
JSONL = DATA / "chat.jsonl"
WHOLE = DATA / "chat_whole.csv"
BURST = DATA / "burstgpt_v2_sessions.csv"


def conversations() -> dict[str, list[dict[str, Any]]]:
    """The JSONL fixture's conversations, each turn in order, read without fairbench."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in JSONL.read_text().splitlines():
        row = json.loads(line)
        out[row["conversation_id"]].append(row)
    return {k: sorted(v, key=lambda r: r["turn"]) for k, v in out.items()}


def scenario(trace: dict[str, Any], tenants: int = 1, **run: Any) -> Any:
    return parse_scenario(
        {
            "name": "trace-sessions",
            "workloads": {"chat": {"prompt_tokens": 10}},
            "traces": {"log": trace},
            "tenants": [
                {
                    "id": f"t{i}",
                    "mix": "chat",
                    "arrival": {"process": "trace", "trace": "log"}
                    | ({"share": 1} if tenants > 1 else {}),
                }
                for i in range(tenants)
            ],
            "run": {"seed": 5, **run},
            "target": {"kind": "sim"},
            "scheduler": {"policy": "fifo", "prefix_cache": {"blocks": 65536}},
        }
    )


def jsonl_scenario(**kw: Any) -> Any:
    return scenario({"format": "conversation", "path": str(JSONL)}, **kw)


def by_session(plan: Any) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for i in np.argsort(plan.sessions["turn"], kind="stable"):
        sid = int(plan.sessions["session_id"][i])
        if sid >= 0:
            out[sid].append(int(i))
    return out


# ------------------------------------------------------------------ the plan


def test_each_conversation_becomes_one_session_with_its_turns_in_order() -> None:
    truth = conversations()
    plan = materialize(jsonl_scenario())
    sessions = by_session(plan)
    assert len(plan) == sum(len(v) for v in truth.values()) and len(sessions) == len(truth) == 60
    seen = set()
    for rows in sessions.values():
        turns = plan.sessions["turn"][rows].tolist()
        assert turns == list(range(1, len(rows) + 1))
        new_text = plan.columns["prompt_tokens"][rows].tolist()
        outputs = plan.columns["max_tokens"][rows].tolist()
        # which conversation: the one whose turns have exactly these lengths
        match = [
            cid
            for cid, conv in truth.items()
            if [r["input_tokens"] for r in conv] == new_text
            and [r["output_tokens"] for r in conv] == outputs
        ]
        assert len(match) == 1
        seen.add(match[0])
        # a conversation's first turn arrives at its timestamp (the trace's first row at 0)
        first = truth[match[0]][0]["timestamp"] - 0.488
        assert plan.columns["offset_ns"][rows[0]] == round(first * 1e9)
        assert (np.diff(plan.columns["offset_ns"][rows]) >= 0).all()  # earliest times
    assert len(seen) == 60
    # sessions: false replays the same rows one by one, each at its own timestamp
    flat = materialize(scenario({"format": "conversation", "path": str(JSONL), "sessions": False}))
    assert flat.sessions is None and len(flat) == len(plan)
    stamps = sorted(r["timestamp"] - 0.488 for c in truth.values() for r in c)
    assert np.allclose(flat.columns["offset_ns"], np.rint(np.array(stamps) * 1e9), atol=2)


def test_think_time_is_the_gap_less_the_recorded_latency() -> None:
    truth = conversations()
    plan = materialize(jsonl_scenario())
    think = plan.sessions["think_ns"]
    expected = sorted(
        round(max(b["timestamp"] - a["timestamp"] - a["latency_s"], 0.0) * 1e9)
        for conv in truth.values()
        for a, b in itertools.pairwise(conv)
    )
    later = plan.sessions["turn"] > 1
    assert np.allclose(sorted(think[later]), expected, atol=2)  # float rounding of the stamps
    assert (think[~later] == 0).all()


def test_a_log_export_with_whole_prompts_and_iso_times_gives_the_same_sessions() -> None:
    """chat_whole.csv: the same conversations, input tokens counting the whole conversation,
    no latency column (think time is then the whole gap) and no turn column."""
    whole = materialize(
        scenario({"format": "conversation", "path": str(WHOLE), "turn_input": "whole"})
    )
    plain = materialize(jsonl_scenario())
    mine, theirs = by_session(whole), by_session(plain)
    assert mine.keys() == theirs.keys()
    for sid, rows in mine.items():
        other = theirs[sid]
        assert (whole.columns["prompt_tokens"][rows] == plain.columns["prompt_tokens"][other]).all()
        assert (whole.sessions["turn"][rows] == plain.sessions["turn"][other]).all()
        gaps = whole.sessions["think_ns"][rows[1:]] - plain.sessions["think_ns"][other[1:]]
        assert (gaps > 0.4e9).all()  # the latencies (0.5-3 s) are in the gaps now
    read_as_new = materialize(scenario({"format": "conversation", "path": str(WHOLE)}))
    assert read_as_new.columns["prompt_tokens"].sum() > 2 * plain.columns["prompt_tokens"].sum()


def test_the_plan_is_deterministic_and_conversations_stay_whole(tmp_path: Path) -> None:
    a, b = materialize(jsonl_scenario(tenants=2)), materialize(jsonl_scenario(tenants=2))
    assert a.digest == b.digest
    a.save(tmp_path / "a.parquet")
    b.save(tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    tenants = a.names("tenant")
    for rows in by_session(a).values():
        assert len(set(tenants[rows])) == 1  # a conversation is one tenant's
    assert 0.3 < (tenants == "t0").mean() < 0.7
    hashed = scenario({"format": "conversation", "path": str(JSONL), "split": "hash"}, tenants=2)
    assert materialize(hashed).digest == materialize(hashed).digest


def test_a_window_keeps_the_conversations_that_open_in_it_whole() -> None:
    truth = conversations()
    plan = materialize(
        scenario({"format": "conversation", "path": str(JSONL), "start": 30, "end": 60})
    )
    opened = [c for c in truth.values() if 30 <= c[0]["timestamp"] - 0.488 < 60]
    assert len(by_session(plan)) == len(opened) > 5
    assert len(plan) == sum(len(c) for c in opened)


# ------------------------------------------------------------------ the simulator


def sim_rows(scn: Any) -> tuple[Any, list[dict[str, Any]]]:
    plan = materialize(scn)
    rows, _ = run_sim(plan, scn)
    assert check_accounting(len(plan), rows).holds
    return plan, sorted(rows, key=lambda r: r["request_id"])


def test_the_sim_sends_turn_k_plus_1_only_after_turn_k_completed_plus_its_think_time() -> None:
    plan, rows = sim_rows(jsonl_scenario())
    think = plan.sessions["think_ns"]
    checked = 0
    for session_rows in by_session(plan).values():
        assert rows[session_rows[0]]["t_intended_ns"] == plan.columns["offset_ns"][session_rows[0]]
        for prev, row in itertools.pairwise(session_rows):
            a, b = rows[prev], rows[row]
            assert a["status"] == "ok" and (a["session_id"], a["turn"] + 1) == (
                b["session_id"],
                b["turn"],
            )
            assert b["t_intended_ns"] == a["t_done_ns"] + think[row]
            assert b["t_sent_ns"] >= a["t_done_ns"] + think[row]
            new_text = int(plan.columns["prompt_tokens"][row])
            assert b["prompt_tokens"] == a["prompt_tokens"] + a["output_tokens"] + new_text
            checked += 1
    assert checked == len(plan) - 60


def test_the_cache_hit_rate_rises_with_turns() -> None:
    _, rows = sim_rows(jsonl_scenario())
    assert rows == sim_rows(jsonl_scenario())[1]  # the records too, run after run
    rate = {}
    for k in range(1, 5):
        mine = [r for r in rows if r["turn"] == k and r["status"] == "ok"]
        assert len(mine) >= 40
        rate[k] = sum(r["cached_tokens"] for r in mine) / sum(r["prompt_tokens"] for r in mine)
    assert rate[1] == 0  # no shared system prompt: a first turn hits nothing
    for k in range(1, 4):
        assert rate[k + 1] > rate[k] + 0.05, rate


def test_a_context_limit_keeps_the_last_tokens_of_a_long_conversation() -> None:
    """The trace's `context_limit` caps every turn's prompt as a workload's session block does:
    past it the oldest tokens are dropped, so no prompt exceeds it, and a turn the limit cut
    sends exactly the limit."""
    limit = 150
    _, free = sim_rows(jsonl_scenario())
    plan, rows = sim_rows(
        scenario({"format": "conversation", "path": str(JSONL), "context_limit": limit})
    )
    assert set(plan.sessions["context_limit"].tolist()) == {limit}
    assert max(r["prompt_tokens"] for r in rows) == limit
    cut = [r for r, f in zip(rows, free, strict=True) if f["prompt_tokens"] > limit]
    assert len(cut) > 20 and all(r["prompt_tokens"] == limit for r in cut)


# ------------------------------------------------------------------ BurstGPT v2.0


def test_burstgpt_session_ids_become_sessions_and_api_rows_stay_single() -> None:
    rows = read_trace("burstgpt", BURST, sessions=True)
    assert rows.dropped == 1  # the failed turn (0 response tokens)
    assert rows.conversation is not None and rows.latency is not None
    # 40 conversation rows (one failed), 15 API-log rows without a Session ID
    assert (rows.conversation >= 0).sum() == 40 - 1 and (rows.conversation < 0).sum() == 15
    plan = materialize(scenario({"format": "burstgpt", "path": str(BURST), "sessions": True}))
    sessions = by_session(plan)
    assert len(sessions) == 12
    assert (plan.sessions["session_id"] < 0).sum() == 15
    # think = next Timestamp - Timestamp - Elapsed time, from the file itself
    text = BURST.read_text().splitlines()[1:]
    by_id: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for line in text:
        t, sid, elapsed, _, _, out, *_ = line.split(",")
        if sid and int(out) > 0:
            by_id[sid].append((float(t), float(elapsed), int(out)))
    expected = sorted(
        round(max(b[0] - a[0] - a[1], 0) * 1e9)
        for conv in by_id.values()
        for a, b in itertools.pairwise(sorted(conv))
    )
    later = plan.sessions["turn"] > 1
    assert sorted(plan.sessions["think_ns"][later].tolist()) == expected
    # without sessions the same file replays row by row, as before
    flat = materialize(scenario({"format": "burstgpt", "path": str(BURST)}))
    assert flat.sessions is None and len(flat) == len(plan)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("name", "text", "where", "what"),
    [
        (
            "no_id.csv",
            "timestamp,conversation,input_tokens,output_tokens\n1,a,5,5\n",
            "",
            "no column named 'conversation_id'",
        ),
        (
            "blank_id.csv",
            "timestamp,conversation_id,input_tokens,output_tokens\n1,a,5,5\n2,,5,5\n",
            ":3",
            "conversation_id is empty",
        ),
        (
            "no_id.jsonl",
            '{"timestamp": 1, "conversation_id": "a", "input_tokens": 5, "output_tokens": 5}\n'
            '{"timestamp": 2, "input_tokens": 5, "output_tokens": 5}\n',
            ":2",
            "missing field 'conversation_id'",
        ),
        (
            "list_id.jsonl",
            '{"timestamp": 1, "conversation_id": ["a"], "input_tokens": 5, "output_tokens": 5}\n',
            ":1",
            "conversation_id must be a non-empty string or an integer",
        ),
        (
            "twice.csv",
            "timestamp,conversation_id,turn,input_tokens,output_tokens\n1,a,1,5,5\n2,a,1,5,5\n",
            ":3",
            "turn 1 of conversation 'a' appears twice",
        ),
        (
            "when.csv",
            "timestamp,conversation_id,input_tokens,output_tokens\n1,a,5,5\nlater,a,5,5\n",
            ":3",
            "timestamp must be seconds (a number) or an ISO 8601 date-time",
        ),
    ],
)
def test_a_bad_or_missing_id_column_is_one_line_naming_it(
    tmp_path: Path, name: str, text: str, where: str, what: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as error:
        read_trace("conversation", path)
    message = str(error.value)
    assert message.startswith(f"{path}{where}: ") and what in message
    assert len(message.splitlines()) == 1


def test_a_burstgpt_file_without_session_ids_is_named(tmp_path: Path) -> None:
    v1 = tmp_path / "BurstGPT_1.csv"
    v1.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,10,3,13,Conversation log\n"
    )
    with pytest.raises(TraceError, match=r"no column named 'Session ID'.*BurstGPT_3\.csv"):
        read_trace("burstgpt", v1, sessions=True)


def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "log.csv"
    bad.write_text("timestamp,session,input_tokens,output_tokens\n1,a,5,5\n")
    (tmp_path / "s.yaml").write_text(
        "workloads: {chat: {prompt_tokens: 10}}\n"
        "traces: {log: {format: conversation, path: log.csv}}\n"
        "tenants: [{id: a, mix: chat, arrival: {process: trace, trace: log}}]\n"
    )
    done = run_cli("plan", str(tmp_path / "s.yaml"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no column named 'conversation_id'" in lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("trace", "field"),
    [
        ({"format": "mooncake", "path": "x.jsonl", "sessions": True}, "traces.log.sessions"),
        ({"format": "azure", "path": "x.csv", "sessions": True}, "traces.log.sessions"),
        ({"format": "burstgpt", "path": "x.csv", "turn_input": "whole"}, "traces.log.turn_input"),
    ],
)
def test_what_a_format_cannot_give_is_refused_naming_the_field(
    trace: dict[str, Any], field: str
) -> None:
    with pytest.raises(ScenarioError) as error:
        scenario(trace)
    lines = str(error.value).splitlines()
    assert len(lines) == 1 and field in lines[0]


def test_a_session_workload_in_a_conversation_trace_mix_is_refused() -> None:
    raw = jsonl_scenario().model_dump(mode="json", exclude_none=True)
    raw["workloads"]["chat"]["session"] = {"turns": 3}
    with pytest.raises(ScenarioError, match=r"tenants\[0\]\.mix: a trace gives its own"):
        parse_scenario(raw)


# ------------------------------------------------------------------ Qwen-Bailian

BAILIAN = DATA / "bailian.jsonl"


def test_bailian_parent_chains_become_sessions_and_whole_prompts_new_text() -> None:
    """bailian.jsonl: 8 conversations of 2-4 requests chained by parent_chat_id, one whose root
    is not in the file (it starts at turn 4), and 3 single requests; input_length is the whole
    prompt. bailian_new_text.json holds each request's new text as generated."""
    truth = {int(k): v for k, v in json.loads((DATA / "bailian_new_text.json").read_text()).items()}
    records = [json.loads(line) for line in BAILIAN.read_text().splitlines()]
    by_chat = {r["chat_id"]: r for r in records}
    chains: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        root = r
        while root["parent_chat_id"] in by_chat:
            root = by_chat[root["parent_chat_id"]]
        chains[root["chat_id"]].append(r)
    orphan = next(r for r in records if r["parent_chat_id"] == 99999)
    truth[orphan["chat_id"]] = orphan["input_length"]  # its history is in its first prompt
    expected = sorted(
        [truth[r["chat_id"]] for r in sorted(c, key=lambda r: r["turn"])] for c in chains.values()
    )
    plan = materialize(scenario({"format": "bailian", "path": str(BAILIAN)}))
    sessions = by_session(plan)
    assert len(sessions) == len(chains) == 12
    got = sorted(plan.columns["prompt_tokens"][rows].tolist() for rows in sessions.values())
    assert got == expected
    # no latency in the trace: the think time is the whole gap between two requests
    gaps = sorted(
        round((b["timestamp"] - a["timestamp"]) * 1e9)
        for c in chains.values()
        for a, b in itertools.pairwise(sorted(c, key=lambda r: r["turn"]))
    )
    later = plan.sessions["turn"] > 1
    assert np.allclose(sorted(plan.sessions["think_ns"][later]), gaps, atol=2)
    # without sessions: one request a row, with its 16-token block ids
    flat = materialize(
        scenario({"format": "bailian", "path": str(BAILIAN), "sessions": False, "block_tokens": 16})
    )
    assert flat.sessions is None and len(flat) == len(records)
    assert flat.block_offsets is not None and flat.block_tokens == 16


def test_a_bailian_chat_id_twice_is_named(tmp_path: Path) -> None:
    path = tmp_path / "twice.jsonl"
    row = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 5}
    path.write_text(
        json.dumps(row | {"output_length": 1})
        + "\n"
        + json.dumps(row | {"output_length": 2})
        + "\n"
    )
    with pytest.raises(TraceError, match=r"twice\.jsonl:2: chat_id 1 appears twice"):
        read_trace("bailian", path, sessions=True)


# ------------------------------------------------------------------ live


async def test_live_a_trace_turn_waits_for_its_predecessor_plus_the_trace_think_time(
    tmp_path: Path,
) -> None:
    """The live executor, the same closed loop: the fixture sped up 200 times (think times of
    10-100 ms), against a mock target."""
    from fairbench.plan.model import PlannedRequest
    from fairbench.run.executor import ExecOptions, Executor
    from fairbench.run.records import JournalWriter, read_journal
    from fairbench.targets.base import Done, Started, Token
    from fairbench.targets.mock import MockTarget

    plan = materialize(
        scenario({"format": "conversation", "path": str(JSONL), "time_scale": 0.005})
    )

    async def handler(req: PlannedRequest) -> Any:
        yield Started()
        for _ in range(3):
            yield Token(1)
        yield Done(3)

    journal = JournalWriter(tmp_path / "journal.jsonl")
    await Executor(plan, MockTarget(handler), journal, ExecOptions()).run()
    journal.close()
    records = read_journal(tmp_path / "journal.jsonl")
    assert check_accounting(len(plan), records).holds
    rows = {r["request_id"]: r for r in records}
    think = plan.sessions["think_ns"]
    for session_rows in by_session(plan).values():
        for prev, row in itertools.pairwise(session_rows):
            a, b = rows[prev], rows[row]
            assert a["status"] == b["status"] == "ok"
            assert b["t_intended_ns"] == a["t_done_ns"] + think[row]
            assert b["t_sent_ns"] >= a["t_done_ns"] + think[row]
            assert b["prompt_tokens"] == a["prompt_tokens"] + 3 + plan.columns["prompt_tokens"][row]
