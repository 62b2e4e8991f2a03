"""The run bar's clock keeps counting after the last request (issue 35 item 6).

Why: rich's elapsed column freezes when a task's count is complete; a fleet run then spends
seconds summarising and writing the report with the clock stopped at the simulation's end.
"""

from __future__ import annotations

from rich.progress import Progress, TimeElapsedColumn

from fairbench.cli.run import RunElapsed


def test_clock_runs_past_a_complete_count() -> None:
    now = [100.0]
    bar = Progress(get_time=lambda: now[0], disable=True)
    task_id = bar.add_task("fleet-80", total=None)
    now[0] = 103.0
    bar.update(task_id, total=10, completed=10)  # the simulation is over
    now[0] = 160.0  # summarising, writing the report
    task = bar.tasks[0]
    assert str(RunElapsed().render(task)) == "0:01:00"
    assert str(TimeElapsedColumn().render(task)) == "0:00:03"  # rich's own stops


def test_not_started_is_dashes() -> None:
    bar = Progress(disable=True)
    task_id = bar.add_task("x", start=False)
    assert str(RunElapsed().render(bar.tasks[task_id])) == "-:--:--"
