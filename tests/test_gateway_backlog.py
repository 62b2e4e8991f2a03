"""The gateway's own record of contention (issue 33): who its policy passed over, and for how long.

A tenant counts as backlogged only while the scheduler passed one of its requests over; behind
fairbench's gateway the scheduler is the gateway's policy queue, so the gateway keeps the record
(`Dispatcher`, with scheduler/passover.py as the engine keeps it), sends it in a response header,
and the client puts it in front of whatever the engine behind reports (`executor._behind_gateway`).
Pure parts here; tests/test_gateway_target.py runs it end to end.
"""

from __future__ import annotations

from typing import Any

import pytest

from fairbench.run.executor import _behind_gateway
from fairbench.run.records import Record
from fairbench.targets.http.wire import GATEWAY_TIMING_HEADER
from reference_scheduler.core.job import Job
from reference_scheduler.gateway.config import parse_gateway_config
from reference_scheduler.gateway.dispatcher import TIMING_HEADER, Dispatcher
from reference_scheduler.gateway.pool import Pool
from reference_scheduler.scheduler.config import parse_scheduler_config


def _dispatcher(slots: int, policy: str = "fifo") -> Dispatcher:
    cfg = parse_gateway_config(
        {"upstreams": [{"url": "http://127.0.0.1:1", "engine": "none", "max_inflight": slots}]}
    )
    return Dispatcher(
        parse_scheduler_config({"policy": policy}), Pool(list(cfg.upstreams), cfg.dispatch)
    )


def _job(i: int, tenant: str, at: int) -> Job:
    job = Job(i, tenant, "interactive", 5, 5, at)
    job.arrival_ns = at
    return job


def test_a_request_dispatched_at_once_was_never_passed_over() -> None:
    d = _dispatcher(slots=4)
    jobs = [_job(i, "a", 0) for i in range(3)]
    for job in jobs:
        assert d.submit(job, 0).accepted
    assert len(d.pick(0)) == 3
    for job in jobs:
        assert d.timing(job) == {"queue_time_ns": 0, "passed_over_ns": None, "backlog_ns": 0}


def test_requests_left_waiting_by_a_pass_are_backlogged_until_dispatched() -> None:
    d = _dispatcher(slots=1)
    first, second, third = _job(0, "a", 0), _job(1, "b", 0), _job(2, "b", 5)
    for job in (first, second):
        d.submit(job, 0)
    assert [j.id for j, _ in d.pick(0)] == [0]  # one slot: b's request is passed over at 0
    d.submit(third, 5)
    assert d.pick(5) == []  # still full: the third is passed over at 5
    d.finish(first, 10)
    assert [j.id for j, _ in d.pick(10)] == [1]
    d.finish(second, 30)
    assert [j.id for j, _ in d.pick(30)] == [2]
    assert d.timing(first) == {"queue_time_ns": 0, "passed_over_ns": None, "backlog_ns": 0}
    assert d.timing(second) == {"queue_time_ns": 10, "passed_over_ns": 0, "backlog_ns": 10}
    assert d.timing(third) == {"queue_time_ns": 25, "passed_over_ns": 0, "backlog_ns": 25}


def test_a_request_that_leaves_the_queue_ends_its_wait() -> None:
    d = _dispatcher(slots=1)
    running, gone = _job(0, "a", 0), _job(1, "b", 0)
    d.submit(running, 0)
    d.submit(gone, 0)
    d.pick(0)
    assert d.finish(gone, 7, "cancelled")
    assert gone.backlog_ns == 7 and gone.wait_since_ns == -1


def test_the_header_name_is_one_name_on_both_sides() -> None:
    assert TIMING_HEADER.lower() == GATEWAY_TIMING_HEADER


def _rec(**fields: Any) -> Record:
    rec = Record.__new__(Record)
    for name in Record.__dataclass_fields__:
        setattr(rec, name, None)
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


@pytest.mark.parametrize(
    ("gateway", "engine", "expect"),
    [
        # an opaque engine: the gateway's record is all there is
        ({"queue_time_ns": 40, "passed_over_ns": 3, "backlog_ns": 37}, {}, (3, 37, 40)),
        ({"queue_time_ns": 0, "passed_over_ns": None, "backlog_ns": 0}, {}, (None, 0, 0)),
        # dispatched at once, passed over by the reference server behind it
        (
            {"queue_time_ns": 2, "passed_over_ns": None, "backlog_ns": 0},
            {"passed_over_ns": 5, "backlog_ns": 20, "queue_time_ns": 25},
            (7, 20, 27),
        ),
        # passed over at both: the gateway's moment comes first, the waits add up
        (
            {"queue_time_ns": 30, "passed_over_ns": 1, "backlog_ns": 29},
            {"passed_over_ns": 5, "backlog_ns": 20, "queue_time_ns": 25},
            (1, 49, 55),
        ),
    ],
)
def test_the_gateways_record_goes_in_front_of_the_engines(
    gateway: dict[str, Any], engine: dict[str, Any], expect: tuple[Any, ...]
) -> None:
    rec = _rec(**engine)
    _behind_gateway(rec, gateway)
    assert (rec.passed_over_ns, rec.backlog_ns, rec.queue_time_ns) == expect


def test_a_gateway_record_without_a_backlog_changes_nothing() -> None:
    rec = _rec(passed_over_ns=5, backlog_ns=20, queue_time_ns=25)
    _behind_gateway(rec, {"queue_time_ns": "x"})
    assert (rec.passed_over_ns, rec.backlog_ns, rec.queue_time_ns) == (5, 20, 25)
