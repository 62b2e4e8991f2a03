"""`fairbench fidelity` and `fairbench profile`: the simulator's calibration loop.

`profile` fits a cost profile from a live engine (fairbench.targets.profile); `fidelity`
measures how far a simulated run of a plan is from a real run of it
(fairbench.decide.fidelity); `fairbench run --simulate PROFILE` closes the loop on one live run
(`simulated_scenario` below builds the simulated twin of its scenario, `measure_fidelity`
writes what `fairbench fidelity RUN RUN/sim` writes). Kept apart from `analysis` so the
commands of the loop read together. Registered on the app by `fairbench.cli.main.main`.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from fairbench.cli.inputs import UsageFailure, scenario_with
from fairbench.workload.scenario import Scenario, ScenarioError

if TYPE_CHECKING:
    from fairbench.decide.fidelity import Fidelity

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


# ---------------------------------------------------------------- `fairbench run --simulate`

# The simulated engine mode each live target's engine gets. The simulator has two: the
# reference scheduler (what the reference server runs) and vLLM V1's own scheduling. SGLang,
# TGI and an unknown OpenAI server are continuous-batching engines with a per-step token budget
# and KV allocated as tokens are produced, which the vLLM mode models; no mode of their own
# exists, so they get the vLLM one and the headline says so.
SIM_ENGINE = {"reference": "reference", "vllm": "vllm", "sglang": "vllm", "tgi": "vllm"}
# Keys of a live scenario's `scheduler:` block that describe a vLLM-like engine's limits and
# that the vLLM mode takes; the rest of the block (a reference policy's options) is not carried.
VLLM_LIMITS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunked_prefill",
    "kv_cache_tokens",
    "block_size",
    "max_model_len",
)


@dataclass(frozen=True)
class Simulation:
    """The simulated twin of a live run's scenario, and how it was chosen (one line)."""

    scn: Scenario
    profile: str
    line: str


def _profile_spec(text: str) -> str:
    """`--simulate`'s value as `scheduler.profile` takes it (an absolute path, or a shipped
    profile's name), checked by loading it: a missing or bad file is one line, exit 2."""

    from reference_scheduler.core.costmodel import ProfileError, load_profile, shipped_profiles

    path = Path(text)
    if path.is_dir():
        raise UsageFailure(f"--simulate {text}: a directory; give the profile YAML file")
    if path.is_file():
        spec = str(path.resolve())
    elif text in shipped_profiles():
        spec = text
    else:
        raise UsageFailure(
            f"--simulate {text}: no such profile file; give the YAML `fairbench profile` wrote "
            f"(or a shipped profile: {', '.join(shipped_profiles())})"
        )
    try:
        load_profile(spec, where="profile")
    except ProfileError as error:
        raise UsageFailure(f"--simulate {text}: {' '.join(str(error).split())}") from None
    except yaml.YAMLError as error:
        why = " ".join(str(error).split())[:160]
        raise UsageFailure(f"--simulate {text}: not a profile YAML ({why})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageFailure(f"--simulate {text}: cannot read ({error})") from None
    return spec


def _class_priorities(scn: Scenario) -> dict[str, int]:
    """Each SLO class's priority as the live engine received it, for every class: the
    simulated vLLM ranks a request by its class's `priority`, so the number the live target
    sent (`target.priority`) goes to each class, and 0 — the engines' default when a request
    carries none — to a class that was sent nothing. The plan does not change: it names
    classes, not their fields.

    SGLang runs *higher* values first (unless started with
    `--schedule-low-priority-values-first`), the simulated vLLM lower first, so SGLang's values
    are negated; `--simulate-set slo_classes.NAME.priority=N` says otherwise. A `priority` sent
    through `extra_body` / `class_extra_body` is not modelled and is refused."""
    target = scn.target
    for where, body in [("target.extra_body", target.extra_body)] + [
        (f"target.class_extra_body.{name}", b) for name, b in target.class_extra_body.items()
    ]:
        if "priority" in body:
            raise UsageFailure(
                f"--simulate: {where} sends a priority the simulation cannot read; use "
                "target.priority (by slo_class or tenant) instead, or give --simulate-set "
                "slo_classes.NAME.priority=N for each class"
            )
    sign = -1 if target.kind == "sglang" else 1
    spec = target.priority
    out = dict.fromkeys(scn.slo_classes, 0)
    if spec is None:
        return out
    if spec.by == "slo_class":
        for name in scn.slo_classes:
            value = spec.values.get(name, spec.default)
            out[name] = 0 if value is None else sign * value
        return out
    sent: dict[str, dict[int, str]] = {}
    for tenant in scn.tenants:
        value = spec.values.get(tenant.id, spec.default)
        value = 0 if value is None else value
        for workload in scn.mix_of(tenant):
            sent.setdefault(scn.slo_class_of(tenant, workload), {})[value] = tenant.id
    for name, values in sent.items():
        if len(values) > 1:
            who = ", ".join(f"{t} {v}" for v, t in sorted(values.items()))
            raise UsageFailure(
                f"--simulate: target.priority is by tenant and class {name!r} was sent "
                f"different priorities ({who}); the simulated vLLM ranks by SLO class: give "
                f"--simulate-set slo_classes.{name}.priority=N (or one class per tenant)"
            )
        out[name] = sign * next(iter(values))
    return out


def simulated_scenario(
    doc: dict[str, Any],
    scn: Scenario,
    file: Path,
    profile: str,
    overrides: list[str] | None = None,
    seed: int | None = None,
) -> Simulation:
    """The live scenario `scn` (document `doc`, from `file`) as `target: sim`, on `profile`,
    in the engine mode that matches the live target's engine; `overrides` (`--simulate-set`)
    applied last. Everything but the target, the `scheduler:` block and the classes'
    priorities stays as it is, so the plan is the same (checked when overrides are given).

    The policy: the reference target simulates its own `scheduler:` block (policy and all)
    on the profile. A vLLM engine's policy is `fcfs` (vLLM's default `--scheduling-policy`)
    unless the scenario's `scheduler.policy` is `priority` (the block a live vLLM run does not
    otherwise read); `--simulate-set scheduler.policy=priority` says it on the command line."""
    if scn.target.kind == "sim":
        raise UsageFailure(
            "--simulate: the scenario's target is sim already; --simulate replays a live run's "
            "plan in simulation (compare two runs with `fairbench fidelity REAL SIM`)"
        )
    if scn.target.upstreams:
        raise UsageFailure(
            "--simulate: target.upstreams runs the gateway in front of real engines, which has "
            "no simulated counterpart; simulate the engines' scenario with --set target.kind=sim"
        )
    if scn.target.faults:
        raise UsageFailure(
            "--simulate: target.faults injects failures the simulation would not have; remove "
            "them to compare the live run with its simulation"
        )
    spec = _profile_spec(profile)
    data = json.loads(json.dumps(doc))
    kind = scn.target.kind
    mode = SIM_ENGINE.get(kind, "vllm")
    if mode == "reference":
        block = {**scn.scheduler, "profile": spec}
    else:
        policy = "priority" if scn.scheduler.get("policy") == "priority" else "fcfs"
        block = {"engine": "vllm", "policy": policy, "profile": spec}
        block.update({k: scn.scheduler[k] for k in VLLM_LIMITS if k in scn.scheduler})
        ranks = _class_priorities(scn)
        classes = data.get("slo_classes")
        if not isinstance(classes, dict):
            classes = {
                name: cls.model_dump(exclude_none=True) for name, cls in scn.slo_classes.items()
            }
            data["slo_classes"] = classes
        for name, value in ranks.items():
            if isinstance(classes.get(name), dict):
                classes[name]["priority"] = value
    data["target"] = {"kind": "sim"}
    data["scheduler"] = block
    items = list(overrides or [])
    try:
        sim_doc, sim = scenario_with(file, items, "--simulate-set", raw=data)
    except ScenarioError as error:  # the twin itself (not an override) does not validate
        raise UsageFailure(
            *(f"--simulate {profile}: the simulated scenario: {line}" for line in error.lines)
        ) from None
    if sim.target.kind != "sim":
        raise UsageFailure(
            f"--simulate-set {' '.join(items)}: the simulated scenario's target must stay sim "
            "(the live run is the scenario's own target)"
        )
    from fairbench.plan.materialize import materialize

    live, twin = materialize(scn, seed).digest, materialize(sim, seed).digest
    if live != twin:  # checked before the live run starts, so nothing is spent on it
        what = f"--simulate-set {' '.join(items)}" if items else f"--simulate {profile}"
        raise UsageFailure(
            f"{what}: changes the plan ({twin[:19]}… against the live {live[:19]}…); "
            "--simulate-set may change the engine (scheduler.*, slo_classes.*.priority), not "
            "the workload, tenants or run"
        )
    shown = {k: v for k, v in sim_doc["scheduler"].items() if k != "profile"}
    shown = {**shown, "profile": profile}
    how = yaml.safe_dump(shown, default_flow_style=True, sort_keys=False, width=10**6).strip()
    note = "" if kind in ("reference", "vllm") else f" (no {kind} mode: vLLM's scheduling model)"
    line = f"target sim, scheduler {how}{note}"
    return Simulation(sim, spec, line)


def measure_fidelity(
    real: Path, sim: Path, noise: Path | None = None, factor: float = 1.0, out: Path | None = None
) -> tuple[Fidelity, list[Path]]:
    """`fairbench fidelity REAL SIM`'s measurement and its files (fidelity.json, .md, .html in
    `out`, default SIM). Raises FidelityRefused (one line) when the runs cannot be compared."""
    from fairbench.decide.fidelity import fidelity as measure
    from fairbench.decide.fidelity import write_outputs
    from fairbench.report import write_page
    from fairbench.report.fidelity import fidelity_markdown, fidelity_report

    fid = measure(real, sim, noise, factor)
    target = out if out is not None else sim
    written = write_outputs(fid, target, fidelity_markdown(fid))
    written.append(write_page(target / "fidelity.html", fidelity_report(fid)))
    return fid, written


def mape_line(fid: Fidelity) -> str:
    """The headline: MAPE over every figure, and per tenant."""
    mape = fid.mape()
    if not math.isfinite(mape):
        return "MAPE: no figure both runs have"
    tenants = [
        f"{key} {fid.mape('tenant', key):.1f}%"
        for group, key in fid.groups()
        if group == "tenant" and math.isfinite(fid.mape("tenant", key))
    ]
    per = f" (per tenant: {', '.join(tenants)})" if tenants else ""
    return f"MAPE {mape:.1f}% over {len(fid.finite())} figures{per}"


def _merge_profiles(files: list[Path], out_file: Path, name: str | None) -> None:
    """`fairbench profile --merge FILE...`: read each profile, refit their pooled probe data
    (fairbench.targets.profile.merge_profiles), write the merged profile, and print its
    coefficients beside each source's step constants (the drift between the probes)."""
    from fairbench.targets.profile import MergeError, ProbeError, merge_profiles

    if out_file.exists() and out_file.is_dir():
        raise UsageFailure(f"--out {out_file}: a directory; give the profile's file name")
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        if not path.is_file():
            raise UsageFailure(f"--merge {path}: no such file; give a profile YAML that "
                               "`fairbench profile` wrote")  # fmt: skip
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            why = str(error).splitlines()[0]
            raise UsageFailure(f"--merge {path}: not YAML ({why})") from None
        if not isinstance(doc, dict):
            raise UsageFailure(f"--merge {path}: not a profile (a YAML mapping)")
        docs.append((str(path), doc))
    try:
        merged, the_fit = merge_profiles(docs, name or out_file.stem)
    except MergeError as error:
        raise UsageFailure(f"--merge {error}") from None
    except ProbeError as error:  # the pooled data cannot be fitted
        raise UsageFailure(f"--merge: {error}") from None
    out_file.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Merged by `fairbench profile --merge` from {len(docs)} probes of "
        f"{(merged['fit'].get('engine') or {}).get('model')}: {the_fit.n} design points, "
        f"{len(the_fit.raw)} observations, RMS relative residual {the_fit.rms_relative:.1%}. "
        f"Load it with scheduler: {{profile: {out_file.name}}}.\n"
    )
    out_file.write_text(header + yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
    table = Table(title=f"merged profile of {len(docs)} probes", title_justify="left")
    for col in ("profile", "rounds", "a", "d"):
        table.add_column(col, justify="left" if col == "profile" else "right")
    for src in merged["fit"]["merged_from"]:
        table.add_row(src["profile"], str(src["rounds"]), *(f"{src[k]}" for k in ("a", "d")))
    table.add_row(
        "merged", str(merged["fit"]["rounds"]), f"{merged['a']:.4g}", f"{merged['d']:.4g}"
    )
    out.print(table)
    out.print(f"wrote {out_file}", markup=False, highlight=False)


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
        from fairbench.decide.fidelity import FidelityRefused

        try:
            fid, written = measure_fidelity(real, sim, noise, factor, out_dir)
        except FidelityRefused as error:
            raise UsageFailure(f"cannot measure fidelity: {error}") from None
        if as_json:
            sys.stdout.write(json.dumps(fid.as_dict(), indent=2) + "\n")
            return
        out.print(_fidelity_table(fid))
        out.print(mape_line(fid), markup=False, highlight=False)
        out.print("wrote " + ", ".join(str(p) for p in written), markup=False, highlight=False)

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

        import yaml
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from fairbench.targets.precheck import check_reachable
        from fairbench.targets.profile import (
            ENGINES,
            ProbeDesign,
            ProbeError,
            profile_document,
            run_profile,
        )

        if merge:
            if target_url is not None:
                raise UsageFailure(
                    "--merge fits from earlier probes' data and probes nothing: "
                    "drop --target-url (or --merge)"
                )
            _merge_profiles(merge, out_file, name)
            return
        if target_url is None:
            raise UsageFailure(
                "--target-url is missing: give the engine's base URL, e.g. "
                "--target-url http://127.0.0.1:8000 (or --merge FILE to refit earlier probes)"
            )
        if engine not in (*ENGINES, "auto"):
            raise UsageFailure(
                f"--engine {engine}: not an engine; use one of {', '.join(ENGINES)} or auto"
            )
        if out_file.exists() and out_file.is_dir():
            raise UsageFailure(f"--out {out_file}: a directory; give the profile's file name")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = target_url.rstrip("/").removesuffix("/v1")
        if not url.startswith(("http://", "https://")) or url[-3:] == "://":
            raise UsageFailure(
                f"--target-url {target_url}: not an http(s) URL; e.g. http://127.0.0.1:8000"
            )
        asyncio.run(check_reachable(url, headers, label="--target-url"))
        flags = {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "kv_cache_tokens": kv_cache_tokens,
        }
        given = {k for k, v in flags.items() if v is not None}
        design = ProbeDesign(
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs or 8,
            max_num_batched_tokens=max_num_batched_tokens or 2048,
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
        doc = profile_document(result, fit, name or out_file.stem)
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
        if fit.front_end is not None:  # a median, with its median absolute deviation
            fe = fit.front_end
            table.add_row("front end (core)", f"{fe['core_ms']:.4g}", f"MAD {fe['mad_ms']:.2g}")
        if fit.idle is not None:
            idle = fit.idle
            table.add_row("idle wake", f"{idle['wake_ms']:.4g}", f"MAD {idle['mad_ms']:.2g}")
        out.print(table)
        out.print(
            f"{result.rounds} round(s) of the probe in {result.seconds:.0f} s"
            + (f" (the --budget of {budget:g} s allowed no more)" if result.truncated else ""),
            markup=False,
            highlight=False,
        )
        info = result.engine
        said = ", ".join(f"{k} {getattr(info, k)}" for k in sorted(info.source) if k != "version")
        out.print(
            f"engine: {info.kind} ({info.detected_by})"
            + (f", version {info.version}" if info.version else "")
            + (f"; it said {said}" if said else "; it said nothing of its limits"),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        out.print(f"wrote {out_file}", markup=False, highlight=False)
