"""Paired A/B verdicts: refusals, the expected sign on the incident, and the A/A false-positive
rate."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fairbench.analysis import registry
from fairbench.analysis.registry import Name
from fairbench.decide.compare import CompareRefused, RunData, compare_dirs, compare_scenario_pairs
from fairbench.pipeline import run_scenario
from fairbench.plan.materialize import materialize
from fairbench.run import RunOptions
from fairbench.run.records import records_frame
from fairbench.targets.sim import run_sim
from fairbench.workload.loading import load_scenario
from fairbench.workload.models import Scenario

REPO = Path(__file__).resolve().parents[1]
INCIDENT = load_scenario(REPO / "scenarios" / "incident-fifo.yaml")


def sim_run(scn: Scenario, seed: int, policy: str, noise_seed: int, noise: float = 0.05) -> RunData:
    """A simulated run held in memory (what load_run would read from a run directory)."""
    variant = scn.model_copy(
        update={
            "scheduler": {
                **scn.scheduler,
                "policy": policy,
                "step_noise_cv": noise,
                "seed": noise_seed,
            }
        }
    )
    plan = materialize(variant, seed)
    rows, _ = run_sim(plan, variant)
    window = [variant.run.warmup, (variant.run.duration or 0) - variant.run.cooldown]
    frame = records_frame(rows)
    t = frame["t_intended_ns"] / 1e9
    frame = frame[(t >= window[0]) & (t <= window[1])].reset_index(drop=True)
    summary = {
        "plan_digest": plan.digest,
        "scenario": variant.name,
        "schema_version": 2,
        "valid": True,
        "window_s": window,
    }
    return RunData(Path(f"mem/{policy}-{seed}-{noise_seed}"), summary, frame)


def test_refuses_runs_of_different_plans_and_says_which(tmp_path: Path) -> None:
    short = INCIDENT.run.model_copy(update={"duration": 20.0, "warmup": 0.0, "cooldown": 0.0})
    tenants = [t.model_copy(update={"phases": []}) for t in INCIDENT.tenants]
    scn = INCIDENT.model_copy(update={"run": short, "tenants": tenants})
    a = run_scenario(scn, RunOptions(out=tmp_path / "a", seed=1)).run_dir
    b = run_scenario(scn, RunOptions(out=tmp_path / "b", seed=2)).run_dir
    with pytest.raises(CompareRefused, match="no B run replayed the plan"):
        compare_dirs([a], [b], resamples=100)
    ra, rb = sim_run(scn, 1, "fifo", 0), sim_run(scn, 2, "fifo", 0)
    with pytest.raises(CompareRefused, match="plan_digest differs"):
        compare_scenario_pairs([(ra, rb)], scn, resamples=100)


def test_repeats_of_one_plan_pair_in_order_and_need_as_many_b_runs(tmp_path: Path) -> None:
    """Interleaved repeats of one seed (A1 B1 A2 B2) pair with their neighbours: each B run
    counts once. Before, B runs were keyed by plan digest, so the last B stood in for every A."""
    short = INCIDENT.run.model_copy(update={"duration": 20.0, "warmup": 0.0, "cooldown": 0.0})
    tenants = [t.model_copy(update={"phases": []}) for t in INCIDENT.tenants]
    base = INCIDENT.model_copy(update={"run": short, "tenants": tenants})

    def run(name: str, policy: str, noise_seed: int) -> Path:
        sched = {**base.scheduler, "policy": policy, "step_noise_cv": 0.2, "seed": noise_seed}
        scn = base.model_copy(update={"scheduler": sched})
        return run_scenario(scn, RunOptions(out=tmp_path / name, seed=1)).run_dir

    a = [run("a1", "fifo", 1), run("a2", "fifo", 2)]
    b = [run("b1", "dwrr", 3), run("b2", "dwrr", 4)]
    name = "ttft_p99.tenant.support-bot"
    alone = [compare_dirs([x], [y], resamples=50).get(name) for x, y in zip(a, b, strict=True)]
    both = compare_dirs(a, b, resamples=50).get(name)
    assert both is not None and all(v is not None for v in alone)
    assert both.b_runs == [v.b for v in alone if v is not None], both.as_dict()
    assert both.b_runs[0] != both.b_runs[1]  # the two B runs differ, so the pairing shows
    with pytest.raises(CompareRefused, match=r"2 A run\(s\) but 1 B run\(s\)"):
        compare_dirs(a, b[:1], resamples=50)
    other = run_scenario(base, RunOptions(out=tmp_path / "other", seed=2)).run_dir
    with pytest.raises(CompareRefused, match=r"no A run replayed the plan of .*other"):
        compare_dirs(a, [*b, other], resamples=50)


def test_refuses_an_invalid_run() -> None:
    a = sim_run(INCIDENT, 1, "fifo", 0)
    b = sim_run(INCIDENT, 1, "dwrr", 0)
    b.summary.update(valid=False, invalid_reasons=["generator fell behind"])
    with pytest.raises(CompareRefused, match=r"INVALID \(generator fell behind\)"):
        compare_scenario_pairs([(a, b)], INCIDENT, resamples=100)


def test_dwrr_beats_fifo_on_the_incident_with_the_expected_sign() -> None:
    pairs = [
        (sim_run(INCIDENT, s, "fifo", 1), sim_run(INCIDENT, s, "dwrr", 1)) for s in (11, 12, 13)
    ]
    verdicts = {
        v.metric: v for v in compare_scenario_pairs(pairs, INCIDENT, resamples=400).verdicts
    }
    starved = verdicts["starved_share"]
    # FIFO lets the bursting tenant starve everyone behind it; DWRR across tenants lets the
    # well-behaved ones through: fewer requests wait past 10x their SLO. (The worst/best
    # slowdown ratio does not improve: DWRR makes the bursting tenant absorb its own burst,
    # so the spread between tenants stays; FIFO's misery is equal. See docs/ci-gate.md.)
    assert starved.verdict == "better" and starved.diff < -0.05 and starved.ci_high < 0
    assert verdicts["slo_attainment.class.interactive"].verdict == "better"
    # the per-tenant answer the overall p99 hides: the support bot's tail collapses
    bot = verdicts["ttft_p99.tenant.support-bot"]
    assert bot.verdict == "better" and bot.b < bot.a / 5, bot.as_dict()
    assert len(bot.a_runs) == len(bot.b_runs) == 3  # the between-run spread of each arm
    for v in verdicts.values():  # the estimate always lies inside its interval
        if v.ci_low == v.ci_low:
            assert v.ci_low <= v.diff <= v.ci_high, v.as_dict()


HEADLINE_ROWS = [
    *(Name(registry.get(n)) for n in ("ttft_p99", "e2e_p99", "slo_attainment", "starved_share")),
    *(
        Name(registry.get(n), "tenant", t)
        for t in ("vip", "support-bot", "reports")
        for n in ("ttft_p99", "e2e_p99", "slo_attainment", "throughput_share")
    ),
    *(Name(registry.get(n), "class", c) for c in ("interactive", "batch") for n in ("ttft_p99",)),
]


def _short_incident() -> Scenario:
    run = INCIDENT.run.model_copy(update={"duration": 30.0, "warmup": 2.0, "cooldown": 2.0})
    tenants = [t.model_copy(update={"phases": []}) for t in INCIDENT.tenants]
    return INCIDENT.model_copy(update={"run": run, "tenants": tenants})


@pytest.mark.slow
def test_a_vs_a_false_positive_rate_holds_at_every_design() -> None:
    """100 repetitions of A vs A where only the engine's noise differs (seeded step noise, so
    run-to-run variation exists as on a live engine). At `ab`'s default design (3 pairs) each
    headline row — overall, per tenant, per class — reports a significant change in at most
    5 of them; at `compare`'s default (one pair of a noisy target) none is ever called."""
    short = _short_incident()
    three: Counter[str] = Counter()
    one: Counter[str] = Counter()
    for rep in range(100):
        pairs = [
            (
                sim_run(short, 1000 * rep + j, "fifo", 2 * rep),
                sim_run(short, 1000 * rep + j, "fifo", 2 * rep + 1),
            )
            for j in range(3)
        ]
        kw = {"resamples": 100, "seed": rep, "rows": HEADLINE_ROWS}
        for v in compare_scenario_pairs(pairs, short, **kw).verdicts:
            if v.verdict in ("better", "worse"):
                three[v.metric] += 1
        for v in compare_scenario_pairs(pairs[:1], short, **kw).verdicts:
            assert v.verdict in ("inconclusive", "cannot evaluate", "no significant change")
            if v.verdict in ("better", "worse"):
                one[v.metric] += 1
    assert all(n <= 5 for n in three.values()), three
    assert not one


def test_a_deterministic_pair_is_judged_and_an_identical_one_is_no_change() -> None:
    """One pair of a noise-free simulation: the plan is the only source of variation, so the
    block bootstrap judges it — A vs A is exactly no change, FIFO vs DWRR is a verdict."""
    short = _short_incident()
    a, a2 = sim_run(short, 5, "fifo", 0, noise=0.0), sim_run(short, 5, "fifo", 0, noise=0.0)
    same = compare_scenario_pairs([(a, a2)], short, resamples=100, deterministic=True)
    assert "deterministic" in same.design
    assert {v.verdict for v in same.verdicts} <= {"no significant change", "cannot evaluate"}
    fifo, dwrr = (sim_run(INCIDENT, 11, p, 0, noise=0.0) for p in ("fifo", "dwrr"))
    ab = compare_scenario_pairs([(fifo, dwrr)], INCIDENT, resamples=200, deterministic=True)
    assert ab.get("ttft_p99.tenant.support-bot").verdict == "better"  # type: ignore[union-attr]


def test_a_censored_tail_never_wins() -> None:
    """B times out its worst requests: its p99 is only a lower bound, and it must not look
    better than A's finished tail."""
    short = _short_incident()
    a = sim_run(short, 7, "fifo", 0, noise=0.0)
    b_frame = a.records.copy()
    ttft = b_frame["t_first_token_ns"] - b_frame["t_intended_ns"]
    worst = ttft >= ttft.quantile(0.95)
    b_frame.loc[worst, ["status", "t_first_token_ns", "t_last_token_ns", "t_done_ns"]] = [
        "timeout",
        None,
        None,
        None,
    ]
    b_frame.loc[worst, "t_end_ns"] = (b_frame["t_intended_ns"] + short.run.timeout * 1e9)[worst]
    b = RunData(Path("mem/b-timeouts"), dict(a.summary), b_frame)
    comparison = compare_scenario_pairs([(a, b)], short, resamples=100, deterministic=True)
    p99 = comparison.get("ttft_p99")
    assert p99 is not None and p99.b_bound and p99.verdict != "better", p99.as_dict()


def _timed_out_tail(run: RunData, share: float, timeout_s: float, cut: float = 0.0) -> RunData:
    """The run with its slowest `share` of TTFTs timed out: last seen at the timeout, or with
    `cut` > 0 at `cut` × the TTFT it would have had (censored just below its true value; the
    comparison's scenario then needs a timeout shorter than that)."""
    frame = run.records.copy()
    ttft = frame["t_first_token_ns"] - frame["t_intended_ns"]
    worst = ttft >= ttft.quantile(1 - share)
    cols = ["status", "t_first_token_ns", "t_last_token_ns", "t_done_ns"]
    frame.loc[worst, cols] = ["timeout", None, None, None]
    end = (ttft * cut).round() if cut else timeout_s * 1e9
    frame.loc[worst, "t_end_ns"] = (frame["t_intended_ns"] + end)[worst]
    return RunData(Path(f"{run.path}-censored"), dict(run.summary), frame)


def test_one_noisy_pair_is_inconclusive_on_every_row_censored_or_not() -> None:
    """Before #32 a censored row returned `worse` from one pair of a noisy target (the bound
    branch ran before the one-pair rule); one pair cannot see run-to-run noise, bound or not."""
    short = _short_incident()
    a = sim_run(short, 7, "fifo", 0)
    b = _timed_out_tail(sim_run(short, 7, "fifo", 1), 0.05, short.run.timeout)
    comparison = compare_scenario_pairs([(a, b)], short, resamples=100)
    p99 = comparison.get("ttft_p99")
    assert p99 is not None and p99.b_bound and p99.verdict == "inconclusive", p99.as_dict()
    assert {v.verdict for v in comparison.verdicts} <= {"inconclusive", "cannot evaluate"}


def test_mixed_bounds_over_pairs_are_evidence_one_sided() -> None:
    """Three pairs; B's tail was cut short in two of them (its p99 only a lower bound there): the
    bounds, far above A's values, still show B is worse — one-sided, its upper end open — and
    the mirror (A censored) shows B better. Bounds on both sides say nothing."""
    short = _short_incident()
    slow = short.model_copy(update={"scheduler": {**short.scheduler, "max_num_seqs": 8}})
    pairs = []
    for j, s in enumerate((21, 22, 23)):
        a = sim_run(short, s, "fifo", 10 + j)
        b = sim_run(slow, s, "fifo", 20 + j)  # a real regression: a quarter of the batch slots
        pairs.append((a, _timed_out_tail(b, 0.05, short.run.timeout, 0.999) if j < 2 else b))
    row = [Name(registry.get("ttft_p99"))]
    cut = short.model_copy(update={"run": short.run.model_copy(update={"timeout": 1.0})})
    worse = compare_scenario_pairs(pairs, cut, resamples=100, rows=row).get("ttft_p99")
    assert worse is not None and worse.b_bound and not worse.a_bound
    assert worse.verdict == "worse" and worse.ci_high == float("inf"), worse.as_dict()
    assert worse.ci_low > 0
    mirror = [(b, a) for a, b in pairs]
    better = compare_scenario_pairs(mirror, cut, resamples=100, rows=row).get("ttft_p99")
    assert better is not None and better.verdict == "better" and better.ci_low == float("-inf")
    both = [(pairs[0][1], pairs[0][1]), (pairs[1][1], pairs[1][1])]
    none = compare_scenario_pairs(both, cut, resamples=100, rows=row).get("ttft_p99")
    assert none is not None and none.verdict == "cannot evaluate" and "both arms" in none.reason


def test_too_few_requests_or_blocks_say_why_there_is_no_verdict() -> None:
    """A group with a handful of requests has no verdict, and says how many it had; one
    deterministic pair shorter than MIN_BLOCKS time blocks says what duration would do."""
    from fairbench.decide.compare import MIN_BLOCKS, MIN_PER_ARM

    short = _short_incident()
    a, b = (sim_run(short, 9, p, 0, noise=0.0) for p in ("fifo", "dwrr"))
    comparison = compare_scenario_pairs([(a, b)], short, resamples=100, deterministic=True)
    p99 = comparison.get("ttft_p99")
    assert p99 is not None and p99.verdict == "cannot evaluate", p99.as_dict()
    assert f"≥ {MIN_BLOCKS}" in p99.reason and "time blocks" in p99.reason
    few = [
        (
            RunData(a.path, a.summary, a.records.iloc[: MIN_PER_ARM // 2 - 1]),
            RunData(b.path, b.summary, b.records.iloc[: MIN_PER_ARM // 2 - 1]),
        )
    ] * 2  # two pairs: the arm's runs together hold fewer than MIN_PER_ARM
    comparison = compare_scenario_pairs(few, short, resamples=50)
    row = comparison.get("ttft_p99")
    assert row is not None and row.verdict == "cannot evaluate"
    assert "too few requests" in row.reason and f"≥ {MIN_PER_ARM}" in row.reason


def test_the_verdict_tables_title_keeps_the_overrides_brackets() -> None:
    """An override with a list value (`classes=[premium, interactive]`) is shown as typed: rich
    reads `[...]` as markup, which printed `classes: ,` in `fairbench ab`'s title."""
    from rich.console import Console

    from fairbench.decide.compare import Comparison
    from fairbench.report.terminal import verdict_table

    title = "B (tiers=[premium, interactive]) vs A (scheduler.policy=fifo)"
    console = Console(record=True, width=200)
    console.print(verdict_table(Comparison(pairs=1), title, 0.95, "note [bold]x[/bold]"))
    text = console.export_text()
    assert "tiers=[premium, interactive]" in text
    assert "note [bold]x[/bold]" in text


def test_the_bootstrap_tells_its_progress_and_changes_nothing() -> None:
    """`progress(done, total)` is told after each draw (the `fairbench compare` bar: two
    10-minute fleet runs take 0.5-0.8 CPU s a draw), and the verdicts are those of a run without
    it, to the last bit."""
    pair = [(sim_run(INCIDENT, 1, "fifo", 1), sim_run(INCIDENT, 1, "dwrr", 2))]
    told: list[tuple[int, int]] = []
    watched = compare_scenario_pairs(
        pair, INCIDENT, resamples=30, progress=lambda d, n: told.append((d, n))
    )
    assert told == [(d, 30) for d in range(1, 31)]
    plain = compare_scenario_pairs(pair, INCIDENT, resamples=30)
    assert watched.as_dict() == plain.as_dict()
