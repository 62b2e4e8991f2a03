"""Write the golden outputs of three shipped simulated scenarios.

Why: the golden test (tests/test_golden_outputs.py) holds ``summary.json`` and the terminal
table of these runs byte for byte, so a change that moves code cannot move a number unseen.
A change that *means* to move a number regenerates them with one command and commits the diff:

    python tests/golden/regenerate.py

Each scenario runs as ``fairbench run FILE --out DIR`` in a subprocess with a fixed terminal
width; the run directory's path is replaced by ``<RUN_DIR>`` in the terminal text.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent
SCENARIOS = ("onoff", "ramp", "vtc-overload")
COLUMNS = "130"


def run_scenario(name: str, out_dir: Path) -> tuple[str, str]:
    """Run one shipped scenario into ``out_dir``; return (terminal text, summary.json text)."""
    env = dict(os.environ, COLUMNS=COLUMNS, NO_COLOR="1", TERM="dumb")
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairbench.cli",
            "run",
            f"scenarios/{name}.yaml",
            "--out",
            str(out_dir),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    terminal = proc.stdout.replace(str(out_dir), "<RUN_DIR>")
    summary = (out_dir / "summary.json").read_text(encoding="utf-8")
    return terminal, summary


def golden_paths(name: str) -> tuple[Path, Path]:
    """Where the terminal text and the summary of one scenario are kept."""
    return GOLDEN / f"run-{name}.txt", GOLDEN / f"run-{name}.summary.json"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for name in SCENARIOS:
            terminal, summary = run_scenario(name, Path(tmp) / name)
            text_path, summary_path = golden_paths(name)
            text_path.write_text(terminal, encoding="utf-8")
            summary_path.write_text(summary, encoding="utf-8")
            print(f"wrote {text_path.relative_to(ROOT)} and {summary_path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
