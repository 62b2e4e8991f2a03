"""`fairbench profile`: fit the simulator's cost profile from a live engine (a bounded probe),
or refit the pooled probe data of earlier profiles (`--merge`).

The command parses its flags, checks them and builds the probe's design with
`fairbench.targets.profile.command`, calls `run_profile` then `files.write_profile` (or
`command.merge`), and prints the rows and lines `command` makes. Registered by
`fairbench.cli.fidelity.register`, beside the fidelity command of the same loop. Imports
`cli.inputs` and, lazily, `targets`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fairbench.cli.inputs import UsageFailure

out = Console(width=None if sys.stdout.isatty() else 160)


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        target_url: Annotated[
            str | None,
            typer.Option(
                "--target-url",
                help="the engine's base URL, e.g. http://127.0.0.1:8000",
                metavar="URL",
            ),
        ] = None,
        merge: Annotated[
            list[Path] | None,
            typer.Option(
                "--merge",
                help="instead of probing, fit one profile from the probe data of these "
                "profiles of one engine (repeat it: e.g. probes right before and after a run)",
                metavar="FILE",
            ),
        ] = None,
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
            int | None,
            typer.Option(
                min=1,
                help="the engine's --max-num-seqs: the largest decode batch probed (default: "
                "what the engine says, probed up to 32; else 8)",
                metavar="N",
            ),
        ] = None,
        max_num_batched_tokens: Annotated[
            int | None,
            typer.Option(
                min=64,
                help="the engine's per-step token budget, the longest prompt probed (default: "
                "what the engine says, else 2048)",
                metavar="N",
            ),
        ] = None,
        max_model_len: Annotated[
            int,
            typer.Option(
                min=64, help="the context length, where the engine does not say", metavar="N"
            ),
        ] = 2048,
        kv_cache_tokens: Annotated[
            int | None,
            typer.Option(
                min=1,
                help="KV cache tokens (default: what the engine says: vLLM, SGLang and TGI "
                "before v2.3 do)",
                metavar="N",
            ),
        ] = None,
        engine: Annotated[
            str,
            typer.Option(
                "--engine",
                help="which engine serves it, for its self-description: vllm, sglang, tgi, "
                "openai, or auto (ask: SGLang answers /get_server_info, TGI /info, vLLM "
                "/version)",
                metavar="KIND",
            ),
        ] = "auto",
        api_key: Annotated[
            str | None, typer.Option(help="sent as Authorization: Bearer KEY", metavar="KEY")
        ] = None,
        name: Annotated[
            str | None,
            typer.Option(help="the profile's name (default: the file's stem)", metavar="NAME"),
        ] = None,
        seed: Annotated[
            int,
            typer.Option(
                min=0,
                help="seed of the probe's random prompts: give each probe of one engine its "
                "own, or a prefix cache serves the second probe's prefills",
                metavar="N",
            ),
        ] = 0,
        load_prompt: Annotated[
            int,
            typer.Option(
                min=1,
                help="prompt tokens of each request of the load phase's burst: your "
                "workload's typical request (its front end's cost grows with it)",
                metavar="N",
            ),
        ] = 256,
        load_prompt_to: Annotated[
            int | None,
            typer.Option(
                min=1,
                help="spread the load phase's prompts evenly from --load-prompt to this many "
                "tokens (your workload's range: a CPU engine's steps cost more per token for "
                "short prompts than the fit says; default: every prompt --load-prompt)",
                metavar="N",
            ),
        ] = None,
        load_output: Annotated[
            int,
            typer.Option(
                min=1, help="output tokens of each request of the load phase", metavar="N"
            ),
        ] = 16,
        load_requests: Annotated[
            int | None,
            typer.Option(
                min=0,
                max=256,
                help="requests in the load phase's burst (default: twice --max-num-seqs, "
                "16 to 64; 0: no load phase, front_end_core_ms 0)",
                metavar="N",
            ),
        ] = None,
        idle_reps: Annotated[
            int,
            typer.Option(
                min=0,
                max=64,
                help="pairs of the idle phase per round: a request after 250 ms of quiet and "
                "its twin at once (0: no idle phase, idle_wake_ms 0)",
                metavar="N",
            ),
        ] = 4,
    ) -> None:
        """Fit a cost profile from a live vLLM, SGLang, TGI or OpenAI engine (bounded probe)."""
        import asyncio

        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from fairbench.targets.precheck import check_reachable
        from fairbench.targets.profile import ProbeError, run_profile
        from fairbench.targets.profile import command as lib
        from fairbench.targets.profile.files import write_profile

        try:
            if merge:
                if target_url is not None:
                    raise UsageFailure(
                        "--merge fits from earlier probes' data and probes nothing: "
                        "drop --target-url (or --merge)"
                    )
                merged = lib.merge(merge, out_file, name)
            else:
                url = lib.probe_url(target_url, engine)
                lib.check_out(out_file)
                lib.check_url(url, str(target_url))
        except lib.ProfileUsage as error:
            raise UsageFailure(str(error)) from None
        if merge:
            table = Table(title=f"merged profile of {len(merge)} probes", title_justify="left")
            for col in ("profile", "rounds", "a", "d"):
                table.add_column(col, justify="left" if col == "profile" else "right")
            for cells in lib.merged_rows(merged):
                table.add_row(*cells)
            out.print(table)
            out.print(f"wrote {out_file}", markup=False, highlight=False)
            return
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        asyncio.run(check_reachable(url, headers, label="--target-url"))
        design, given = lib.probe_design(
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_tokens=kv_cache_tokens,
            budget_s=budget,
            max_rounds=rounds,
            seed=seed,
            load_requests=load_requests,
            load_prompt=load_prompt,
            load_prompt_to=load_prompt_to,
            load_output=load_output,
            idle_reps=idle_reps,
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
                result, fit = asyncio.run(
                    run_profile(url, model, design, headers, progress, engine, given)
                )
        except ProbeError as error:
            raise UsageFailure(f"--target-url {url}: {error}") from None
        write_profile(result, fit, out_file, name)
        table = Table(title=f"profile of {result.engine.model}", title_justify="left")
        for col in ("coefficient", "value", "std. error"):
            table.add_column(col, justify="left" if col == "coefficient" else "right")
        for cells in lib.coefficient_rows(fit):
            table.add_row(*cells)
        out.print(table)
        rounds_line, engine_line = lib.probe_lines(result, budget)
        out.print(rounds_line, markup=False, highlight=False)
        out.print(engine_line, markup=False, highlight=False, soft_wrap=True)
        out.print(f"wrote {out_file}", markup=False, highlight=False)
