"""The open loop: never early, stalls do not delay later sends, every request one record.

No test here asserts how late a send may be: that depends on the machine (the benchmarks
measure it). They assert what must hold on any machine, however loaded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from fairbench.plan.model import PlannedRequest
from fairbench.run.executor import ExecOptions, Executor
from fairbench.run.records import check_accounting, read_journal
from fairbench.targets.base import Done, Failed, Started, TargetEvent, Token
from fairbench.targets.mock import MockTarget
from tests.conftest import make_plan


async def fast(req: PlannedRequest) -> AsyncIterator[TargetEvent]:
    yield Started()
    for _ in range(req.max_tokens):
        await asyncio.sleep(0.001)
        yield Token(1)
    yield Done(req.max_tokens)


async def run_plan(tmp_path: Path, plan, handler, **options):  # type: ignore[no-untyped-def]
    from fairbench.run.records import JournalWriter

    journal = JournalWriter(tmp_path / "journal.jsonl")
    ex = Executor(plan, MockTarget(handler), journal, ExecOptions(**options))
    result = await ex.run()
    journal.close()
    rows = read_journal(tmp_path / "journal.jsonl")
    return ex, result, {r["request_id"]: r for r in rows}


async def test_sends_keep_the_schedule_and_record_their_lag(tmp_path: Path) -> None:
    """What holds however busy the machine is: nothing goes out early, requests go out in plan
    order, intended times are the plan's, and each record carries its own lateness. How small
    that lateness is, is a benchmark's question (benchmarks/bench_generator.py), not a test's."""
    plan = make_plan(rate=200, duration="2s")
    ex, _, rows = await run_plan(tmp_path, plan, fast)
    assert len(rows) == len(plan) == 400
    offsets = plan.columns["offset_ns"]
    assert all(rows[i]["t_intended_ns"] == int(offsets[i]) for i in range(len(plan)))
    sent = np.array([rows[i]["t_sent_ns"] for i in range(len(plan))])
    intended = np.array([rows[i]["t_intended_ns"] for i in range(len(plan))])
    assert np.all(sent >= intended)  # never before its deadline
    assert np.all(np.diff(sent) >= 0)  # in the plan's order
    # The lateness is measured, not assumed: the live counter holds the last send's.
    assert ex.counters.last_lag_ns == sent[-1] - intended[-1] >= 0
    assert ex.counters.sent == ex.counters.done == len(plan)
    assert all(r["status"] == "ok" and r["output_tokens"] == 5 for r in rows.values())


async def test_a_stalled_target_does_not_delay_later_sends(tmp_path: Path) -> None:
    """The first ten requests stall until the last one is sent. With any gate in front of the
    schedule the last one never goes out and the ten time out instead of finishing."""
    plan = make_plan(rate=100, duration="1.5s")
    last = len(plan) - 1
    released = asyncio.Event()

    async def stall_first_ten(req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        if req.request_id == last:
            released.set()
        elif req.request_id < 10:
            await released.wait()
        async for event in fast(req):
            yield event

    _, _, rows = await run_plan(tmp_path, plan, stall_first_ten, timeout_s=30, grace_s=30)
    assert len(rows) == len(plan)
    assert all(r["status"] == "ok" for r in rows.values()), [
        (i, r["status"]) for i, r in rows.items() if r["status"] != "ok"
    ]
    last_sent = rows[last]["t_sent_ns"]
    for i in range(10):
        stalled = rows[i]
        assert stalled["t_sent_ns"] <= rows[10]["t_sent_ns"]  # it went out in its turn
        # ... and its latency is measured from its intended time, the whole stall included
        assert stalled["t_first_token_ns"] > last_sent


FAILURES = {
    0: ("error", "dropped"),
    1: ("rejected", "overloaded"),
    2: ("error", "http_5xx"),
    3: ("error", "no_token"),
    4: ("error", "stream_incomplete"),
    5: ("timeout", None),
    6: ("error", "client"),
    7: ("ok", None),
    8: ("error", "bad_stream"),
}


async def scripted(req: PlannedRequest) -> AsyncIterator[TargetEvent]:
    kind = req.request_id % 9
    yield Started()
    if kind == 0:
        yield Token(1)
        yield Failed("dropped", "connection reset mid-stream")
    elif kind == 1:
        yield Failed("overloaded", "busy", "rejected", 503, 7.0)
    elif kind == 2:
        yield Failed("http_5xx", "boom", "error", 500)
    elif kind == 3:
        yield Done(0)  # a "success" with no token
    elif kind == 4:
        yield Token(1)  # the stream just ends
    elif kind == 5:
        await asyncio.sleep(60)
    elif kind == 6:
        raise RuntimeError("bug in a target")
    elif kind == 7:
        yield Token(3)
        yield Done(3)
    else:
        yield Failed("bad_stream", "not JSON")


async def test_every_failure_kind_becomes_the_right_record(tmp_path: Path) -> None:
    plan = make_plan(rate=45, duration="1s")
    # The timeout only has to separate kind 5 (which never answers) from the rest.
    _, _, rows = await run_plan(tmp_path, plan, scripted, timeout_s=2, grace_s=5)
    assert len(rows) == len(plan) == 45
    for i, row in rows.items():
        status, kind = FAILURES[i % 9]
        assert (row["status"], row["error_kind"]) == (status, kind), (i, row)
    rejected = rows[1]
    assert rejected["http_status"] == 503 and rejected["retry_after_s"] == 7.0
    assert rows[7]["output_tokens"] == 3 and rows[7]["t_first_token_ns"] is not None
    acc = check_accounting(len(plan), list(rows.values()))
    assert acc.holds and acc.counts == {
        "ok": 5,
        "error": 30,
        "timeout": 5,
        "rejected": 5,
        "cancelled": 0,
    }


async def test_stop_cancels_the_rest_and_still_records_everything(tmp_path: Path) -> None:
    from fairbench.run.records import JournalWriter

    plan = make_plan(rate=20, duration="5s")
    journal = JournalWriter(tmp_path / "journal.jsonl")
    ex: Executor

    async def slow_and_stop_at_ten(req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        yield Started()
        if req.request_id == 9:
            ex.stop.set()  # stop once ten are in flight, whenever that is
        await asyncio.sleep(10)
        yield Done(1)

    ex = Executor(plan, MockTarget(slow_and_stop_at_ten), journal, ExecOptions(grace_s=0.2))
    result = await ex.run()
    journal.close()
    rows = read_journal(tmp_path / "journal.jsonl")
    acc = check_accounting(len(plan), rows)
    assert result.stopped and acc.holds
    assert acc.counts["cancelled"] == len(plan)  # in flight ones cancelled, unsent ones too
    sent = sorted(r["request_id"] for r in rows if r["t_sent_ns"] is not None)
    # Sending stopped: the sent ones are a prefix of the plan (a late loop may have sent a few
    # overdue ones before it saw the stop), and everything after it is recorded as never sent.
    assert sent == list(range(len(sent))) and 10 <= len(sent) < len(plan)
    unsent = [r for r in rows if r["t_sent_ns"] is None]
    assert len(unsent) == len(plan) - len(sent)
    assert {r["error_detail"] for r in unsent} == {"not sent: the run was stopped"}


async def test_closed_loop_cap_is_reported(tmp_path: Path) -> None:
    plan = make_plan(rate=100, duration="0.5s")
    _, result, rows = await run_plan(tmp_path, plan, fast, concurrency_cap=1)
    assert len(rows) == len(plan)
    assert len(result.closed_loop_wait_ns) == len(plan)
    assert result.closed_loop_wait_ns.max() > 0


@pytest.mark.parametrize("tokens", [1, 4])
async def test_itl_and_first_token_stamps(tmp_path: Path, tokens: int) -> None:
    async def paced(req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        yield Started()
        await asyncio.sleep(0.02)
        for k in range(tokens):
            if k:
                await asyncio.sleep(0.01 * k)
            yield Token(1)
        yield Done(tokens)

    plan = make_plan(rate=10, duration="0.3s", output=tokens)
    _, _, rows = await run_plan(tmp_path, plan, paced)
    row = rows[0]
    assert row["t_first_token_ns"] - row["t_sent_ns"] >= 20e6
    if tokens == 1:
        assert row["itl_max_ns"] is None
    else:
        assert row["itl_max_ns"] >= 30e6  # the largest gap was the last (0.03 s)
        assert row["t_last_token_ns"] - row["t_first_token_ns"] >= 60e6
