"""The open loop: deadlines kept, stalls do not delay later sends, every request one record."""

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


async def test_sends_land_on_their_deadlines(tmp_path: Path) -> None:
    plan = make_plan(rate=200, duration="2s")
    _, _, rows = await run_plan(tmp_path, plan, fast)
    assert len(rows) == len(plan) == 400
    lag_ms = np.array([r["t_sent_ns"] - r["t_intended_ns"] for r in rows.values()]) / 1e6
    assert np.all(lag_ms >= 0)
    assert np.percentile(lag_ms, 99) < 5.0  # the INVALID threshold; typically well under 1 ms
    # intended times are the plan's offsets, exactly
    offsets = plan.columns["offset_ns"]
    assert all(rows[i]["t_intended_ns"] == int(offsets[i]) for i in range(len(plan)))
    assert all(r["status"] == "ok" and r["output_tokens"] == 5 for r in rows.values())


async def test_a_stalled_target_does_not_delay_later_sends(tmp_path: Path) -> None:
    async def stall_first_ten(req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        if req.request_id < 10:
            await asyncio.sleep(2.0)  # far longer than the gaps between sends
        async for event in fast(req):
            yield event

    plan = make_plan(rate=100, duration="1.5s")
    _, _, rows = await run_plan(tmp_path, plan, stall_first_ten, grace_s=5)
    later = [r for i, r in rows.items() if i >= 10]
    lag_ms = np.array([r["t_sent_ns"] - r["t_intended_ns"] for r in later]) / 1e6
    assert np.percentile(lag_ms, 99) < 5.0
    # and the stalled ones still measure from their intended time
    stalled = rows[0]
    assert stalled["t_first_token_ns"] - stalled["t_intended_ns"] >= 2.0e9


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
    _, _, rows = await run_plan(tmp_path, plan, scripted, timeout_s=0.3, grace_s=2)
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
    async def slow(req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        yield Started()
        await asyncio.sleep(10)
        yield Done(1)

    from fairbench.run.records import JournalWriter

    plan = make_plan(rate=20, duration="5s")
    journal = JournalWriter(tmp_path / "journal.jsonl")
    ex = Executor(plan, MockTarget(slow), journal, ExecOptions(grace_s=0.2))

    async def stop_soon() -> None:
        await asyncio.sleep(1.0)
        ex.stop.set()

    stopper = asyncio.create_task(stop_soon())
    result = await ex.run()
    await stopper
    journal.close()
    rows = read_journal(tmp_path / "journal.jsonl")
    acc = check_accounting(len(plan), rows)
    assert result.stopped and acc.holds
    assert acc.counts["cancelled"] == len(plan)  # in flight ones cancelled, unsent ones too
    sent = [r for r in rows if r["t_sent_ns"] is not None]
    assert 15 <= len(sent) <= 30  # about one second's worth was sent


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
