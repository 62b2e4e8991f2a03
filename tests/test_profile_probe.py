"""`fairbench profile` (issue #16, item 1): probe a live engine and fit its cost profile.

The engine here is the repository's own reference server, whose step times come from a profile
we choose, so the fit has a truth to recover. What would break if the probe or the fit were
wrong: a coefficient off by more than the fit's own standard errors allow (the tolerance is the
fit's, not a latency threshold: a loaded machine widens the errors and the tolerance with
them); a profile the simulator cannot load; an unreachable engine, or one that refuses the
probe, ending in a traceback instead of one line; vLLM's self-description not read.
"""

from __future__ import annotations

import asyncio
import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from aiohttp import web

from fairbench.targets.profile import cache_config, engine_info
from reference_scheduler.core.costmodel import load_profile
from reference_scheduler.server.app import build_app
from reference_scheduler.server.config import parse_server_config
from tests.cli import REPO, run_cli
from tests.loopback import free_port, serve, serve_in_thread
from tests.profile_design import exact_design

# It fits a server's timing from real requests: no other test runs beside it (tests/conftest.py)
pytestmark = pytest.mark.quiet
# Large enough that a few ms of loop lateness are small against every term: prefill of 2,000
# tokens is 508 ms, a decode step of 8 sequences at 1,000 tokens each 68 ms.
TRUTH = {"a": 8.0, "b": 0.25, "c": 0.0, "d": 20.0, "e": 2.0, "f": 0.004}


def known_server(
    front_end_core_ms: float = 0.0, idle_wake_ms: float = 0.0, floor: float = 0.0
) -> web.Application:
    profile = {
        "name": "known",
        **TRUTH,
        "floor": floor,
        "kv_cache_tokens": 200_000,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "front_end_core_ms": front_end_core_ms,
        "idle_wake_ms": idle_wake_ms,
    }
    cfg = parse_server_config({"model": "ref", "scheduler": {"policy": "fifo", "profile": profile}})
    return build_app(cfg)


def profile_known(
    out: Path,
    *,
    front_end_ms: float,
    budget: int,
    rounds: int,
    seed: int,
    wake_ms: float = 0.0,
    floor: float = 0.0,
) -> str:
    """`fairbench profile` of a `known_server` into `out`; its stdout."""
    with serve_in_thread(known_server(front_end_ms, wake_ms, floor)) as url:
        proc = run_cli(
            "profile", "--target-url", url, "--out", str(out), "--max-num-seqs", "8",
            "--max-num-batched-tokens", "2048", "--max-model-len", "4096",
            "--kv-cache-tokens", "200000", "--budget", str(budget), "--rounds", str(rounds),
            "--seed", str(seed), timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"wrote {out}" in proc.stdout
    return str(proc.stdout)


# This probe and the front end's get 60 s, so two rounds fit on a loaded machine (at 40 s and load
# average 5 only one did, and one round's outliers once chose the sum form, with a = 0.24).
@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "fitted.yaml"
    profile_known(out, front_end_ms=0.0, budget=60, rounds=2, seed=3)
    return out


def test_fit_recovers_the_servers_profile(fitted: Path) -> None:
    doc = yaml.safe_load(fitted.read_text())
    fit = doc["fit"]
    assert fit["rounds"] >= 1 and len(fit["data"]) >= fit["design_points"]
    assert fit["design"]["seed"] == 3  # --seed reached the probe's prompts
    kinds = {row["kind"] for row in fit["points"]}
    assert kinds == {"prefill", "decode", "mixed"}  # the step fit's points
    # ... and the arrival, load and idle phases' observations, kept for a merge
    assert {row["kind"] for row in fit["data"]} == {*kinds, "arrival", "load", "idle"}
    assert fit["rms_relative_residual"] < 0.1  # the form fits the engine it came from
    for key, true in TRUTH.items():
        got, se = doc[key], fit["stderr"][key]
        # Within 4 standard errors of the fit, plus 5% of the value for the per-token slopes
        # (b, c, e, f: a miscounted token or a wrong design moves them by a factor) and 50% for
        # the per-step constants (a, d). On a loaded machine the server's steps end late and
        # the client reads late, and that lateness adds to every step alike: a bias the
        # standard error cannot see, which lands in the constants. Measured beside a CPU-bound
        # process with a second test run competing (load 2.9 on two cores): a = 9.10 against
        # 8 (se 0.17), every other check passing.
        slack = (0.5 if key in ("a", "d") else 0.05) * true
        assert abs(got - true) <= 4 * se + slack + 1e-9, (key, got, true, se, fit["points"])
    # the server adds no prefill chunk to its decode step (its form is `max`), and the fit
    # tells the two forms apart
    assert doc["mixed_step"] == "max", fit["mixed_step"]
    # the request overhead is its own term, not folded into the step cost
    assert "overhead" not in doc and "overhead" in fit["stderr"]
    # no floor where the server has none (a floor must hold two prompt lengths or more)
    assert doc["floor"] == 0.0, (doc["floor"], fit["points"])
    # ... and the sim target's request_overhead_ms (each simulated arrival delayed by it)
    assert doc["request_overhead_ms"] == fit["overhead_ms"]


def _synthetic(floor: float, overhead: float) -> list[Any]:
    """The probe's design points as an exact server of TRUTH (and `floor`) would give them."""
    return exact_design(
        TRUTH,
        floor=floor,
        overhead=overhead,
        prefills=(16, 31, 62, 123, 245, 487, 970, 1945),
        decode_prompts=(32, 1024),
        decode_batches=(1, 2, 4, 8),
        mixed=((256, 512, 1024), 4, 229),
    )


@pytest.mark.parametrize("floor", [0.0, 30.0])
def test_the_fit_separates_floor_overhead_and_a_on_exact_data(floor: float) -> None:
    """On exact observations the fit recovers every coefficient: the floor (the shortest
    prompts' TTFTs sit on it), and `a` apart from the request overhead (a prefill's TTFT has
    both, a mixed step only `a`). The floor written as 0, as it was before, would put the
    16-token prompt at 12 ms instead of 30; with `a` and the overhead swapped, the mixed steps
    would miss by the overhead."""
    from fairbench.targets.profile.load import fit

    chosen = fit(_synthetic(floor, 3.0))
    assert chosen.form == "max", chosen.rms_by_form
    got = chosen.coefficients
    for key, true in {**TRUTH, "floor": floor, "overhead": 3.0}.items():
        assert got[key] == pytest.approx(true, rel=1e-3, abs=1e-6), (key, got)


FLOOR_MS = 30.0


def test_the_step_floor_is_fitted(tmp_path: Path) -> None:
    """A server whose prefill steps take at least 30 ms (its profile's `floor`: the 16-, 31- and
    62-token prompts sit on it, a + b·n = 12, 16, 24 ms) gets a fitted floor, no longer 0.

    Tolerances, measured against this server (`floor` 30, two probes of 1 and 3 rounds at load
    average 5-9 on the shared two-core machine): the floor came out 30.5 and 31.4 (31.0, `a`
    9.6, with the fit that asks the prefills whether a floor is there: fit.floor_test); d, e and f
    within 2% on the quieter runs, up to 3% (d 20.6, f 0.00411) on the loaded ones, which the
    fit's standard errors cover; `a` 7.4-8.3 with the floor, and 8.9-11.9 over five probes of
    the server without one (the fit trades b down 5% and c up against `a` when the longest
    prefills run late), hence 4 standard errors plus half its value, as for the fit above.
    With the arrival phase (load 1-2): floor 29.8-30.0, `a` 7.3-8.7 over three probes."""
    out = tmp_path / "floor.yaml"
    profile_known(out, front_end_ms=0.0, budget=50, rounds=2, seed=6, floor=FLOOR_MS)
    doc = yaml.safe_load(out.read_text())
    fit = doc["fit"]
    se = fit["stderr"]
    assert abs(doc["floor"] - FLOOR_MS) <= 4 * se["floor"] + 0.1 * FLOOR_MS, (doc, fit["points"])
    for key in ("d", "e", "f"):
        got, true = doc[key], TRUTH[key]
        assert abs(got - true) <= max(0.02 * true, 4 * se[key]), (key, got, se[key])
    assert abs(doc["a"] - TRUTH["a"]) <= 4 * se["a"] + 0.5 * TRUTH["a"], (doc["a"], se["a"])
    assert doc["request_overhead_ms"] >= 0
    # the simulator takes it: the shortest prompt's step is the floor
    assert load_profile(str(out)).step_ms(16, 0, 0) == pytest.approx(doc["floor"])


def test_fitted_profile_loads_and_simulates_like_the_truth(fitted: Path, tmp_path: Path) -> None:
    prof = load_profile(str(fitted))
    assert prof.max_num_seqs == 8 and prof.kv_cache_tokens == 200_000
    for n, batch, context in ((512, 0, 0), (0, 8, 4000), (256, 4, 300)):
        true = load_profile({"name": "t", **TRUTH, "kv_cache_tokens": 1}).step_ms(n, batch, context)
        assert prof.step_ms(n, batch, context) == pytest.approx(true, rel=0.05)


# The front end's core time of the second server, and how far a measured one may be from its
# truth. The load phase reads it off a burst's makespan (16 requests of 256+16 tokens, about
# 2.5 s here). What the probe can tell is what a request arriving at a busy engine costs it, the
# prefill constant `a` plus the charge: the mixed phase's long prompts arrive at a busy engine
# too (a + charge), the prefill phase's at an idle one (a + request overhead, the overhead at
# least 0), and each of the burst's requests pays one prefill and one charge, so trading `a`
# for the charge moves nothing the probe sees (refitting the steps with the charge in their
# mixed steps has no unique fixed point: each ms moved changes the burst's estimate by 0.98 ms).
# Measured here: `a` 10.4 and a charge of 2.2-2.9 against 8 and 6 (sum 12.6-13.3 against 14).
# So the test holds the sum, the server told apart from one without a charge by it, and the
# simulated burst. (With a truth of 12 ms the mixed steps' charge made the fit choose the `sum`
# form, and the burst fitted on it came out longer than the server's: a form the front end
# confounds is a limit of the probe.)
FRONT_END_MS = 6.0
FRONT_END_SLACK_MS = 2.5


def _burst_ms(profile: dict[str, Any], front_end_ms: float, gap_ms: float) -> float:
    """The load phase's burst (16 x 256+16, sent `gap_ms` apart) simulated on the step
    coefficients of `profile` (a fitted one, or the truth) with `front_end_ms`."""
    from fairbench.targets.profile import Fit, Limits, Observation, burst_makespan_ms

    coefficients = {k: float(profile[k]) for k in "abcdef"}
    coefficients["overhead"] = float(profile.get("request_overhead_ms", 0.0))
    the_fit = Fit(coefficients, {}, [], 0.0, profile.get("mixed_step", "max"), {}, 0, [])
    burst = Observation("load", 256, 16, 16, 0.0, "load", gap_ms=gap_ms)
    made = burst_makespan_ms(the_fit, Limits(8, 2048), burst, front_end_ms)
    assert made is not None
    return made


def test_the_front_ends_core_time_is_measured(fitted: Path, tmp_path: Path) -> None:
    """A server whose requests each take 6 ms of the engine's time while it runs others
    (`front_end_core_ms`: a CPU engine's API server on the engine's core) is told apart from
    one whose front end takes none, and the fitted profile, charge included, runs a burst as
    long as the truth does."""
    out = tmp_path / "front.yaml"
    shown = profile_known(out, front_end_ms=FRONT_END_MS, budget=60, rounds=2, seed=4)
    assert "front end (core)" in shown
    doc = yaml.safe_load(out.read_text())
    got = doc["front_end_core_ms"]
    block = doc["fit"]["front_end"]
    assert block["core_ms"] == got and block["observations"] >= 1, block
    busy = doc["a"] + got  # what a request arriving at a busy engine costs it
    assert abs(busy - (TRUTH["a"] + FRONT_END_MS)) <= FRONT_END_SLACK_MS, (doc["a"], block)
    # the arrival phase measures the charge directly (one request arriving at a full batch:
    # 5.75-6.12 ms in three probes at load 1-2.7), and taken out of the mixed steps it leaves
    # `a` the step's own: before the phase the mixed steps carried the charge into `a` (8.9,
    # 9.1 and 11.2 for 8 in three probes), now 8.2-9.5. A quarter of `a`, not less: its
    # spread, ±1 ms a probe, is the mixed steps' own noise traded against b and c
    arrival = doc["fit"]["arrival"]
    assert abs(arrival["cost_ms"] - FRONT_END_MS) <= FRONT_END_SLACK_MS, arrival
    assert abs(doc["a"] - TRUTH["a"]) <= 0.25 * TRUTH["a"], (doc["a"], arrival, block)
    # at the gap the probe sent its bursts with (the round's own estimate of a request's cost)
    gap = float(np.median([r["gap_ms"] for r in doc["fit"]["data"] if r["kind"] == "load"]))
    truth = _burst_ms(TRUTH, FRONT_END_MS, gap)
    fitted_burst = _burst_ms(doc, got, gap)
    assert abs(fitted_burst / truth - 1) <= 0.02, (fitted_burst, truth, gap, block)
    plain = yaml.safe_load(fitted.read_text())
    none = plain["front_end_core_ms"]
    # the server without a charge: the arrival phase reads about 0 (0-0.6 ms, its own loop
    # parsing the request), and so does the load phase's charge, within twice the slack: with
    # `a` no longer carrying the loop's lateness, the charge does, and a burst 1% slower
    # (the machine's load) is 2 ms of it (0-3.3 ms over eight probes at load 1-2.4)
    assert plain["fit"]["arrival"]["cost_ms"] <= FRONT_END_SLACK_MS, plain["fit"]["arrival"]
    assert 0.0 <= none <= 2 * FRONT_END_SLACK_MS, none
    # told apart from the server without a charge: the busy cost differs by the charge. A
    # difference of two probes' estimates, each held within the slack above, so within
    # sqrt(2) x the slack (CI measured 3.42 ms here: the charged server's busy cost 2.2 ms
    # low, the plain one's 0.4 ms high, each within its own 2.5).
    told = busy - (plain["a"] + none)
    allowed = math.sqrt(2) * FRONT_END_SLACK_MS
    assert abs(told - FRONT_END_MS) <= allowed, (told, doc["a"], plain["a"], block)
    assert load_profile(str(out)).front_end_core_ms == got


# What the third server's engine takes to start after idling (the reference engine charges it to
# the step that starts a request finding it idle for 50 ms or more), and how far the measure may
# be from it: the idle phase's difference of two TTFTs of the same prompt, so only the loop's
# lateness on the two requests is in it.
WAKE_MS = 12.0
WAKE_SLACK_MS = 4.0


def test_an_idle_engines_wake_is_measured(fitted: Path, tmp_path: Path) -> None:
    """A server whose engine takes 12 ms to start after 50 ms of quiet is told apart from one
    that starts at once, and the profile carries it to the simulated engines."""
    out = tmp_path / "wake.yaml"
    shown = profile_known(out, front_end_ms=0.0, budget=40, rounds=2, seed=5, wake_ms=WAKE_MS)
    assert "idle wake" in shown
    doc = yaml.safe_load(out.read_text())
    got = doc["idle_wake_ms"]
    block = doc["fit"]["idle"]
    assert block["wake_ms"] == got and block["observations"] == 4 * doc["fit"]["rounds"], block
    assert block["after_quiet_ms"] == 250.0
    assert WAKE_MS / 2 <= got <= WAKE_MS + WAKE_SLACK_MS, block
    none = yaml.safe_load(fitted.read_text())
    assert 0.0 <= none["idle_wake_ms"] <= WAKE_SLACK_MS, none["fit"]["idle"]
    assert load_profile(str(out)).idle_wake_ms == got
    # --idle-reps 0: no idle phase, so no wake and no idle block
    off = tmp_path / "off.yaml"
    with serve_in_thread(known_server(0.0, WAKE_MS)) as url:
        proc = run_cli(
            "profile", "--target-url", url, "--out", str(off), "--max-num-seqs", "8",
            "--max-num-batched-tokens", "2048", "--max-model-len", "4096",
            "--kv-cache-tokens", "200000", "--budget", "20", "--rounds", "1",
            "--load-requests", "0", "--idle-reps", "0", timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = yaml.safe_load(off.read_text())
    assert "idle" not in doc["fit"]
    assert not [r for r in doc["fit"]["data"] if r["kind"] == "idle"]
    assert load_profile(str(off)).idle_wake_ms == 0.0


def test_the_load_phase_spans_the_prompt_range(tmp_path: Path) -> None:
    """--load-prompt 64 --load-prompt-to 512: the burst's prompts spread over the range in a
    shuffled order, each as the engine counted it is kept (and survives a merge), and the
    burst is simulated with them, not with their median."""
    from fairbench.targets.profile import Fit, Limits, Observation, burst_makespan_ms

    out = tmp_path / "range.yaml"
    with serve_in_thread(known_server()) as url:
        proc = run_cli(
            "profile", "--target-url", url, "--out", str(out), "--max-num-seqs", "8",
            "--max-num-batched-tokens", "2048", "--max-model-len", "4096",
            "--kv-cache-tokens", "200000", "--budget", "30", "--rounds", "1",
            "--load-prompt", "64", "--load-prompt-to", "512", "--idle-reps", "0", timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = yaml.safe_load(out.read_text())
    assert doc["fit"]["design"]["load_prompt"] == 64
    assert doc["fit"]["design"]["load_prompt_to"] == 512
    (row,) = [r for r in doc["fit"]["data"] if r["kind"] == "load"]
    prompts = row["prompts"]
    assert len(prompts) == row["batch"] == 16
    assert min(prompts) < 100 and max(prompts) > 450, prompts  # the server's own counts
    assert prompts != sorted(prompts) and prompts != sorted(prompts, reverse=True)
    assert row["n"] == round(float(np.median(prompts)))
    merged = tmp_path / "merged.yaml"
    proc = run_cli("profile", "--merge", str(out), "--out", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = [r for r in yaml.safe_load(merged.read_text())["fit"]["data"] if r["kind"] == "load"]
    assert again[0]["prompts"] == prompts
    # the simulated burst: each request's own prompt, not the median for all
    c = {k: float(doc[k]) for k in "abcdef"} | {"overhead": 0.0}
    the_fit = Fit(c, {}, [], 0.0, "max", {}, 0, [])
    spread = Observation("load", row["n"], 16, 16, 0.0, "l", 1.0, tuple(prompts))
    flat = Observation("load", row["n"], 16, 16, 0.0, "l", 1.0)
    made_spread = burst_makespan_ms(the_fit, Limits(8, 2048), spread, 0.0)
    made_flat = burst_makespan_ms(the_fit, Limits(8, 2048), flat, 0.0)
    assert made_spread is not None and made_flat is not None and made_spread != made_flat
    # a load row whose prompts do not match its burst cannot be replayed: one line
    bad = copy.deepcopy(doc)
    next(r for r in bad["fit"]["data"] if r["kind"] == "load")["prompts"] = prompts[:3]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = run_cli("profile", "--merge", str(path), "--out", str(merged))
    assert proc.returncode == 2 and "cannot replay" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _slowed(doc: dict[str, Any], factor: float) -> dict[str, Any]:
    """The profile of the same engine probed while `factor` times slower: every observation
    (and so every coefficient) scaled."""
    slow = copy.deepcopy(doc)
    for row in slow["fit"]["data"]:
        row["ms"] *= factor
    for key in TRUTH:
        slow[key] = doc[key] * factor
    return slow


def test_merge_fits_the_pooled_probes(fitted: Path, tmp_path: Path) -> None:
    """Two probes of one engine, the second while it ran twice as slow: the merged profile
    pools their rounds (each design point's median over all four), so it predicts the engine
    between the two, and says what it merged."""
    doc = yaml.safe_load(fitted.read_text())
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(_slowed(doc, 2.0)))
    merged = tmp_path / "around.yaml"
    proc = run_cli(
        "profile", "--merge", str(fitted), "--merge", str(slow), "--out", str(merged)
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"wrote {merged}" in proc.stdout
    out = yaml.safe_load(merged.read_text())
    assert [m["profile"] for m in out["fit"]["merged_from"]] == [str(fitted), str(slow)]
    assert out["fit"]["rounds"] == 2 * doc["fit"]["rounds"]
    assert len(out["fit"]["data"]) == 2 * len(doc["fit"]["data"])
    assert out["max_num_seqs"] == 8 and out["kv_cache_tokens"] == 200_000
    assert out["request_overhead_ms"] == out["fit"]["overhead_ms"]
    fast, pooled = load_profile(str(fitted)), load_profile(str(merged))
    for n, batch, context in ((1024, 0, 0), (0, 8, 4000), (256, 4, 300)):
        ratio = pooled.step_ms(n, batch, context) / fast.step_ms(n, batch, context)
        assert 1.2 < ratio < 1.8, (n, batch, context, ratio)  # between the two engines


def test_merge_refuses_another_engine_in_one_line(fitted: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(fitted.read_text())
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**doc, "max_num_seqs": 16}))
    proc = run_cli("profile", "--merge", str(fitted), "--merge", str(other), "--out",
                   str(tmp_path / "m.yaml"))  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"--merge {other}: max_num_seqs 16 but {fitted} has 8: merge only profiles of one "
        "engine, started with the same limits"
    )
    shipped = REPO / "reference_scheduler" / "profiles" / "h100-llama3-8b.yaml"
    proc = run_cli("profile", "--merge", str(fitted), "--merge", str(shipped), "--out",
                   str(tmp_path / "m.yaml"))  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "no probe data (fit.data)" in proc.stderr
    proc = run_cli("profile", "--merge", str(fitted), "--target-url", "http://127.0.0.1:1",
                   "--out", str(tmp_path / "m.yaml"))  # fmt: skip
    assert proc.returncode == 2 and "drop --target-url" in proc.stderr
    assert not (tmp_path / "m.yaml").exists()


def test_unreachable_engine_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = run_cli("profile", "--target-url", url, "--out", str(tmp_path / "p.yaml"), timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "connection refused" in lines[0] and "--target-url" in lines[0]
    assert not (tmp_path / "p.yaml").exists()


def test_not_a_url_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("profile", "--target-url", "localhost:8000", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "--target-url localhost:8000: not an http(s) URL; e.g. http://127.0.0.1:8000"
    )


def refusing_server() -> web.Application:
    """Lists a model, then answers every completion with 400 (a server that refuses)."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 1024}]})

    async def completions(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no"}}, status=400)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def test_engine_refusing_the_probe_is_one_line(tmp_path: Path) -> None:
    with serve_in_thread(refusing_server()) as url:
        proc = run_cli("profile", "--target-url", url, "--out", str(tmp_path / "p.yaml"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the probe (HTTP 400" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


VLLM_METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_cpu_blocks="None",num_gpu_blocks="4096"} 1.0
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""  # noqa: E501


def test_reads_what_vllm_says_about_itself() -> None:
    assert cache_config(VLLM_METRICS)["num_gpu_blocks"] == "4096"
    assert cache_config("scheduler_queue_depth 0\n") == {}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny", "max_model_len": 2048}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=VLLM_METRICS)

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.9.9"})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version)

    async def main() -> None:
        async with serve(app) as url:
            info = await engine_info(url, None, {})
        assert (info.model, info.version, info.max_model_len) == ("tiny", "0.9.9", 2048)
        assert info.kv_cache_tokens == 16 * 4096
        assert info.source["num_gpu_blocks"] == "/metrics cache_config_info"

    asyncio.run(main())


def test_the_charge_search_bounds_and_refusals() -> None:
    """The per-request charge that makes a simulated burst as long as the measured one: found
    where the makespan crosses, floored below (a burst faster than the steps is noise), capped
    above, and refused where no charge moves the simulated burst."""
    from fairbench.targets.profile import LEAST_MS, MOST_MS, _charge_for

    def line(x: float) -> float:
        return 100.0 + 15.0 * x  # 15 requests charged, one after another

    assert _charge_for(line, 160.0) == pytest.approx(4.0, abs=0.01)
    assert _charge_for(line, 190.0) == pytest.approx(6.0, abs=0.01)
    assert _charge_for(line, 85.0) == pytest.approx(-1.0)  # by the slope, below 0
    assert _charge_for(line, 0.0) == LEAST_MS  # floored: one odd burst cannot outweigh
    assert _charge_for(line, 100.0 + 15.0 * 1000) == MOST_MS
    assert _charge_for(lambda x: 100.0, 160.0) is None  # the simulated engine never queued
    assert _charge_for(lambda x: None, 160.0) is None  # it could not serve the burst


def test_a_merge_without_load_bursts_carries_no_front_end(fitted: Path, tmp_path: Path) -> None:
    """Profiles whose data have no load or idle phase (written before them, or probed with
    --load-requests 0 --idle-reps 0): the merged profile does not keep a front end or a wake
    its data cannot back; and a load row that cannot be replayed is one line, not a
    traceback."""
    doc = yaml.safe_load(fitted.read_text())
    old = copy.deepcopy(doc)
    old["fit"]["data"] = [r for r in old["fit"]["data"] if r["kind"] not in ("load", "idle")]
    old["front_end_core_ms"] = 3.0
    old["fit"]["front_end"] = {"core_ms": 3.0}
    old["idle_wake_ms"] = 3.0
    old["fit"]["idle"] = {"wake_ms": 3.0}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    merged = tmp_path / "merged.yaml"
    proc = run_cli("profile", "--merge", str(path), "--merge", str(path), "--out", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = yaml.safe_load(merged.read_text())
    assert out["front_end_core_ms"] == 0.0 and "front_end" not in out["fit"]
    assert out["idle_wake_ms"] == 0.0 and "idle" not in out["fit"]
    # with its idle rows, a merge refits the wake from them (a pair's difference may be < 0)
    pooled = copy.deepcopy(doc)
    idle_rows = [r for r in pooled["fit"]["data"] if r["kind"] == "idle"]
    for r, ms in zip(idle_rows, (-1.0, 5.0, 7.0, 9.0), strict=False):
        r["ms"] = ms
    path.write_text(yaml.safe_dump(pooled))
    proc = run_cli("profile", "--merge", str(path), "--out", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = yaml.safe_load(merged.read_text())
    want = float(np.median([r["ms"] for r in idle_rows]))
    assert out["idle_wake_ms"] == pytest.approx(max(0.0, want), abs=1e-3), out["fit"]["idle"]
    bad = copy.deepcopy(doc)
    next(r for r in bad["fit"]["data"] if r["kind"] == "load")["gap_ms"] = -1.0
    path.write_text(yaml.safe_dump(bad))
    proc = run_cli("profile", "--merge", str(path), "--out", str(merged))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "load burst it cannot replay" in proc.stderr, proc.stderr
