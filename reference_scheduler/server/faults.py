"""Fault injection for the served scheduler: the failures a load generator must survive.

    faults:
      seed: 7
      rules:                                   # first matching rule wins; one fault a request
        - {kind: stall_first_token, rate: 0.1, seconds: 5, tenants: [chat-app]}
        - {kind: drop_mid_stream, rate: 0.05}
        - {kind: overload_503, rate: 0.05, retry_after_s: 2}

Kinds: `stall_first_token`, `stall_mid_stream` (sleep `seconds`), `drop_mid_stream` (the
connection is cut half-way), `http_500`, `overload_503` and `rate_limit_429` (with Retry-After),
`bad_json` (a malformed event mid-stream), `missing_done` (the stream ends cleanly but with no
finish_reason, usage or [DONE]), `truncated_event` (the last event cut in half, then a clean end),
`slow_loris` (the response dribbles out at `bytes_per_s`).

Decisions are seeded by (seed, request id) — the client's `X-Request-Id` when it sends one — so
a faulty run is reproducible request by request, whatever the arrival interleaving. Every
injected fault is counted (`scheduler_faults_injected_total{kind}`), so what a client recorded
can be checked against what was injected.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal[
    "stall_first_token",
    "stall_mid_stream",
    "drop_mid_stream",
    "http_500",
    "overload_503",
    "rate_limit_429",
    "bad_json",
    "missing_done",
    "truncated_event",
    "slow_loris",
]
STREAM_ONLY = {
    "stall_mid_stream",
    "drop_mid_stream",
    "bad_json",
    "missing_done",
    "truncated_event",
    "slow_loris",
}


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: FaultKind
    rate: float = Field(ge=0, le=1, allow_inf_nan=False)
    seconds: float = Field(5.0, ge=0, le=3600, allow_inf_nan=False)
    retry_after_s: int = Field(1, ge=0, le=3600)
    bytes_per_s: float = Field(20.0, gt=0, allow_inf_nan=False)
    tenants: list[str] | None = None


class FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    seed: int = Field(0, ge=0)
    rules: list[FaultRule] = Field(default_factory=list)


class Faults:
    def __init__(self, spec: FaultSpec | None) -> None:
        self.spec = spec or FaultSpec()
        self.injected: Counter[str] = Counter()

    def _uniform(self, key: str, k: int) -> float:
        digest = hashlib.blake2b(f"{self.spec.seed}:{key}:{k}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2**64

    def pick(self, request_key: str, tenant: str, streaming: bool) -> FaultRule | None:
        """The fault for this request, if any (counted as injected)."""
        for k, rule in enumerate(self.spec.rules):
            if rule.tenants is not None and tenant not in rule.tenants:
                continue
            if rule.kind in STREAM_ONLY and not streaming:
                continue
            if self._uniform(request_key, k) < rule.rate:
                self.injected[rule.kind] += 1
                return rule
        return None
