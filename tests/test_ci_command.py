"""CI runs what the README tells a newcomer to run (issue #31): the README's second command
(install and test) appears verbatim as a line of `.ci/run`, and its install brings everything
the suite imports (ray for the loopback cluster tests is in the `dev` extra, not a separate
one that only CI installed)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md opens with a bash block of two commands"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    commands = _readme_commands()
    assert len(commands) == 2 and commands[1].endswith("pytest"), commands
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert commands[1] in ci_lines, f".ci/run must run {commands[1]!r} as it stands"
    assert ci_lines[-1] == commands[1], "the README's test command is what CI ends with"


def test_the_readme_install_brings_what_the_suite_needs() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    extra = re.search(r"\.\[(\w+)\]", _readme_commands()[1])
    assert extra is not None
    dev = " ".join(extras[extra.group(1)])
    for needed in ("pytest", "ray", "playwright", "hypothesis"):
        assert needed in dev, f"{needed} is missing from the [{extra.group(1)}] extra"
