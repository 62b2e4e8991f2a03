"""The dual closed loop (issue 38): a congestion loop at the engine-step timescale and a resource
loop over seconds, both optional, both counted.

    scheduler:
      control:
        congestion:                      # every engine step, on the global waiting queue
          q_high: 200                    # engage at this many waiting jobs
          q_low: 100                     # release everything below this (default q_high // 2)
          actions: [degrade_max_tokens, reject_best_effort, reclaim_borrowed]   # the ladder
          degrade_to: 256                # max_tokens of degraded work
          degrade_classes: [batch, best-effort]
          best_effort_classes: [best-effort]
        resource:                        # every `interval`, per tenant over a sliding window
          window: 30s
          interval: 1s
          slo_min: 0.95                  # TTFT attainment below this is a miss of the loop
          ttft: {interactive: 300ms, batch: 2s}   # the class's TTFT target (classes not named:
          min_samples: 10                #   not judged); fewer finished jobs: not judged
          weight_step: 0.25              # a missing tenant's weight += step, within bounds;
          weight_bounds: [0.5, 4]        #   back by a step once it attains again
          preemption_quota: 2            # preemptions of its own tier a missing tenant may make
          scale_out: {signal: true, cooldown: 60s}

Congestion ladder. The actions are rungs taken in their listed order: the first when the queue
reaches `q_high`, the next at a later step only if the queue is still at or above `q_high` and
longer than when the previous rung was taken (the milder action did not stop the growth), and
all of them are released together when the queue falls below `q_low` (hysteresis, so the loop
does not flap at the threshold). One rung per step and only while growth continues, rather than
one per threshold crossing: a crossing happens once per episode, so a ladder driven by crossings
would never climb past its first rung, and climbing every step regardless would take every rung
within a few tens of milliseconds, before the mild action could show any effect.
- degrade_max_tokens: while engaged, an arriving job of `degrade_classes` asking more than
  `degrade_to` output tokens is cut to `degrade_to` (arrivals only: a queued job's cost is part
  of its policy's bookkeeping, so it is not changed under it);
- reject_best_effort: while engaged, an arriving job of `best_effort_classes` is refused with
  503 "control_reject_best_effort" (it ends as a rejected record, never lost);
- reclaim_borrowed: while engaged, a tiered policy lends no quota (every ceiling is its quota),
  so slots freed by borrowers go back to their owners; with another policy it does nothing and
  the configuration says so in a warning.

Resource loop. Every `interval` it computes each tenant's TTFT attainment over the jobs that
finished in the last `window` (the share whose first token came within its class's target);
a tenant below `slo_min` gets `weight_step` more weight (for weighted policies: dwrr, wfq, sfq,
vtc read a job's weight) up to the upper bound, applied to its jobs from their arrival on, and a
tenant that attains again steps back towards its configured weight. A tenant below `slo_min`
is also granted `preemption_quota` preemptions (reset, not added, at each evaluation it misses;
they need `scheduler.preemption.mode`): its waiting jobs may then preempt running jobs of their
own tier from tenants that are attaining, one grant each, where otherwise a job preempts only
lower tiers. Any tenant below `slo_min` raises a scale-out signal, at most once per `cooldown`:
a signal, counted, since the simulated pool is fixed. A long window averages a burst away and
reacts late; that is one of the three pitfalls (scenarios/control-*.yaml, docs/control.md).

Every action is counted in `counts[(loop, action)]` (the server exports it as
`scheduler_control_actions_total{loop, action}`; releases are counted as action "release") and
logged with its time in `log` (t_ns, loop, action, job id or -1), which the simulator merges
into its trace. Engagements and signals are counted, not the jobs each one touched; a rejected
job is also an admission rejection, a degraded one shows its cut max_tokens in its record.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Verdict
from reference_scheduler.scheduler.disaggregation import duration_s

Action = Literal["degrade_max_tokens", "reject_best_effort", "reclaim_borrowed"]
ACTIONS: tuple[str, ...] = ("degrade_max_tokens", "reject_best_effort", "reclaim_borrowed")


class CongestionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    q_high: int = Field(ge=1, description="waiting jobs at which the ladder engages")
    q_low: int | None = Field(None, ge=0, description="release below this; default q_high // 2")
    actions: list[Action] = Field(default_factory=lambda: list(ACTIONS))
    degrade_to: int = Field(256, ge=1, description="max_tokens of degraded work")
    degrade_classes: list[str] = Field(default_factory=lambda: ["batch", "best-effort"])
    best_effort_classes: list[str] = Field(default_factory=lambda: ["best-effort"])

    @model_validator(mode="after")
    def _check(self) -> CongestionSpec:
        if len(set(self.actions)) != len(self.actions):
            raise ValueError("actions: each action at most once")
        if not self.actions:
            raise ValueError("actions: name at least one of " + ", ".join(ACTIONS))
        if self.q_low is not None and self.q_low > self.q_high:
            raise ValueError(f"q_low ({self.q_low}) must not exceed q_high ({self.q_high})")
        return self

    @property
    def low(self) -> int:
        return self.q_high // 2 if self.q_low is None else self.q_low


def _duration(value: Any) -> float:
    out = duration_s(value)
    if out <= 0:
        raise ValueError(f"must be a positive duration such as 30s, got {value!r}")
    return out


class ScaleOutSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    signal: bool = True
    cooldown: float = Field(60.0, description="seconds between two signals (30s, 2ms, 60)")

    _seconds = field_validator("cooldown", mode="before")(_duration)


class ResourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    window: float = Field(30.0, description="attainment window (30s)")
    interval: float = Field(1.0, description="how often the loop evaluates (1s)")
    slo_min: float = Field(0.95, gt=0, le=1)
    ttft: dict[str, float] = Field(
        default_factory=lambda: {"interactive": 0.3, "batch": 2.0},
        description="class -> TTFT target (300ms, 2s)",
    )
    min_samples: int = Field(10, ge=1)
    weight_step: float = Field(0.25, ge=0, allow_inf_nan=False)
    weight_bounds: tuple[float, float] = (0.5, 4.0)
    preemption_quota: int = Field(0, ge=0, description="same-tier preemptions granted (0: off)")
    scale_out: ScaleOutSpec | None = None

    _seconds = field_validator("window", "interval", mode="before")(_duration)

    @field_validator("ttft", mode="before")
    @classmethod
    def _targets(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError("a mapping of class -> TTFT target, such as {interactive: 300ms}")
        return {str(k): _duration(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _check(self) -> ResourceSpec:
        lo, hi = self.weight_bounds
        if not 0 < lo <= hi:
            raise ValueError(f"weight_bounds: need 0 < low <= high, got [{lo:g}, {hi:g}]")
        return self


class ControlSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    congestion: CongestionSpec | None = None
    resource: ResourceSpec | None = None


class Control:
    """Both loops' state for one engine; the engine calls `submit`, `step` and `finished`."""

    def __init__(self, spec: ControlSpec, policy: Any) -> None:
        self.spec = spec
        self.policy = policy
        self.counts: Counter[tuple[str, str]] = Counter()
        self.log: list[tuple[int, str, str, int]] = []
        self.engaged: list[str] = []  # congestion rungs taken, in order
        self._rung_depth = 0  # queue length when the last rung was taken
        self.weights: dict[str, float] = {}  # tenant -> weight the resource loop set
        self._base: dict[str, float] = {}  # tenant -> its configured weight
        self._done: deque[tuple[int, str, bool]] = deque()  # (done ns, tenant, attained)
        self._next_eval_ns = 0
        self._last_signal_ns: int | None = None
        self.credits: dict[str, int] = {}  # tenant -> same-tier preemptions granted
        self.missing: set[str] = set()  # tenants below slo_min at the last evaluation

    def _act(self, now_ns: int, loop: str, action: str, job: int = -1) -> None:
        self.counts[loop, action] += 1
        self.log.append((now_ns, loop, action, job))

    # ------------------------------------------------------------------ engine hooks

    def submit(self, job: Job, now_ns: int) -> Verdict | None:
        """Before admission: the resource loop's weight, then the congestion rungs engaged.
        A refusal is returned (the engine marks the job rejected); None to go on."""
        if self.spec.resource is not None:
            self._base.setdefault(job.tenant, job.weight)
            weight = self.weights.get(job.tenant)
            if weight is not None:
                job.weight = weight
        cong = self.spec.congestion
        if cong is None or not self.engaged:
            return None
        if "reject_best_effort" in self.engaged and job.slo_class in cong.best_effort_classes:
            return Verdict(False, 503, 1, "control_reject_best_effort")
        if (
            "degrade_max_tokens" in self.engaged
            and job.slo_class in cong.degrade_classes
            and job.max_tokens > cong.degrade_to
        ):
            job.max_tokens = cong.degrade_to
        return None

    def step(self, now_ns: int, waiting: int) -> None:
        """At an engine step's start: the congestion ladder, then (when due) the resource loop."""
        cong = self.spec.congestion
        if cong is not None:
            self._congestion(cong, now_ns, waiting)
        if self.spec.resource is not None and now_ns >= self._next_eval_ns:
            self._resource(self.spec.resource, now_ns)

    def finished(self, job: Job) -> None:
        res = self.spec.resource
        if res is None:
            return
        target = res.ttft.get(job.slo_class)
        if target is not None and job.first_token_ns >= 0:
            ok = job.first_token_ns - job.arrival_ns <= target * 1e9
            self._done.append((job.done_ns, job.tenant, ok))

    # ------------------------------------------------------------------ the loops

    def _congestion(self, cong: CongestionSpec, now_ns: int, waiting: int) -> None:
        if self.engaged and waiting < cong.low:
            self.engaged.clear()
            self._reclaim(False)
            self._act(now_ns, "congestion", "release")
            return
        if waiting < cong.q_high or len(self.engaged) == len(cong.actions):
            return
        if self.engaged and waiting <= self._rung_depth:
            return  # the rungs taken are holding the queue; no need to climb
        action = cong.actions[len(self.engaged)]
        self.engaged.append(action)
        self._rung_depth = waiting
        if action == "reclaim_borrowed":
            self._reclaim(True)
        self._act(now_ns, "congestion", action)

    def _reclaim(self, on: bool) -> None:
        reclaim = getattr(self.policy, "reclaim", None)
        if reclaim is not None:
            reclaim(on)

    def may_preempt(self, tenant: str, victim: Job) -> bool:
        """Whether `tenant`'s waiting job may preempt `victim` of its own tier (a grant)."""
        return (
            self.credits.get(tenant, 0) > 0
            and victim.tenant != tenant
            and victim.tenant not in self.missing
        )

    def spend(self, tenant: str, n: int) -> None:
        self.credits[tenant] -= n

    def attainment(self, now_ns: int) -> dict[str, tuple[float, int]]:
        """tenant -> (TTFT attainment, jobs) over the jobs finished in the last window."""
        res = self.spec.resource
        assert res is not None
        horizon = now_ns - res.window * 1e9
        done = self._done
        while done and done[0][0] < horizon:
            done.popleft()
        hits: Counter[str] = Counter()
        seen: Counter[str] = Counter()
        for _, tenant, ok in done:
            seen[tenant] += 1
            hits[tenant] += ok
        return {t: (hits[t] / n, n) for t, n in seen.items()}

    def _resource(self, res: ResourceSpec, now_ns: int) -> None:
        self._next_eval_ns = now_ns + int(res.interval * 1e9)
        lo, hi = res.weight_bounds
        missing = False
        self.missing.clear()
        for tenant, (share, n) in sorted(self.attainment(now_ns).items()):
            if n < res.min_samples:
                continue
            base = self._base.get(tenant, 1.0)
            weight = self.weights.get(tenant, base)
            if share < res.slo_min:
                missing = True
                self.missing.add(tenant)
                if res.preemption_quota:
                    self.credits[tenant] = res.preemption_quota
                    self._act(now_ns, "resource", "preemption_quota")
                new = min(hi, max(lo, weight + res.weight_step))
                action = "weight_up"
            else:
                new = max(weight - res.weight_step, base) if weight > base else weight
                action = "weight_down"
            if res.weight_step and new != weight:
                self.weights[tenant] = new
                self._act(now_ns, "resource", action)
        scale = res.scale_out
        if missing and scale is not None and scale.signal:
            last = self._last_signal_ns
            if last is None or now_ns - last >= scale.cooldown * 1e9:
                self._last_signal_ns = now_ns
                self._act(now_ns, "resource", "scale_out")
