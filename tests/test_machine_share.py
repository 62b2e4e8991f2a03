"""tests/conftest.py's machine share between pytest-xdist workers: a test that measures the
machine (`engine`, `quiet`) never runs beside another, and one waiting for the machine is not
overtaken by tests that start after it asked. The locks are flock(2) on files opened per test,
so two threads of this process contend as two workers would."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import _machine_share

WAIT_S = 10.0  # every wait is bounded: a broken lock fails the test, never hangs it


class _Item:
    """What `_machine_share` reads of a pytest item on an xdist worker."""

    def __init__(self, root: Path, *marks: str) -> None:
        self.config = SimpleNamespace(
            workerinput={"testrunuid": "t"}, option=SimpleNamespace(basetemp=str(root / "gw0"))
        )
        self.marks = marks

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name in self.marks else None


def _hold(
    item: _Item, log: list[str], name: str, entered: threading.Event, leave: threading.Event
) -> None:
    with _machine_share(item):  # type: ignore[arg-type]
        log.append(f"{name} in")
        entered.set()
        assert leave.wait(WAIT_S)
        log.append(f"{name} out")


def _start(
    item: _Item, log: list[str], name: str
) -> tuple[threading.Thread, threading.Event, threading.Event]:
    entered, leave = threading.Event(), threading.Event()
    thread = threading.Thread(target=_hold, args=(item, log, name, entered, leave), daemon=True)
    thread.start()
    return thread, entered, leave


def test_tests_share_the_machine_and_an_exclusive_one_waits_for_them(tmp_path: Path) -> None:
    log: list[str] = []
    a, a_in, a_out = _start(_Item(tmp_path), log, "a")
    b, b_in, b_out = _start(_Item(tmp_path), log, "b")
    assert a_in.wait(WAIT_S) and b_in.wait(WAIT_S)  # two ordinary tests run side by side
    e, e_in, e_out = _start(_Item(tmp_path, "engine"), log, "engine")
    assert not e_in.wait(0.3)  # ... and the engine test waits for both
    a_out.set()
    assert not e_in.wait(0.3)
    b_out.set()
    assert e_in.wait(WAIT_S)
    e_out.set()
    for thread in (a, b, e):
        thread.join(WAIT_S)
    assert log.index("engine in") > max(log.index("a out"), log.index("b out"))


def test_a_waiting_exclusive_test_goes_before_later_ones(tmp_path: Path) -> None:
    log: list[str] = []
    a, a_in, a_out = _start(_Item(tmp_path), log, "a")
    assert a_in.wait(WAIT_S)
    q, q_in, q_out = _start(_Item(tmp_path, "quiet"), log, "quiet")
    time.sleep(0.2)  # the quiet test is waiting at the machine, holding the turnstile
    c, c_in, c_out = _start(_Item(tmp_path), log, "c")
    assert not c_in.wait(0.3) and not q_in.wait(0.01)
    a_out.set()
    assert q_in.wait(WAIT_S)
    assert not c_in.wait(0.3)  # nothing runs beside the quiet test
    q_out.set()
    assert c_in.wait(WAIT_S)
    c_out.set()
    for thread in (a, q, c):
        thread.join(WAIT_S)
    assert log == ["a in", "a out", "quiet in", "quiet out", "c in", "c out"]


def test_outside_xdist_nothing_is_locked(tmp_path: Path) -> None:
    item = SimpleNamespace(config=SimpleNamespace(), get_closest_marker=lambda name: object())
    with _machine_share(item), _machine_share(item):  # type: ignore[arg-type]
        pass  # an exclusive test inside another: no lock taken, so no wait
    assert not list(tmp_path.iterdir())
