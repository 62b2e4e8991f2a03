"""The designed experiment: prefill sweep, decode sweep, mixed steps and load, on a live engine.

Orchestration of the phases; imports the client, detection and the values.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from fairbench.targets.profile.client import (
    Client,
)
from fairbench.targets.profile.model import (
    ARRIVAL_SPACING,
    ARRIVAL_WINDOW,
    Observation,
    ProbeDesign,
    Progress,
    Stream,
)

# ---------------------------------------------------------------- the experiment


def steady_gap(streams: Sequence[Stream]) -> tuple[float, float] | None:
    """(median gap in ms, mean tokens generated) over the stretch where every stream decodes:
    after the last first token, up to the first last token."""
    if any(len(s.token_ns) < 3 for s in streams):
        return None
    start = max(s.token_ns[0] for s in streams)
    end = min(s.token_ns[-1] for s in streams)
    gaps, made = [], []
    for s in streams:
        t = np.array(s.token_ns, dtype=np.int64)
        inside = np.flatnonzero((t > start) & (t <= end))
        inside = inside[inside >= 1]
        if len(inside):
            gaps.extend((t[inside] - t[inside - 1]).tolist())
            made.append(float(np.median(inside)))
    if len(gaps) < 2:
        return None
    return float(np.median(gaps)) / 1e6, float(np.mean(made))


def gap_at(streams: Sequence[Stream], at_ns: int, sent_ns: int | None = None) -> float | None:
    """The step that delivered the event at `at_ns`, in ms: per decode stream, the token
    delivered with it (the nearest arrival) is token k, the step ends at the first of the two
    (t_k or `at_ns`), and it is read from t_(k−2), less the stream's median decode gap before
    the window; the median over streams. Two gaps, not one: a token stamped late (the client or
    server busy with the arriving request) would shorten one gap and lengthen the next, and
    over the two the lateness cancels. With `sent_ns` (when the request was sent), the window
    starts at the gap it was sent in if that is earlier, less one median gap for each gap
    before the step: then it holds whatever the arrival cost the steps before the engine took
    it in, as the arrival phase's window does (`arrival_costs`), and taking the one out of the
    other leaves the step. Why: the CPU vLLM's API server tokenises a prompt on the engine's
    core before its engine sees it, over the steps before the mixed one (the arrival phase read
    3.4-12 ms; the mixed step's two gaps held about 0-2 ms of it), so the arrival phase's whole
    cost taken out of two gaps went below the step (`a` 1.37 ms a probe against 2.75, medians;
    `b` halved in one merge), and the fidelity test's twins ran fast; the reference server
    charges the step after the arrival, inside the two gaps either way."""
    steps = []
    for s in streams:
        t = np.array(s.token_ns, dtype=np.int64)
        if len(t) < 5:
            continue
        k = int(np.argmin(np.abs(t - at_ns)))
        if k < 4:
            continue
        start = k - 2
        if sent_ns is not None:  # the token before it was sent: the gap it was sent in
            start = min(start, int(np.searchsorted(t, sent_ns, side="right")) - 1)
        if start < 2:
            continue
        before = float(np.median(np.diff(t[: start + 1])))
        window = float(min(t[k], at_ns) - t[start])
        steps.append(window - (k - start - 1) * before)
    return float(np.median(steps)) / 1e6 if steps else None


def mixed_points(
    read: Sequence[tuple[Observation, Observation | None]], arrivals_measured: bool
) -> list[Observation]:
    """The mixed steps of a round, each read over its two gaps and (None where not read so)
    from the gap its prompt was sent in (`gap_at`): the latter where the round's arrival phase
    measured what an arrival costs, since the fit takes that out of the mixed steps and only
    the wider window holds all of it; else the two gaps, which the fit uses as they are (as
    for a profile without the phase: an engine that admitted the arrivals, or no window)."""
    return [wide if arrivals_measured and wide is not None else two for two, wide in read]


def arrival_costs(streams: Sequence[Stream], sent_ns: Sequence[int]) -> list[float | None]:
    """What each request sent at `sent_ns` (ms) added to the full batch's decode steps while it
    waited: per decode stream, the ARRIVAL_WINDOW gaps from the one it was sent in, less as
    many of the median of the gaps either side of them (ARRIVAL_WINDOW before and after, in
    no window, where every stream decodes); the median over streams (None where no stream
    holds its whole window and a gap either side). Why a window of gaps and not one: a token
    stamped late by the client shortens the next gap as it lengthens its own, and a sum over
    the window cancels it. Why the gaps either side, not the batch's median gap: each step adds
    the batch's tokens to the context, so the gaps grow (the reference server: 0.03 ms a step),
    and the first arrival, read against the middle's gap, came out 0.5-0.75 ms low; the gaps
    either side of it lie as far above the line as below."""
    start = max(s.token_ns[0] for s in streams)
    end = min(s.token_ns[-1] for s in streams)
    per: list[list[float]] = [[] for _ in sent_ns]
    for s in streams:
        t = np.array(s.token_ns, dtype=np.int64)
        gaps = np.diff(t)  # gaps[i]: the step that ended with token i + 1
        steady = (t[:-1] >= start) & (t[1:] <= end)
        windows = []
        for at in sent_ns:
            first = int(np.searchsorted(t, at, side="right")) - 1  # the gap it was sent in
            windows.append(range(first, first + ARRIVAL_WINDOW))
        outside = steady.copy()
        for w in windows:
            outside[[i for i in w if 0 <= i < len(gaps)]] = False
        for k, w in enumerate(windows):
            if not (w.start >= 0 and w.stop <= len(gaps) and steady[w.start : w.stop].all()):
                continue
            near = range(w.start - ARRIVAL_WINDOW, w.stop + ARRIVAL_WINDOW)
            before = [i for i in near if 0 <= i < w.start and outside[i]]
            after = [i for i in near if w.stop <= i < len(gaps) and outside[i]]
            if before and after:
                base = float(np.median(gaps[before + after]))
                per[k].append(float(gaps[w.start : w.stop].sum()) - ARRIVAL_WINDOW * base)
    return [float(np.median(v)) / 1e6 if v else None for v in per]


def load_gap_ms(obs: Sequence[Observation], prompt: int, output: int, batch: int) -> float:
    """How far apart the load phase sends its requests: 0.6 of what one request costs the
    engine by this round's observations (the prefill of the nearest length, then its decode
    steps shared by a full batch). The engine is asked for about 1.7 of its capacity, so a
    queue builds from the start and the makespan is the burst's work, not its last send."""
    prefills = [o for o in obs if o.kind == "prefill"]
    decodes = [o for o in obs if o.kind == "decode"]
    if not prefills or not decodes:
        return 0.0
    ttft = min(prefills, key=lambda o: abs(o.n - prompt)).ms
    full = max(o.batch for o in decodes)
    step = float(np.median([o.ms for o in decodes if o.batch == full]))
    return 0.6 * (ttft + (output - 1) * step / max(1, min(batch, full)))


def context_at(streams: Sequence[Stream], at_ns: int) -> int:
    """The decode batch's context tokens at `at_ns`: each 32-token stream's prompt (as the
    server counted it) plus the tokens it had made by then, summed."""
    made = np.mean([sum(1 for t in s.token_ns if t <= at_ns) for s in streams])
    prompt = int(np.mean([s.prompt_tokens or 32 for s in streams]))
    return round(len(streams) * (prompt + made))


async def one_round(
    client: Client, design: ProbeDesign, key: int, say: Progress
) -> list[Observation]:
    """The phases once: every prefill length (`prefill_reps` times), every decode
    configuration, every mixed step, the arrivals, the load, the idle pairs."""
    obs: list[Observation] = []
    lengths = design.prefill_lengths()
    configs = [
        (b, p)
        for p in design.decode_prompts()
        for b in design.batches()
        if design.fits_kv(b, p, design.decode_tokens)
    ]
    batch = max(1, min(design.mixed_batch, max(design.batches()) - 1))
    tokens = 3 * design.decode_tokens
    mixed = [
        min(n, design.longest_prompt())
        for n in design.mixed_prompts
        if n + batch <= design.max_num_batched_tokens
        and design.fits_kv(batch + 1, max(n, 32), tokens)
    ]
    # the arrival phase: a full batch of decodes, and the mixed points' prompts arriving while
    # no slot is free (an engine that does not say its max_num_seqs and was not told: none)
    full = design.max_num_seqs
    arrive = design.arrival_tokens(len(mixed))
    queued = mixed if max(design.batches()) == full and design.fits_kv(full, 32, arrive) else []
    _, load_prompt, load_output = design.load_shape()  # the longest prompt, for the checks
    burst = design.burst()
    running = min(burst, design.max_num_seqs)  # at most this many hold KV at once
    load = burst > 0 and design.fits_kv(running, load_prompt, load_output)
    idle_prompt = min(design.idle_prompt, design.longest_prompt())
    total = (
        len(lengths) * design.prefill_reps + len(configs) + len(mixed) + int(bool(queued))
        + int(load)
        + design.idle_reps
    )  # fmt: skip
    done = 0

    def step(phase: str) -> None:
        nonlocal done
        done += 1
        say(f"round {key + 1}: {phase}", done, total)

    for _ in range(design.prefill_reps):
        for n in lengths:
            s = await client.stream(n, 1)
            prompt = int(s.prompt_tokens or n)
            ttft = (s.token_ns[0] - s.sent_ns) / 1e6
            obs.append(Observation("prefill", prompt, 0, 0, ttft, f"prefill {n}"))
            step("prefill")
    for batch_, prompt in configs:
        streams = await asyncio.gather(
            *(client.stream(prompt, design.decode_tokens) for _ in range(batch_))
        )
        found = steady_gap(streams)
        if found is not None:
            gap, made = found
            real_prompt = int(np.mean([s.prompt_tokens or prompt for s in streams]))
            context = round(batch_ * (real_prompt + made))
            obs.append(Observation("decode", 0, batch_, context, gap, f"decode {batch_}x{prompt}"))
        step("decode")
    # each mixed step read both ways (`gap_at`): from the gap its prompt was sent in, which
    # holds what the arrival cost the steps before the engine took it in, kept where this
    # round's arrival phase measured that cost (the fit takes it out); else the two gaps alone
    read: list[tuple[Observation, Observation | None]] = []
    for n in mixed:
        live = [Stream(0) for _ in range(batch)]
        decoders = [asyncio.create_task(client.stream(32, tokens, s)) for s in live]
        # the long prompt arrives once they all decode, a third of the way through their output
        await _until(live, tokens // 3, decoders)
        long = await client.stream(n, 1)
        streams = await asyncio.gather(*decoders)
        at = long.token_ns[0]
        gap = gap_at(streams, at)
        if gap is not None:
            point = Observation(
                "mixed", int(long.prompt_tokens or n), batch, context_at(streams, at), gap,
                f"mixed {n}+{batch}",
            )  # fmt: skip
            sent = gap_at(streams, at, long.sent_ns) if queued else None
            read.append((point, None if sent is None else replace(point, ms=sent)))
        step("mixed")
    came = await arrivals(client, full, arrive, queued) if queued else []
    if queued:
        step("arrival")
    obs += mixed_points(read, bool(came))
    obs += came
    # the load's requests are sent one after another, a little faster than this round's steps
    # say the engine serves them: a queue builds, so every request after the first arrives at
    # a busy engine, spread over its steps as a live run's arrivals are
    prompts = design.load_prompts(client.rng) if load else []
    typical = int(np.median(prompts)) if prompts else 0
    spacing = load_gap_ms(obs, typical, load_output, design.max_num_seqs) if load else 0.0
    if load and spacing <= 0:  # no step observed this round: a burst sent at once measures
        step("load")  # another thing
    elif load:
        t0 = time.perf_counter_ns()

        async def send(i: int) -> Stream:
            await asyncio.sleep(max(0.0, t0 + i * spacing * 1e6 - time.perf_counter_ns()) / 1e9)
            return await client.stream(prompts[i], load_output)

        streams = await asyncio.gather(*(send(i) for i in range(burst)))
        sent = np.array([s.sent_ns for s in streams], dtype=np.int64)
        gap_ms = float(np.diff(sent).mean()) / 1e6 if burst > 1 else 0.0
        makespan = (max(s.token_ns[-1] for s in streams) - int(sent[0])) / 1e6
        # the prompts as the engine counted them (its tokenizer, not the words asked for)
        real = tuple(int(s.prompt_tokens or n) for s, n in zip(streams, prompts, strict=True))
        # what the engine made, not what was asked (TGI takes no ignore_eos: an EOS ends early)
        made = round(float(np.median([s.completion_tokens or len(s.token_ns) for s in streams])))
        low, high, _ = design.load_shape()
        shape = f"{low}" if low == high else f"{low}-{high}"
        point = f"load {burst}x{shape}+{load_output}"
        n_real = round(float(np.median(real)))
        obs.append(Observation("load", n_real, burst, max(1, made), makespan, point, gap_ms, real))
        step("load")
    for _ in range(design.idle_reps):
        # the quiet, then the request that finds the engine idle, then its twin at once
        await asyncio.sleep(design.idle_gap_ms / 1000)
        woken = await client.stream(idle_prompt, 1)
        warm = await client.stream(idle_prompt, 1)
        extra = (woken.token_ns[0] - woken.sent_ns - (warm.token_ns[0] - warm.sent_ns)) / 1e6
        n_real = int(woken.prompt_tokens or idle_prompt)
        obs.append(
            Observation("idle", n_real, 0, 0, extra, f"idle {idle_prompt}", design.idle_gap_ms)
        )
        step("idle")
    return obs


async def arrivals(
    client: Client, full: int, tokens: int, prompts: Sequence[int]
) -> list[Observation]:
    """The arrival phase: `full` (the engine's max_num_seqs) streams of 32-token prompts and
    `tokens` output tokens, and once they all decode, each of `prompts` sent (`max_tokens=1`)
    ARRIVAL_SPACING steps after the one before. No slot is free, so each waits, and what it
    adds to the decode steps it arrives among is its front end alone (`arrival_costs`): the
    server parsing and tokenising it, and whatever an engine charges an arrival, with no
    prefill in the step. An arrival whose first token came before the decodes ended was
    admitted (the engine takes more than it said), and is left out."""
    live = [Stream(0) for _ in range(full)]
    decoders = [asyncio.create_task(client.stream(32, tokens, s)) for s in live]
    waiting: list[tuple[Stream, asyncio.Task[Stream]]] = []
    for i, n in enumerate(prompts):
        await _until(live, 3 + i * ARRIVAL_SPACING, decoders)
        out = Stream(0)
        waiting.append((out, asyncio.create_task(client.stream(n, 1, out))))
    # one gather for both, so a request that fails leaves none of the others running
    done = await asyncio.gather(*decoders, *(task for _, task in waiting))
    streams = done[:full]
    ended = min(s.token_ns[-1] for s in streams)
    costs = arrival_costs(streams, [out.sent_ns for out, _ in waiting])
    obs = []
    for n, (out, _), ms in zip(prompts, waiting, costs, strict=True):
        if ms is None or out.token_ns[0] < ended:
            continue
        n_real = int(out.prompt_tokens or n)
        context = context_at(streams, out.sent_ns)
        obs.append(Observation("arrival", n_real, full, context, ms, f"arrival {n}"))
    return obs


async def probe(
    client: Client, design: ProbeDesign, progress: Progress | None = None
) -> tuple[list[Observation], int, bool]:
    """Rounds of the experiment while the budget lasts: a round is started only if another
    as long as the longest so far still fits (at least one round runs), up to `max_rounds`.
    Returns the observations, the rounds run, and whether the budget stopped them."""
    t0 = time.monotonic()
    say = progress or (lambda phase, done, total: None)
    await client.calibrate()
    obs: list[Observation] = []
    longest = 0.0
    rounds = 0
    while rounds < design.max_rounds:
        elapsed = time.monotonic() - t0
        if rounds and elapsed + longest > design.budget_s:
            return obs, rounds, True
        started = time.monotonic()
        obs += await one_round(client, design, rounds, say)
        longest = max(longest, time.monotonic() - started)
        rounds += 1
    return obs, rounds, False


async def _until(live: list[Stream], tokens: int, tasks: list[asyncio.Task[Stream]]) -> None:
    """Poll every 2 ms until each of `live` has `tokens` tokens (or a task ended: it raised,
    or the engine was fast)."""
    while not all(len(s.token_ns) >= tokens for s in live) and not any(t.done() for t in tasks):
        await asyncio.sleep(0.002)
