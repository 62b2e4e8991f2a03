"""The help of every command, pinned: golden files in tests/golden/help/, `-h` the same as
`--help`, no type tag after a flag, and help text on every option.

The help is rendered at a fixed width with no colour (COLUMNS=100, TERM=dumb, NO_COLOR=1), so a
golden file changes only when the help does. After changing a command's options, regenerate and
review the diff:

    FAIRBENCH_REGEN_GOLDEN=1 pytest tests/test_cli_help.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.cli import REPO, run_cli

GOLDEN = REPO / "tests" / "golden" / "help"
COMMANDS = [
    "fairbench",
    "validate",
    "schema",
    "plan",
    "run",
    "compare",
    "ab",
    "sweep",
    "pareto",
    "knee",
    "gate",
    "report",
    "metrics",
    "fidelity",
    "profile",
    "history",
    "explain",
    "advise",
]
ENV = {**os.environ, "COLUMNS": "100", "LINES": "50", "TERM": "dumb", "NO_COLOR": "1"}
REGEN = os.environ.get("FAIRBENCH_REGEN_GOLDEN") == "1"


def _argv(command: str, flag: str) -> list[str]:
    return [flag] if command == "fairbench" else [command, flag]


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """`-h` and `--help` of every command, run two at a time."""
    keys = [(c, f) for c in COMMANDS for f in ("--help", "-h")]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda k: run_cli(*_argv(*k), env=ENV, timeout=60), keys))
    return dict(zip(keys, results, strict=True))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_matches_golden(
    helps: dict[tuple[str, str], subprocess.CompletedProcess[str]], command: str
) -> None:
    long, short = helps[(command, "--help")], helps[(command, "-h")]
    assert long.returncode == 0 and short.returncode == 0, long.stderr + short.stderr
    assert long.stderr == "" and short.stderr == ""
    assert short.stdout == long.stdout, "-h and --help print the same"
    text = long.stdout
    assert "<bool>" not in text
    assert "\x1b[" not in text, "no colour codes"
    assert max(len(line) for line in text.splitlines()) <= 100
    golden: Path = GOLDEN / f"{command}.txt"
    if REGEN:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"no golden file; run FAIRBENCH_REGEN_GOLDEN=1 pytest {__file__}"
    assert text == golden.read_text(encoding="utf-8"), (
        f"{command} --help changed; if intended, regenerate with FAIRBENCH_REGEN_GOLDEN=1"
    )


def test_every_option_and_argument_has_help() -> None:
    import typer

    from fairbench.cli.main import _register_optional_commands, app

    _register_optional_commands()
    group = typer.main.get_command(app)
    assert set(group.commands) == set(COMMANDS) - {"fairbench"}  # type: ignore[attr-defined]
    missing = [
        f"{name} {param.name}"
        for name, command in group.commands.items()  # type: ignore[attr-defined]
        for param in command.params
        if not getattr(param, "help", None)
    ]
    missing += [f"fairbench {p.name}" for p in group.params if not getattr(p, "help", None)]
    assert missing == []


# What a command that only parses its flags, or refuses its input in one line, must not import:
# each costs a tenth of a second to a second of CPU (fairbench/_lazy.py says why it matters).
# `--help` registers every command, so it covers every CLI module's top-level imports.
HEAVY = ("pandas", "scipy", "aiohttp", "plotly", "pyarrow")
PARSE_ONLY = [
    ["--help"],
    ["run", "--help"],
    ["compare", "--no-such-flag"],
    ["validate", "absent.yaml"],
    ["run", "absent.yaml"],
]


@pytest.mark.parametrize("argv", PARSE_ONLY, ids=" ".join)
def test_parsing_a_command_imports_no_heavy_library(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from fairbench.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=ENV, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "", f"{argv} imported {proc.stdout.splitlines()[-1]}"
