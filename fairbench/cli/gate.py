"""`fairbench gate`: judge a candidate run against rules and a baseline, for CI.

The command reads its inputs through `fairbench.decide.gate` (rules, summaries, baselines),
evaluates, prints the text verdict and writes JUnit XML / Markdown as asked; the exit code is
the gate's (0 pass, 1 regression, 2 cannot evaluate). Imports `cli.common` and, lazily,
`decide.gate`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from fairbench.cli.common import err


def register(app: typer.Typer) -> None:
    @app.command()
    def gate(
        candidate: Annotated[
            Path, typer.Option(help="candidate run directory or summary.json", metavar="RUN")
        ],
        rules: Annotated[Path, typer.Option(help="rules file (YAML)", metavar="FILE")],
        baseline: Annotated[
            list[Path] | None,
            typer.Option(
                help="baseline run directory, summary.json or directory of summaries; repeat "
                "for replicated runs (relative rules need 3 or more)",
                metavar="RUN",
            ),
        ] = None,
        junit: Annotated[
            Path | None, typer.Option(help="write JUnit XML here", metavar="FILE")
        ] = None,
        markdown: Annotated[
            Path | None,
            typer.Option(help="append Markdown here (e.g. $GITHUB_STEP_SUMMARY)", metavar="FILE"),
        ] = None,
    ) -> None:
        """Judge a candidate run against rules (and a baseline): exit 0 pass, 1 regression,
        2 cannot evaluate."""
        from fairbench.decide.gate import (
            GateError,
            as_junit,
            as_markdown,
            as_text,
            evaluate,
            exit_code,
            load_baselines,
            load_rules,
            load_summary,
        )

        try:
            rule_list = load_rules(rules)
            cand = load_summary(candidate)
            base = load_baselines(baseline) if baseline else None
        except GateError as error:
            for line in error.lines:
                err.print(
                    f"{rules}: {line}" if "rules" in line else line,
                    markup=False,
                    highlight=False,
                    soft_wrap=True,  # one line per problem, however long the path
                )
            raise typer.Exit(2) from None
        results, blocker = evaluate(rule_list, base, cand)
        sys.stdout.write(as_text(results, blocker))
        if junit is not None:
            junit.parent.mkdir(parents=True, exist_ok=True)
            junit.write_text(as_junit(results, blocker), encoding="utf-8")
        if markdown is not None:
            markdown.parent.mkdir(parents=True, exist_ok=True)
            with markdown.open("a", encoding="utf-8") as handle:  # $GITHUB_STEP_SUMMARY appends
                handle.write(as_markdown(results, blocker))
        raise typer.Exit(exit_code(results, blocker))
