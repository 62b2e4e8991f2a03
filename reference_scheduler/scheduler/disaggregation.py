"""The `scheduler.disaggregation:` block: a prefill pool, a decode pool, and the KV link between.

    scheduler:
      disaggregation:
        prefill_replicas: 2
        decode_replicas: 2
        kv_transfer:
          bandwidth: 50GB/s          # per GPU's link (RDMA NIC), as kv_bytes_per_token is
          latency: 1ms               # fixed per transfer (connection set-up, the first byte)
          jitter: {dist: lognormal, median: 2ms, p99: 80ms}   # a stall added to each transfer
        decode_admission: pooled     # or reserve, kv_aware (DisaggregationSpec)

Why a block of its own: disaggregated serving (vLLM's KV connectors, SGLang's PD mode, llm-d)
splits a request's life over two pools joined by a KV transfer whose time varies, and the field's
incident had its TTFT tail in that variance. The transfer of request k from prefill replica r is
a FIFO queue on r's link (a Lindley recursion, which the tests check by hand):

    start_k = max(ready_k, free_r),   free_r = start_k + bytes_k / bandwidth,
    arrive_k = free_r + latency + jitter_k,   bytes_k = prompt_tokens_k × kv_bytes_per_token

`profile.kv_bytes_per_token` is per GPU, as every profile states it: layers × KV heads × head dim ×
2 (K and V) × dtype bytes ÷ the tensor-parallel degree (Llama-3-70B: 327,680 B for the model, 40,960
B on each of TP8's GPUs), and `bandwidth` is per GPU too: each tensor-parallel rank holds its shard
of the heads and sends it over its own NIC to its counterpart on the decode side, the ranks in
parallel (NIXL and Mooncake move each rank's blocks; a DGX H100 has one 400 Gb/s NIC, 50 GB/s, per
GPU), so a replica's transfer takes its shard's bytes ÷ one NIC's bandwidth (a 1k-token prompt on
TP8: 40.96 MB ÷ 50 GB/s = 0.82 ms). Only the bytes hold the link; the latency and the jitter are the
transfer's own (a decode pod slow to pull, a retransmit, a stalled completion), so a slow transfer
delays its own request and not the ones behind it — the incident's "light spots": a few requests' KV
late while the median is untouched. Jitter is any of the scenario's length distributions with
durations as values (`constant`, `uniform`, `normal`, `lognormal` by median and p99, `exponential`),
drawn from its own seeded stream so the same config gives the same transfers. `share` (0 to 1) makes
it a rare stall: that share of transfers draws from the distribution and the rest get none (then
`min`, if set), so a link can be quiet for 99.6% of requests and stall the others by hundreds of ms
(`{dist: uniform, low: 150ms, high: 400ms, share: 0.004, min: 1ms}`) — a tail no unimodal
distribution gives without moving its median too.

This module knows nothing of fairbench (reference_scheduler never imports it), so it reads its
own units: bandwidth `B/s`, `KB/s`, `MB/s`, `GB/s` (decimal) or a number of bytes per second;
durations `us`, `ms`, `s` or a number of seconds.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([KMGT]?)B/s\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(ns|us|ms|s)\s*$")
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def bandwidth_bytes_per_s(value: Any) -> float:
    """`50GB/s` -> 5e10; a bare number is bytes per second."""
    if isinstance(value, bool):
        raise ValueError("expected a bandwidth such as 50GB/s")
    if isinstance(value, int | float):
        out = float(value)
    else:
        match = _BANDWIDTH.match(str(value))
        if not match:
            raise ValueError(f"expected a bandwidth such as 50GB/s, got {value!r}")
        out = float(match.group(1)) * _SCALE[match.group(2).upper()]
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"a bandwidth must be positive, got {value!r}")
    return out


def duration_s(value: Any) -> float:
    """`2ms` -> 0.002; a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 2ms")
    if isinstance(value, int | float):
        out = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"expected a duration such as 2ms, got {value!r}")
        out = float(match.group(1)) * _SECONDS[match.group(2)]
    if not (math.isfinite(out) and out >= 0):
        raise ValueError(f"a duration must be finite and not negative, got {value!r}")
    return out


_DURATION_FIELDS = ("value", "low", "high", "mean", "std", "median", "p99", "min", "max")


class JitterSpec(BaseModel):
    """A length distribution whose values are durations (seconds once parsed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dist: Literal["constant", "uniform", "normal", "lognormal", "exponential"]
    value: float | None = None
    low: float | None = None
    high: float | None = None
    mean: float | None = None
    std: float | None = None
    median: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    share: float | None = Field(None, ge=0, le=1, description="share of transfers that stall")

    @field_validator(*_DURATION_FIELDS, mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        return None if value is None else duration_s(value)

    @model_validator(mode="after")
    def _complete(self) -> JitterSpec:
        need = {
            "constant": ("value",),
            "uniform": ("low", "high"),
            "normal": ("mean", "std"),
            "lognormal": ("median", "p99"),
            "exponential": ("mean",),
        }[self.dist]
        missing = [name for name in need if getattr(self, name) is None]
        if missing:
            raise ValueError(f"dist {self.dist} needs {', '.join(missing)}")
        if self.dist == "uniform" and self.high < self.low:  # type: ignore[operator]
            raise ValueError("high must be at least low")
        if self.dist == "lognormal" and not self.p99 >= self.median > 0:  # type: ignore[operator]
            raise ValueError("lognormal needs 0 < median <= p99")
        return self

    def sample_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n draws in seconds, clipped to [min, max] and at 0 (a stall is never negative); with
        `share`, each draw is kept with that probability (one uniform each) and 0 otherwise."""
        if self.dist == "constant":
            out = np.full(n, self.value, dtype=float)
        elif self.dist == "uniform":
            out = rng.uniform(self.low, self.high, n)  # type: ignore[arg-type]
        elif self.dist == "normal":
            out = rng.normal(self.mean, self.std, n)  # type: ignore[arg-type]
        elif self.dist == "exponential":
            out = rng.exponential(self.mean, n)  # type: ignore[arg-type]
        else:
            sigma = math.log(self.p99 / self.median) / 2.3263478740408408  # type: ignore[operator]
            out = rng.lognormal(math.log(self.median), sigma, n)  # type: ignore[arg-type]
        if self.share is not None:
            out = np.where(rng.random(n) < self.share, out, 0.0)
        lo = 0.0 if self.min is None else self.min
        return np.clip(out, lo, np.inf if self.max is None else self.max)


class KvTransferSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bandwidth: float = Field(50e9, description="bytes per second of each GPU's link")
    latency: float = Field(0.001, description="seconds per transfer, not holding the link")
    jitter: JitterSpec | None = None

    @field_validator("bandwidth", mode="before")
    @classmethod
    def _bandwidth(cls, value: Any) -> float:
        return bandwidth_bytes_per_s(value)

    @field_validator("latency", mode="before")
    @classmethod
    def _latency(cls, value: Any) -> float:
        return duration_s(value)


DecodeAdmission = Literal["pooled", "reserve", "kv_aware"]


class DisaggregationSpec(BaseModel):
    """The block. `decode_admission` is how a request whose prefill ended reaches a decode
    replica (drivers/disaggregated.py; docs/incident.md, with the systems each mode follows):

    - `pooled` (default): it joins the decode pool's one queue when its KV has arrived, and
      the first replica with a free slot takes it — bound as late as can be, nothing held while
      the KV is in flight;
    - `reserve`: bound when its prefill ends, round-robin (vLLM's disaggregation proxy), and
      holding one of that replica's `max_num_seqs` slots from then on, the transfer included
      (SGLang's plain request pool: pre-allocated + transferring + running <= the limit), so a
      stalled transfer keeps a slot idle and the requests bound behind it wait;
    - `kv_aware`: bound when its prefill ends to the replica with the least backlog (transfers
      in flight to it, its waiting and running requests; llm-d's load scorers), holding no slot
      until its KV has arrived (SGLang's decode request pool, vLLM's WAITING_FOR_REMOTE_KVS).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    prefill_replicas: int = Field(1, ge=1, le=100_000)
    decode_replicas: int = Field(1, ge=1, le=100_000)
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec)
    decode_admission: DecodeAdmission = "pooled"


class KvLink:
    """The KV links of the prefill pool: one FIFO queue per prefill replica (see the module)."""

    def __init__(self, spec: KvTransferSpec, kv_bytes_per_token: int, replicas: int, seed: int):
        self.spec = spec
        self.kv_bytes_per_token = kv_bytes_per_token
        self.free_ns = [0] * replicas
        self._rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x6B76,)))
        self._jitter: list[float] = []

    def _draw_s(self) -> float:
        if self.spec.jitter is None:
            return 0.0
        if not self._jitter:  # draws in blocks: the same seed, the same sequence
            self._jitter = self.spec.jitter.sample_s(self._rng, 4096)[::-1].tolist()
        return self._jitter.pop()

    def transfer(self, replica: int, ready_ns: int, tokens: int) -> int:
        """When the KV of `tokens` tokens, ready at `ready_ns` on `replica`, reaches decode."""
        serial_s = tokens * self.kv_bytes_per_token / self.spec.bandwidth
        start = max(ready_ns, self.free_ns[replica])
        self.free_ns[replica] = start + round(serial_s * 1e9)
        return self.free_ns[replica] + round((self.spec.latency + self._draw_s()) * 1e9)
