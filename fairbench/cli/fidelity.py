"""`fairbench fidelity` and `fairbench profile`: the simulator's calibration loop.

`profile` fits a cost profile from a live engine (fairbench.targets.profile); `fidelity`
measures how far a simulated run of a plan is from a real run of it
(fairbench.decide.fidelity). Kept apart from `analysis` so the two commands of the loop read
together. Registered on the app by `fairbench.cli.main.main`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fairbench.cli.inputs import UsageFailure

out = Console(width=None if sys.stdout.isatty() else 160)


def _fidelity_table(fid: object) -> Table:
    from fairbench.decide.fidelity import Fidelity
    from fairbench.report.fidelity import head, intro, row_cells

    assert isinstance(fid, Fidelity)
    table = Table(title="sim vs real", caption=intro(fid), title_justify="left")
    cols = ["group", *head(fid)]
    for col in cols:
        table.add_column(
            col, justify="left" if col in ("group", "figure", "judgement") else "right"
        )
    colour = {"within noise": "green", "beyond noise": "red"}
    for row in fid.rows:
        cells = row_cells(fid, row)
        cells[-1] = f"[{colour.get(cells[-1], 'white')}]{cells[-1]}[/]"
        group = "overall" if row.group == "overall" else f"{row.group} {row.key}"
        table.add_row(group, *cells)
    return table


def register(app: typer.Typer) -> None:
    @app.command()
    def fidelity(
        real: Annotated[Path, typer.Argument(help="the real run's directory", metavar="REAL_RUN")],
        sim: Annotated[
            Path, typer.Argument(help="the simulated run of the same plan", metavar="SIM_RUN")
        ],
        noise: Annotated[
            Path | None,
            typer.Option(
                "--noise",
                help="a second real run of the same plan: the run-to-run noise floor",
                metavar="RUN2",
            ),
        ] = None,
        factor: Annotated[
            float,
            typer.Option(
                "--noise-factor",
                min=0.0,
                help="an error is within noise when |error| <= FACTOR x the noise floor",
                metavar="FACTOR",
            ),
        ] = 1.0,
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="write fidelity.json, fidelity.md and fidelity.html here (default SIM_RUN)",
                metavar="DIR",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
    ) -> None:
        """How far a simulated run is from a real run of the same plan, per tenant and class."""
        import json

        from fairbench.decide.fidelity import FidelityRefused, write_outputs
        from fairbench.decide.fidelity import fidelity as measure
        from fairbench.report import write_page
        from fairbench.report.fidelity import fidelity_markdown, fidelity_report

        try:
            fid = measure(real, sim, noise, factor)
        except FidelityRefused as error:
            raise UsageFailure(f"cannot measure fidelity: {error}") from None
        target = out_dir if out_dir is not None else sim
        written = write_outputs(fid, target, fidelity_markdown(fid))
        written.append(write_page(target / "fidelity.html", fidelity_report(fid)))
        if as_json:
            sys.stdout.write(json.dumps(fid.as_dict(), indent=2) + "\n")
            return
        out.print(_fidelity_table(fid))
        mape = fid.mape()
        out.print(
            f"MAPE {mape:.1f}% over {len(fid.finite())} figures"
            if math.isfinite(mape)
            else "MAPE: no figure both runs have",
            markup=False,
            highlight=False,
        )
        out.print("wrote " + ", ".join(str(p) for p in written), markup=False, highlight=False)

    @app.command()
    def profile(
        target_url: Annotated[
            str,
            typer.Option(
                "--target-url",
                help="the engine's base URL, e.g. http://127.0.0.1:8000",
                metavar="URL",
            ),
        ],
        model: Annotated[
            str | None,
            typer.Option(
                help="the served model (default: the first /v1/models lists)", metavar="M"
            ),
        ] = None,
        out_file: Annotated[
            Path, typer.Option("--out", help="the profile YAML to write", metavar="FILE")
        ] = Path("profile.yaml"),
        budget: Annotated[
            float,
            typer.Option(
                min=10.0, help="seconds the probe may take (it stops, then fits)", metavar="S"
            ),
        ] = 240.0,
        rounds: Annotated[
            int,
            typer.Option(
                "--rounds", min=1, help="most rounds of the probe (medians per point)", metavar="N"
            ),
        ] = 8,
        max_num_seqs: Annotated[
            int,
            typer.Option(
                min=1,
                help="the engine's --max-num-seqs: the largest decode batch probed",
                metavar="N",
            ),
        ] = 8,
        max_num_batched_tokens: Annotated[
            int,
            typer.Option(
                min=64,
                help="the engine's per-step token budget (longest prompt probed)",
                metavar="N",
            ),
        ] = 2048,
        max_model_len: Annotated[
            int,
            typer.Option(
                min=64, help="the context length, where /v1/models does not say", metavar="N"
            ),
        ] = 2048,
        kv_cache_tokens: Annotated[
            int | None,
            typer.Option(
                min=1, help="KV cache tokens, where /metrics does not say (vLLM does)", metavar="N"
            ),
        ] = None,
        api_key: Annotated[
            str | None, typer.Option(help="sent as Authorization: Bearer KEY", metavar="KEY")
        ] = None,
        name: Annotated[
            str | None,
            typer.Option(help="the profile's name (default: the file's stem)", metavar="NAME"),
        ] = None,
    ) -> None:
        """Fit a cost profile from a live OpenAI-compatible engine (a bounded probe)."""
        import asyncio

        import yaml
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from fairbench.targets.precheck import check_reachable
        from fairbench.targets.profile import ProbeDesign, ProbeError, profile_document, run_profile

        if out_file.exists() and out_file.is_dir():
            raise UsageFailure(f"--out {out_file}: a directory; give the profile's file name")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = target_url.rstrip("/").removesuffix("/v1")
        if not url.startswith(("http://", "https://")) or url[-3:] == "://":
            raise UsageFailure(
                f"--target-url {target_url}: not an http(s) URL; e.g. http://127.0.0.1:8000"
            )
        asyncio.run(check_reachable(url, headers, label="--target-url"))
        design = ProbeDesign(
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_tokens=kv_cache_tokens,
            budget_s=budget,
            max_rounds=rounds,
        )
        bar = Progress(
            TextColumn("{task.description:<14}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=not sys.stderr.isatty(),
        )
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        try:
            with bar:
                result, fit = asyncio.run(run_profile(url, model, design, headers, progress))
        except ProbeError as error:
            raise UsageFailure(f"--target-url {url}: {error}") from None
        doc = profile_document(
            result, fit, name or out_file.stem, max_num_seqs, max_num_batched_tokens
        )
        out_file.parent.mkdir(parents=True, exist_ok=True)
        header = (
            f"# Fitted by `fairbench profile` from {result.engine.model}: "
            f"{fit.n} observations in {result.seconds:.0f} s, RMS relative residual "
            f"{fit.rms_relative:.1%}. Load it with scheduler: {{profile: {out_file.name}}}.\n"
        )
        out_file.write_text(header + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        table = Table(title=f"profile of {result.engine.model}", title_justify="left")
        for col in ("coefficient", "value", "std. error"):
            table.add_column(col, justify="left" if col == "coefficient" else "right")
        for key, value in fit.coefficients.items():
            table.add_row(key, f"{value:.4g}", f"{fit.stderr[key]:.2g}")
        out.print(table)
        out.print(
            f"{result.rounds} round(s) of the probe in {result.seconds:.0f} s"
            + (f" (the --budget of {budget:g} s allowed no more)" if result.truncated else ""),
            markup=False,
            highlight=False,
        )
        out.print(f"wrote {out_file}", markup=False, highlight=False)
