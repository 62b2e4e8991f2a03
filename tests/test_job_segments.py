"""Job.segments is one shared () until a job is preempted (issue 35): an empty list per job
was 137 MB of a 10-minute fleet run. These tests fail if the default goes back to a list per
job, or if `add_segment` loses or shares a segment."""

from __future__ import annotations

import sys

from reference_scheduler.core.job import Job


def _job(i: int) -> Job:
    return Job(i, "t", "interactive", 10, 5, 0)


def test_unpreempted_jobs_share_one_empty_tuple() -> None:
    a, b = _job(0), _job(1)
    assert a.segments == () and a.segments is b.segments
    assert not a.segments  # the engine's `if job.segments:` guard still reads it as empty
    assert list(a.segments) == []
    assert sys.getsizeof(a.segments) <= sys.getsizeof(())


def test_add_segment_makes_a_list_per_job_and_appends() -> None:
    a, b = _job(0), _job(1)
    a.add_segment((0, 5, 1, 2))
    a.add_segment((1, -1, 7, 3))
    assert a.segments == [(0, 5, 1, 2), (1, -1, 7, 3)]
    assert b.segments == ()  # nothing leaked into the shared default
    b.add_segment((2, -1, 0, 1))
    assert b.segments == [(2, -1, 0, 1)] and a.segments is not b.segments
