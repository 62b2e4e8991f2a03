"""tests/conftest.py's machine share between pytest-xdist workers: a test that measures the
machine (`engine`, `quiet`) never runs beside another, and one waiting for the machine is not
overtaken by tests that start after it asked. The locks are flock(2) on files opened per test,
so two threads of this process contend as two workers would."""

from __future__ import annotations

import fcntl
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
    item: _Item,
    log: list[str],
    name: str,
    entered: threading.Event,
    leave: threading.Event,
    errors: list[BaseException],
) -> None:
    try:
        with _machine_share(item):  # type: ignore[arg-type]
            log.append(f"{name} in")
            entered.set()
            assert leave.wait(WAIT_S), f"{name} was never let go"
            log.append(f"{name} out")
    except BaseException as error:  # a thread's failure is the test's (pytest sees only warnings)
        errors.append(error)


class _Tests:
    """Tests as threads: each takes the machine share, says so, and waits to be let go."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log: list[str] = []
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def start(self, name: str, *marks: str) -> tuple[threading.Event, threading.Event]:
        entered, leave = threading.Event(), threading.Event()
        item = _Item(self.root, *marks)
        args = (item, self.log, name, entered, leave, self.errors)
        thread = threading.Thread(target=_hold, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()
        return entered, leave

    def joined(self) -> list[str]:
        for thread in self.threads:
            thread.join(WAIT_S)
            assert not thread.is_alive()
        assert not self.errors, self.errors
        return self.log


def _turnstile_held(root: Path) -> bool:
    """Whether an exclusive test holds the turnstile (a shared lock on it cannot be had)."""
    with open(root / "turnstile.lock", "a") as turnstile:
        try:
            fcntl.flock(turnstile, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        return False


def test_tests_share_the_machine_and_an_exclusive_one_waits_for_them(tmp_path: Path) -> None:
    tests = _Tests(tmp_path)
    a_in, a_out = tests.start("a")
    b_in, b_out = tests.start("b")
    assert a_in.wait(WAIT_S) and b_in.wait(WAIT_S)  # two ordinary tests run side by side
    e_in, e_out = tests.start("engine", "engine")
    assert not e_in.wait(0.3)  # ... and the engine test waits for both
    a_out.set()
    assert not e_in.wait(0.3)
    b_out.set()
    assert e_in.wait(WAIT_S)
    e_out.set()
    log = tests.joined()
    assert log.index("engine in") > max(log.index("a out"), log.index("b out"))


def test_a_waiting_exclusive_test_goes_before_later_ones(tmp_path: Path) -> None:
    tests = _Tests(tmp_path)
    a_in, a_out = tests.start("a")
    assert a_in.wait(WAIT_S)
    q_in, q_out = tests.start("quiet", "quiet")
    deadline = time.monotonic() + WAIT_S
    while not _turnstile_held(tmp_path):  # the quiet test waits at the machine, turnstile held
        assert time.monotonic() < deadline, "the quiet test never took the turnstile"
        time.sleep(0.01)
    c_in, c_out = tests.start("c")
    assert not c_in.wait(0.3) and not q_in.is_set()
    a_out.set()
    assert q_in.wait(WAIT_S)
    assert not c_in.wait(0.3)  # nothing runs beside the quiet test
    q_out.set()
    assert c_in.wait(WAIT_S)
    c_out.set()
    assert tests.joined() == ["a in", "a out", "quiet in", "quiet out", "c in", "c out"]


def test_outside_xdist_nothing_is_locked(tmp_path: Path) -> None:
    """One process (`-n 0`, no workerinput): an exclusive test inside another's share neither
    waits nor leaves a lock file where a worker would put one."""
    item = SimpleNamespace(
        config=SimpleNamespace(option=SimpleNamespace(basetemp=str(tmp_path / "gw0"))),
        get_closest_marker=lambda name: object(),
    )
    with _machine_share(item), _machine_share(item):  # type: ignore[arg-type]
        pass
    assert not list(tmp_path.iterdir())
