"""`fairbench profile`: fit the simulator's cost profile from a live engine.

A simulated sweep predicts a deployment only if its profile is that engine's. This module runs
a designed, bounded experiment against any OpenAI-compatible server (`/v1/completions`,
streamed) and fits the cost model's existing coefficient form
(reference_scheduler.core.costmodel):

    prefill_ms(n)       = max(floor, a + b·n + c·n²)
    decode_step_ms(B,C) = max(d + e·B, a + b·B) + f·C
    mixed step          = max(d + e·B, max(floor, a + b·(n + B) + c·n²)) + f·C

The experiment, one phase at a time (nothing else should load the engine meanwhile):

1. **Prefill sweep.** One request at a time, `max_tokens=1`, prompt lengths spaced
   geometrically up to the model's context (and the per-step token budget, so a prompt is one
   step). Observed: the time to the first token, which is `overhead + prefill_ms(n)`; where
   the shortest prompts' times sit level, that level less the overhead is the step `floor`
   (fitted, started from the best split of the sweep into a level and a curve, only where the
   sweep identifies it, `fit.floor_test`: two lengths or more on the level, above the curve
   fitted to the other lengths by more than their noise, and the level predicting each length
   left out better than the curve alone; else the floor is 0);
   `overhead` (HTTP, tokenisation, the API server) is fitted as its own term — it is not a step
   cost — and written as the profile's `request_overhead_ms`, by which the `sim` target delays
   each request's arrival at the simulated engine (so a simulated TTFT contains it as a
   measured one does).
2. **Decode sweep.** B concurrent streams (B = 1, 2, 4, … up to `max_num_seqs`) at a short and
   a long prompt, `ignore_eos` so each produces its tokens. Once all B decode, each step emits
   one token per stream: the median gap between a stream's tokens there is
   `decode_step_ms(B, C)`, C the batch's context at the middle of that stretch. Gaps are
   measured between tokens on the client, so no request overhead is in them.
3. **Mixed steps.** While B streams decode, one long prompt arrives (`max_tokens=1`). The
   decode streams' gap that ends with its first token is the mixed step: its prefill chunk and
   the B decode tokens in one pass, read up to the first output of the step (the long
   prompt's token or the decodes', whichever the client saw first: a server that finishes the
   long request before it writes the decodes' tokens stamps them late; vLLM writes the decodes'
   first, and this changes nothing there). Where the arrival phase runs, the window starts at
   the gap the long prompt was sent in, so it holds what its arrival cost the steps before the
   engine took it in, as the arrival phase's window does. This is what separates `a` from the
   request overhead.
4. **Arrivals.** `max_num_seqs` streams decode (no slot free), and each mixed step's prompt
   is sent among them, ARRIVAL_SPACING steps apart (`max_tokens=1`: each waits for a slot).
   Observed: what the ARRIVAL_WINDOW decode gaps from the one it was sent in took beyond as
   many of the median of the gaps either side of them (`probe.arrival_costs`). That is the
   arrival's front end alone (the server parsing and tokenising it, whatever the engine
   charges an arrival), with no prefill in the step;
   the mixed steps carry it too, since their long prompt arrives at a busy engine, so the fit
   takes it out of them (`fit.arrival` in the profile: a line in the prompt's length). Left in,
   it went to `a`, which every prefill pays, busy engine or not. Skipped where the decode
   batches probed stop short of `max_num_seqs` (the engine did not say it and was not told).
5. **Load.** A burst of `load_requests` streamed requests shaped like a workload's
   (`load_prompt` prompt tokens, or spread evenly from `load_prompt` to `load_prompt_to` in a
   shuffled order, and `load_output` output tokens each: give your workload's typical request
   and the range of its prompts), sent one after another 0.6 of a request's cost apart
   (`load_gap_ms`), so a queue builds and the engine runs full batches while requests keep
   arriving between its steps, as a live run's do. Observed: the burst's makespan, from the
   first send to the last token. Each request's HTTP parsing, tokenisation and streaming take
   core time; where the API server shares the engine's cores (a CPU engine) that time is taken
   from the steps, and it grows with the prompt and the streamed tokens, which is why this
   phase uses the workload's shape: small one-token requests beside a decoding batch (this
   phase's first form) measured 0.0–0.9 ms on the CPU vLLM, while under a live workload its
   API server took 0.22 of the core against 0.14 during the probe (docs/simulator.md); why
   arrivals are spread over the steps, not sent at once (a burst sent at once ran faster than
   the fitted steps predict); and why the prompts span the workload's range (the same engine,
   four bursts of each: 0.6–0.8 ms per request with every prompt at 512 tokens, 2.0–2.4 ms
   with prompts of 300–800, whose mixed steps cost more than the fit says at the short end).
   After the fit, the same burst (each request's prompt as the engine counted it) is
   simulated with vLLM's scheduling on the fitted steps, and the front-end charge per request
   that makes the simulated makespan the measured one is one estimate; their median (at
   least 0) is the profile's `front_end_core_ms`, which the simulated engines charge to the
   steps of a busy engine per arriving request (costmodel says how). Where the API server has
   cores of its own (a GPU engine's host) it comes out near 0. It measures on a burst what the
   arrival phase measures on one request (and the streaming besides): the profile's
   `fit.arrival.cost_ms` beside it.
6. **Idle.** `idle_reps` times: quiet for `idle_gap_ms` (250 ms), a short prompt
   (`max_tokens=1`), then the same length again at once. Observed: the first one's time to
   its first token less the second's. Every other phase sends back to back, but a live run's
   lone request (a chat between two bursts) finds the engine idle, and an engine that idled
   may take longer to start: the CPU vLLM on one core took about 3 ms more after 100 ms of
   quiet than after 30 ms or less (why is not established: reference_scheduler's costmodel).
   The median difference (at least 0) is the profile's `idle_wake_ms`, which the simulated
   engines charge to the step that starts a request finding them idle for `idle_after_ms`
   (costmodel says how).

The six phases are one round; rounds repeat while the budget lasts (a round starts only if
one as long as the longest so far still fits; `max_rounds` at most), and the fit takes the
median of each design point over the rounds, so one slow round (a neighbour's burst, a late
wake) does not move it. Prompts are distinct random words (an engine's prefix cache must not
make a prefill free); their token counts are what the server reports in `usage`, not what was
asked. The fit is
`scipy.optimize.least_squares` on relative residuals with a soft-L1 loss (an outlier that
survives the median is not a trend), coefficients ≥ 0, started from the linear fits of
each phase; each coefficient's standard error comes from the Jacobian at the solution.

**Which engine, and what it says about itself.** `--engine auto` (the default) asks the server:
SGLang answers `GET /get_server_info`, TGI `GET /info`, vLLM `GET /version` (tried in that
order, all at once; a server that answers none is `openai`, and nothing but `/v1/models` and
`/metrics` is read from it). What each self-description gives, field names checked in the
engines' source:

- vLLM: `/metrics` `vllm:cache_config_info` (block size × GPU blocks → `kv_cache_tokens`),
  `/v1/models` (`max_model_len`), `/version`.
- SGLang (sgl-project/sglang `python/sglang/srt/entrypoints/http_server.py`,
  `get_server_info`: the `ServerArgs` dataclass of `srt/server_args.py`, the scheduler's
  `get_init_info` of `srt/managers/scheduler.py`, and `version`): `max_total_num_tokens` (the
  KV pool, in tokens) → `kv_cache_tokens`; `max_running_requests` → `max_num_seqs`;
  `chunked_prefill_size` (−1 or null: chunking off) → `max_num_batched_tokens`, else
  `max_prefill_tokens`; `context_length`, else `/v1/models` `max_model_len` (SGLang's
  `available_models` reports the model's context there) → `max_model_len`;
  `max_req_input_len` → the longest prompt; `version`. A server started with
  `--stream-interval` above 1 streams several tokens per chunk, so its gaps are not steps: the
  probe refuses it.
- TGI (huggingface/text-generation-inference `router/src/lib.rs` `struct Info`, served by
  `router/src/server.rs` `get_model_info`): `max_total_tokens` (prompt + output per request) →
  `max_model_len`; `max_input_tokens` (`max_input_length` before v2.1) → the longest prompt;
  `max_batch_total_tokens` (in `/info` up to v2.2; removed with the v3 router) →
  `kv_cache_tokens`; `max_batch_size` (same versions) → `max_num_seqs`;
  `max_concurrent_requests` (the router's limit on requests in flight) caps the decode batches
  probed; `model_id`; `version`.

The probe's requests go to the engine's OpenAI-compatible `/v1/completions`, streamed: SGLang's
(`srt/entrypoints/openai/serving_completions.py`) takes `ignore_eos`, `min_tokens` and
`stream_options.include_usage` as vLLM's does. TGI's (`router/src/server.rs` `completions`,
`CompletionRequest` of `lib.rs`) reads `model`, `prompt`, `max_tokens`, `temperature`, `stream`
and nothing else (serde ignores the rest; `model` other than `tgi` is taken as a LoRA adapter
id, so the probe sends `tgi`): there is no `ignore_eos`, so a stream may end early at EOS (a
decode stream with fewer than 3 tokens is left out of its step). Its stream is one event per
token, `finish_reason` "" until the last, and the last event carries `usage` (prompt and
completion tokens from the generation's details) whatever `stream_options` says; a token is
counted per event, as its chunks say.

The package, one job per module: model (the values), client (HTTP), detect (which engine,
its limits), probe (the experiment), fit (the coefficients), load (arrival cost, idle wake,
burst, front-end core), emit (the profile document, the whole run), merge (several probes
into one fit), files (the YAML written and read), command (what `fairbench profile` checks
and prints).
"""

from __future__ import annotations

from fairbench.targets.profile.client import (
    Client,
    _get,
)
from fairbench.targets.profile.detect import (
    _CACHE_INFO,
    _int,
    apply_engine,
    cache_config,
    detect,
    engine_info,
    read_sglang,
    read_tgi,
)
from fairbench.targets.profile.emit import (
    profile_document,
    run_profile,
)
from fairbench.targets.profile.fit import (
    Fit,
    Limits,
    _start,
    fit_form,
    medians,
    predict,
    row,
)
from fairbench.targets.profile.load import (
    LEAST_MS,
    MOST_MS,
    _charge_for,
    _median_of,
    burst_makespan_ms,
    fit,
    front_end_core,
    idle_wake,
)
from fairbench.targets.profile.merge import (
    MERGE_DESIGN,
    MERGE_ENGINE,
    MERGE_LIMITS,
    MergeError,
    _observation,
    merge_profiles,
    probe_data,
)
from fairbench.targets.profile.model import (
    COEFFICIENTS,
    ENGINES,
    PROBE_BATCH_FROM_ENGINE,
    REQUEST_TIMEOUT_S,
    EngineInfo,
    Observation,
    ProbeDesign,
    ProbeError,
    ProbeResult,
    Progress,
    Stream,
)
from fairbench.targets.profile.probe import (
    _until,
    context_at,
    gap_at,
    load_gap_ms,
    one_round,
    probe,
    steady_gap,
)

__all__ = [
    "COEFFICIENTS",
    "ENGINES",
    "LEAST_MS",
    "MERGE_DESIGN",
    "MERGE_ENGINE",
    "MERGE_LIMITS",
    "MOST_MS",
    "PROBE_BATCH_FROM_ENGINE",
    "REQUEST_TIMEOUT_S",
    "_CACHE_INFO",
    "Client",
    "EngineInfo",
    "Fit",
    "Limits",
    "MergeError",
    "Observation",
    "ProbeDesign",
    "ProbeError",
    "ProbeResult",
    "Progress",
    "Stream",
    "_charge_for",
    "_get",
    "_int",
    "_median_of",
    "_observation",
    "_start",
    "_until",
    "apply_engine",
    "burst_makespan_ms",
    "cache_config",
    "context_at",
    "detect",
    "engine_info",
    "fit",
    "fit_form",
    "front_end_core",
    "gap_at",
    "idle_wake",
    "load_gap_ms",
    "medians",
    "merge_profiles",
    "one_round",
    "predict",
    "probe",
    "probe_data",
    "profile_document",
    "read_sglang",
    "read_tgi",
    "row",
    "run_profile",
    "steady_gap",
]
