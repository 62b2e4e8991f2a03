"""The upstream pool: each engine's in-flight budget, health and saturation, and which one to use.

A request leaves the gateway's queue only when some upstream has room, so queueing (and the
policy's ordering) happens here rather than in an engine's own FIFO. An upstream has room when
all of these hold:
- it is healthy (`fail_after` consecutive failures mark it unhealthy; a probe of its /health
  brings it back),
- it is not saturated by its own account: its last /metrics scrape shows no more than
  `max_waiting` queued requests and KV usage below `max_kv_usage`. Where its sequence capacity
  is not known (capacity.py), that scrape must also be younger than `stale_after_s` (a scrape
  that is too old, or never succeeded, counts as saturated: not knowing is not room); where it
  is known, the gateway's own count is in charge and a stale scrape only stops correcting it,
- fewer requests are in flight to it than `max_inflight` and its (corrected) `max_num_seqs`,
  and the job's prompt + reserved output fit in `max_inflight_tokens` if that is set and in
  `max_kv_usage` of its KV tokens if those are known (a job larger than the whole KV budget
  goes alone, so it is never stuck).
Among those, `choose` takes the least loaded (in flight ÷ its request limit); ties go to the
lowest index, so the choice is deterministic. Nothing here reads a clock: callers pass `now_ns`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_scheduler.gateway.capacity import (
    CACHE_INFO,
    Capacity,
    from_profile,
    vllm_kv_tokens,
)
from reference_scheduler.gateway.config import SATURATION_SERIES, DispatchSpec, UpstreamSpec


@dataclass
class Upstream:
    index: int
    name: str
    spec: UpstreamSpec
    inflight: int = 0
    inflight_tokens: int = 0
    healthy: bool = True
    failures: int = 0  # consecutive
    scraped_ns: int | None = None  # last successful scrape
    waiting: float = 0.0
    kv_usage: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    capacity: Capacity = field(default_factory=Capacity)

    def __post_init__(self) -> None:
        spec = self.spec
        if spec.max_num_seqs is not None:
            self.capacity.set_seqs(spec.max_num_seqs, "max_num_seqs")
        if spec.kv_cache_tokens is not None:
            self.capacity.set_kv(spec.kv_cache_tokens, "kv_cache_tokens")
        if spec.profile is not None:
            seqs, kv = from_profile(spec.profile)  # the config checked it reads
            if seqs is not None:
                self.capacity.set_seqs(seqs, f"profile {spec.profile}")
            if kv is not None:
                self.capacity.set_kv(kv, f"profile {spec.profile}")

    @property
    def scraped(self) -> bool:
        return self.spec.engine != "none"

    def saturation(self, now_ns: int, stale_ns: int) -> str | None:
        """Why the upstream's own metrics say it is full, or None."""
        if not self.scraped:
            return None
        if self.scraped_ns is None or now_ns - self.scraped_ns > stale_ns:
            # with its capacity known the count is in charge: an old scrape corrects nothing
            return None if self.capacity.known else "stale"
        if self.waiting > self.spec.max_waiting:
            return "waiting"
        if self.kv_usage >= self.spec.max_kv_usage:
            return "kv"
        return None

    @property
    def limit(self) -> int:
        """Requests that may be in flight to it now."""
        return self.capacity.seq_limit(self.spec.max_inflight)

    def fits(self, cost: int) -> bool:
        if self.inflight >= self.limit:
            return False
        limit = self.spec.max_inflight_tokens
        if limit is not None and self.inflight_tokens + cost > limit:
            return False
        kv = self.capacity.kv_budget(self.spec.max_kv_usage)
        return kv is None or self.inflight_tokens + cost <= kv or self.inflight == 0

    @property
    def slots(self) -> int:
        """Requests in flight: an upstream is the gateway's replica (the metrics read `slots`)."""
        return self.inflight

    @property
    def load(self) -> float:
        return self.inflight / self.limit


class Pool:
    def __init__(self, upstreams: list[UpstreamSpec], dispatch: DispatchSpec) -> None:
        self.upstreams = [
            Upstream(i, spec.name or f"u{i}", spec) for i, spec in enumerate(upstreams)
        ]
        self.dispatch = dispatch
        self.stale_ns = int(dispatch.stale_after_s * 1e9)

    @property
    def capacity(self) -> int:
        return sum(u.limit for u in self.upstreams)

    def largest_token_budget(self) -> int | None:
        """The most tokens any upstream can take at once (None: some upstream has no limit)."""
        limits = [u.spec.max_inflight_tokens for u in self.upstreams]
        return None if any(x is None for x in limits) else max(x for x in limits if x)

    def available(self, up: Upstream, now_ns: int) -> bool:
        return up.healthy and up.saturation(now_ns, self.stale_ns) is None

    def choose(self, cost: int, now_ns: int, exclude: int = -1) -> Upstream | None:
        best: Upstream | None = None
        for up in self.upstreams:
            if up.index == exclude or not up.fits(cost) or not self.available(up, now_ns):
                continue
            if best is None or up.load < best.load:
                best = up
        return best

    def any_other_healthy(self, exclude: int) -> bool:
        return any(u.healthy for u in self.upstreams if u.index != exclude)

    def take(self, up: Upstream, cost: int) -> None:
        up.inflight += 1
        up.inflight_tokens += cost

    def give(self, up: Upstream, cost: int) -> None:
        up.inflight -= 1
        up.inflight_tokens -= cost
        assert up.inflight >= 0 and up.inflight_tokens >= 0

    def failed(self, up: Upstream, kind: str, counts_for_health: bool = True) -> bool:
        """Count an error; True if it just made the upstream unhealthy."""
        up.errors[kind] = up.errors.get(kind, 0) + 1
        if not counts_for_health:
            return False
        up.failures += 1
        if up.healthy and up.failures >= self.dispatch.fail_after:
            up.healthy = False
            return True
        return False

    def succeeded(self, up: Upstream) -> None:
        up.failures = 0

    def read_scrape(self, up: Upstream, text: str, now_ns: int) -> None:
        """Read the saturation series from an exposition text (only the lines named), vLLM's
        KV size the first time it is there, and correct the upstream's capacity by them."""
        waiting_name, kv_name = SATURATION_SERIES.get(up.spec.engine, ("", None))
        waiting = 0.0
        kv = 0.0
        learn = up.spec.engine == "vllm" and up.capacity.kv_tokens is None
        for line in text.splitlines():
            if not line or line[0] == "#":
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name == waiting_name:
                waiting += _value(line)
            elif kv_name is not None and name == kv_name:
                kv = max(kv, _value(line))
            elif learn and name == CACHE_INFO:
                tokens = vllm_kv_tokens(line)
                if tokens is not None:
                    up.capacity.set_kv(tokens, f"/metrics {CACHE_INFO}")
                    learn = False
        up.waiting, up.kv_usage, up.scraped_ns = waiting, kv, now_ns
        up.capacity.correct(waiting, up.spec.max_waiting, kv >= up.spec.max_kv_usage, up.inflight)


def _value(line: str) -> float:
    """The sample value of one exposition line (a trailing timestamp, if any, is ignored)."""
    tail = line.rsplit("}", 1)[-1].split()
    try:
        return float(tail[0]) if tail else 0.0
    except ValueError:
        return 0.0
