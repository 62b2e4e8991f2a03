"""GPU cost profiles: how long one engine iteration takes.

    prefill_ms(n)        = max(floor, a + b·n + c·n²)                     n prefill tokens
    decode_step_ms(B, C) = max(d + e·B, a + b·B) + f·C                    B sequences, C context
    mixed step (chunked prefill, n > 0 and B > 0):
                           max(d + e·B, max(floor, a + b·(n + B) + c·n²)) + f·C

With `mixed_step: sum` a mixed step costs its decode step plus its prefill chunk instead:
                           max(d + e·B, a + b·B) + max(floor, a + b·n + c·n²) + f·C
— what a CPU engine measures (`fairbench profile` of the CPU vLLM: a 256-token chunk beside 3
decodes cost 34 ms where the max form said 22 and the sum 36), since a CPU has no memory-bound
stretch for the chunk to hide in. The default, `max`, is the GPU picture below.

The decode step is the slower of a memory-bound term (weights read once per step, d, plus a
per-sequence cost e) and a compute-bound term (the same linear-in-tokens cost as prefill), plus
attention reading the KV cache (f per context token). A mixed step processes its prefill chunk's
n tokens and the B decode tokens in one pass, so the compute term sees n + B tokens. This is the
Sarathi/vLLM chunked-prefill picture; it reduces to the two pure forms at n = 0 and B = 0.

Textbook reductions are configuration, not code: `constant_step_ms` makes every step cost the
same whatever the batch (with max_num_seqs = 1 the engine is then a single server whose service
time is output_tokens × step), and all-zero prefill coefficients make prefill free.

`request_overhead_ms` is not a step cost: it is the time a request spends outside the engine's
steps on its way to its first token — the client's send, HTTP, tokenisation and the API
server — which every measured TTFT contains (`fairbench profile` fits it as its own term,
`overhead`). The `sim` target delays each request's arrival at the simulated engine by it, so
a simulated TTFT and E2E contain it as a real one does (fairbench/targets/sim.py). The shipped
profiles leave it 0: their sources publish step costs, not a front end's.

`front_end_core_ms` is the part of that front end that runs on the engine's own processor:
the core time one request's HTTP parsing, tokenisation and response handling take away from the
engine's steps. A GPU engine's API server runs on host cores its steps do not wait for (about
0); a CPU engine's shares the cores that compute the steps, so every request that arrives while
the engine is busy slows the steps of every request it is running. The simulated engines charge
it so: a request arriving while the engine runs others adds `front_end_core_ms` to the
engine's next step (the reference engine with several replicas, where a request's replica is
known only when it is admitted: to the replica that admits it, if that one ran others).
`fairbench profile` measures it (its load phase: the charge per arriving request that makes a
simulated burst of workload-shaped requests, sent faster than the engine serves them, as long
as the measured one). On the CPU vLLM on one core, with requests of 512 prompt and 48 output
tokens, it measured 0–2.5 ms (median about 1 ms; seven probes of one test, 2026-12-02), and
with the prompts spread over 300–800 tokens, as the fidelity test's flood sends them, 1.3–2.5
ms over each test's probes merged (seven tests): those bursts' short prompts cost the fitted
mixed steps more than the fit says, and the charge carries that too. The phase's first form,
small one-token requests beside a decoding batch, measured 0.0–0.9 ms.
The probe's mixed steps pay a new request's front end too (their long prompt arrives at a busy
engine), and it once landed in the prefill constant `a` (1.7 ms of the CPU engine's sum-form
`a`; against the reference server charging 6 ms per arrival, `a` read 8.9 for 8), which every
prefill pays, busy engine or not. The probe's arrival phase now measures it apart (requests
that arrive at a full batch and wait: their steps hold no prefill) and takes it out of the
mixed steps, read from the gap their prompt was sent in (the CPU vLLM's API server tokenises a
prompt on the engine's core over the steps before its engine takes it in: 3.4-12 ms a probe),
so it is charged here and `a` is the step's own.

`idle_wake_ms` is what an engine that has been idle pays to start again: the first step after
`idle_after_ms` or more with nothing to run is that much longer. A CPU vLLM on one core takes
about 3 ms more to a request's first token after 100 ms or more of quiet than back to back
(measured 2026-12-02: 4.3 ms at gaps of 3–30 ms, 6.9 ms at 100 ms, 7.5 ms at 500 ms, 78-token
prompts, one token; 7.5–7.8 ms at 0.7–2.5 s), where a live run's lone chat request between
two bursts finds it. Why it costs that is not established (vLLM's model worker busy-polls its
shared-memory queue for a second after its last read and then waits on a socket,
`distributed/device_communicators/shm_broadcast.py` `SpinCondition`, which does not explain a
cost from 100 ms on; the engine's three processes share one core with the
other engine's), and it comes and goes: probes of one engine minutes apart measured 0 or
2–3 ms. The simulated engines charge it so: a request arriving at an engine with nothing
running or waiting, whose last step ended `idle_after_ms` or longer ago (or that never ran),
adds `idle_wake_ms` to the step that starts it (several replicas: to the replica that admits
it). `fairbench profile` measures it (its idle phase: a request after 250 ms of quiet, then
the same-length request back to back; the median difference). The threshold is not probed:
50 ms lies between the gaps that paid nothing and those that paid all of it.

Profiles are data: one YAML file each in `profiles/`, with their sources; users add their own
(`profile: path/to/file.yaml` or an inline mapping).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

PROFILE_DIR = Path(__file__).parents[1] / "profiles"


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    a: float = 0.0
    b: float = 0.0
    c: float = 0.0
    floor: float = 0.0
    d: float = 0.0
    e: float = 0.0
    f: float = 0.0
    kv_bytes_per_token: int = 0
    kv_cache_tokens: int = 0  # tokens of KV cache the engine can hold
    constant_step_ms: float | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    admit_every: int = 1  # admission opportunity every k steps (S-LoRA: 10)
    mixed_step: str = "max"  # max (a GPU: the chunk hides in the decode step) | sum (a CPU)
    request_overhead_ms: float = 0.0  # send → the engine's scheduler sees it (the sim target)
    front_end_core_ms: float = 0.0  # of each request's front end, taken from a busy engine
    idle_wake_ms: float = 0.0  # the first step after the engine idled idle_after_ms or longer
    idle_after_ms: float = 50.0
    source: str = ""

    def step_ms(self, n: int, batch: int, context: int) -> float:
        if self.constant_step_ms is not None:
            return self.constant_step_ms
        if batch == 0:
            if n == 0:
                return 0.0
            return max(self.floor, self.a + self.b * n + self.c * n * n)
        if n and self.mixed_step == "sum":
            decode = max(self.d + self.e * batch, self.a + self.b * batch)
            return decode + max(self.floor, self.a + self.b * n + self.c * n * n) + self.f * context
        compute = self.a + self.b * (n + batch)
        if n:
            compute = max(self.floor, compute + self.c * n * n)
        return max(self.d + self.e * batch, compute) + self.f * context

    def decode_base_ms(self, batch: int) -> float | None:
        """The batch's term of a pure decode step (no prefill, batch >= 1), or None when steps
        cost a constant: `step_ms(0, batch, context) == decode_base_ms(batch) + f * context`,
        bit for bit (the same operations in the same order), so an engine can keep it per
        batch size and pay one multiply and one add per step (issue 35)."""
        if self.constant_step_ms is not None:
            return None
        return max(self.d + self.e * batch, self.a + self.b * batch)

    def step_ns(self, n: int, batch: int, context: int) -> int:
        return int(self.step_ms(n, batch, context) * 1e6)


_FIELDS = {f.name for f in fields(Profile)}


class ProfileError(ValueError):
    pass


def profile_from_mapping(data: Any, where: str = "profile") -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: a profile must be a mapping of coefficients")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ProfileError(f"{where}.{unknown[0]}: not a profile field; fields: {sorted(_FIELDS)}")
    try:
        profile = Profile(**{"name": "custom", **data})
    except TypeError as error:
        raise ProfileError(f"{where}: {error}") from None
    for name in (
        "a", "b", "c", "floor", "d", "e", "f",
        "request_overhead_ms", "front_end_core_ms", "idle_wake_ms", "idle_after_ms",
    ):  # fmt: skip
        value = getattr(profile, name)
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ProfileError(f"{where}.{name}: must be a finite number >= 0, got {value!r}")
    if profile.mixed_step not in ("max", "sum"):
        raise ProfileError(f"{where}.mixed_step: max or sum, got {profile.mixed_step!r}")
    if profile.constant_step_ms is not None and not profile.constant_step_ms > 0:
        raise ProfileError(f"{where}.constant_step_ms: must be > 0")
    if profile.kv_cache_tokens <= 0:
        raise ProfileError(f"{where}.kv_cache_tokens: must be > 0")
    for name in ("max_num_seqs", "max_num_batched_tokens", "admit_every"):
        if not isinstance(getattr(profile, name), int) or getattr(profile, name) < 1:
            raise ProfileError(f"{where}.{name}: must be an integer >= 1")
    return profile


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(spec: str | dict[str, Any], where: str = "profile") -> Profile:
    """A shipped profile by name, a YAML file by path, or an inline mapping."""
    if isinstance(spec, dict):
        return profile_from_mapping(spec, where)
    path = PROFILE_DIR / f"{spec}.yaml"
    if not path.is_file():
        path = Path(spec)
    if not path.is_file():
        raise ProfileError(f"{where}: unknown profile {spec!r}; shipped: {shipped_profiles()}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data.setdefault("name", path.stem)
        data.pop("fit", None)  # how the coefficients were fitted, and the residuals: provenance
    return profile_from_mapping(data, where)


class StepNoise:
    """Multiplicative lognormal noise on step times, mean 1 and coefficient of variation `cv`.

    Each replica has its own stream, refilled 4,096 draws at a time from the engine's one
    seeded generator, so a run with the same seed draws the same noise in the same order."""

    __slots__ = ("_at", "_buffer", "_rng", "_sigma")

    def __init__(self, rng: np.random.Generator, cv: float) -> None:
        self._rng = rng
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._buffer: np.ndarray | None = None
        self._at = 0

    @classmethod
    def per_replica(cls, cv: float, seed: int, n: int) -> list[StepNoise | None]:
        """One stream per replica over one generator; None each when there is no noise."""
        if cv <= 0:
            return [None] * n
        rng = np.random.default_rng(seed)
        return [cls(rng, cv) for _ in range(n)]

    def __call__(self) -> float:
        if self._buffer is None or self._at >= len(self._buffer):
            sigma = self._sigma
            self._buffer = self._rng.lognormal(-0.5 * sigma * sigma, sigma, 4096)
            self._at = 0
        value = float(self._buffer[self._at])
        self._at += 1
        return value
