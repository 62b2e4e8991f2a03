"""The scheduler's SLIs as Prometheus metrics (prometheus-client, one registry per server).

scheduler_wait_time_seconds{tenant,slo_class}        histogram, arrival -> admission
scheduler_throughput_tokens_total{tenant}            output tokens produced
scheduler_requests_total{tenant,slo_class,outcome}   finished | cancelled
scheduler_admission_rejections_total{code}           400 / 401 / 429 / 503
scheduler_queue_depth                                waiting jobs (all tiers)
scheduler_queue_depth_by{dimension,name}             waiting jobs per tier / tenant
scheduler_running                                    jobs in the engine
scheduler_pool_queue_depth{pool}                     disaggregated: waiting jobs per pool
                                                     (prefill, decode: KV arrived, no slot yet)
scheduler_pool_running{pool}                         disaggregated: jobs running per pool
scheduler_kv_transfers_in_flight                     disaggregated: KV on the link (reported
                                                     only by a disaggregated server)
scheduler_vtc_counter{tenant}                        VTC's service counters (vtc/lcf)
scheduler_borrow_ratio{tier_from,tier_to}            capacity a tier borrows from another (tiered)
scheduler_control_actions_total{loop,action}         control-loop actions (scheduler/control.py)
scheduler_step_duration_seconds                      histogram of engine step times
scheduler_step_lag_seconds                           histogram: how late the driver woke

The gateway (reference_scheduler/gateway) reports the same names where they apply (wait time is
arrival -> dispatch to an upstream; running is in flight to upstreams), plus `GatewayMetrics`:
gateway_dispatch_wait_seconds{upstream}              histogram, arrival -> dispatch, by upstream
gateway_upstream_first_byte_seconds{upstream}        histogram, dispatch -> first body byte
gateway_inflight{upstream}                           requests in flight to each upstream
gateway_inflight_tokens{upstream}                    their prompt + max_tokens
gateway_upstream_errors_total{upstream,kind}         connect | timeout | http_5xx | overloaded |
                                                     auth | mid_stream | idle_timeout
gateway_retries_total{upstream}                      retried elsewhere after failing there
gateway_upstream_aborts_total{upstream}              client went away: upstream request closed
gateway_upstream_healthy{upstream}                   1 healthy, 0 marked unhealthy (probed back)
gateway_upstream_saturated{upstream,reason}          1 while its own metrics say full
                                                     (waiting | kv | stale)
gateway_upstream_waiting{upstream}                   its scraped queue length
gateway_upstream_kv_usage{upstream}                  its scraped KV-cache usage (0..1)
gateway_upstream_scrape_age_seconds{upstream}        how old its last good scrape is
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from reference_scheduler.core.job import Job

_LATENCY = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_LAG = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1)


class _EngineCounters(Collector):
    """Counters the engine keeps itself (prefix cache, admission), read at scrape time."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.metrics_faults: Any = None

    def collect(self) -> Any:
        engine = self.engine
        if engine is None:
            return
        cache = engine.cache
        queries = CounterMetricFamily(
            "scheduler_prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache"
        )
        hits = CounterMetricFamily(
            "scheduler_prefix_cache_hits_tokens", "Prompt tokens served from the prefix cache"
        )
        queries.add_metric([], cache.query_tokens if cache else 0)
        hits.add_metric([], cache.hit_tokens if cache else 0)
        yield queries
        yield hits
        admission = engine.admission
        refusals = CounterMetricFamily(
            "scheduler_admission_refusals",
            "Requests refused by admission control",
            labels=["reason"],
        )
        degraded = CounterMetricFamily("scheduler_degraded", "Jobs whose max_tokens were capped")
        if admission is not None:
            for reason, n in sorted(admission.rejected.items()):
                refusals.add_metric([reason], n)
        degraded.add_metric([], admission.degraded if admission else 0)
        yield refusals
        yield degraded
        pre = engine.preemption
        preempt = CounterMetricFamily(
            "scheduler_preempt_count", "Preemptions suffered", labels=["tenant", "slo_class"]
        )
        for (tenant, cls), n in sorted(pre.by_tenant_class.items()):
            preempt.add_metric([tenant, cls], n)
        yield preempt
        control = getattr(engine, "control", None)
        if control is not None:  # the congestion and resource loops (scheduler/control.py)
            actions = CounterMetricFamily(
                "scheduler_control_actions",
                "Actions the control loops took (engagements, releases, signals)",
                labels=["loop", "action"],
            )
            for (loop, action), n in sorted(control.counts.items()):
                actions.add_metric([loop, action], n)
            yield actions
        faults = self.metrics_faults
        if faults is not None:
            injected = CounterMetricFamily(
                "scheduler_faults_injected", "Faults injected", labels=["kind"]
            )
            for kind, n in sorted(faults.injected.items()):
                injected.add_metric([kind], n)
            yield injected
        for name, doc, value in (
            ("scheduler_demotions", "Waiting jobs moved down a tier", pre.demotions),
            ("scheduler_promotions", "Waiting jobs moved back up a tier", pre.promotions),
            (
                "scheduler_swap_bytes",
                "KV bytes swapped out and in",
                pre.swap_out_bytes + pre.swap_in_bytes,
            ),
            (
                "scheduler_recompute_tokens",
                "Tokens re-prefilled after preemption",
                pre.recompute_tokens,
            ),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            yield family


class SchedulerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._engine_counters = _EngineCounters()
        r.register(self._engine_counters)
        self.faults: Any = None  # set by the server: injected faults are counted on scrape
        self.wait = Histogram(
            "scheduler_wait_time_seconds",
            "Arrival to admission",
            ["tenant", "slo_class"],
            buckets=_LATENCY,
            registry=r,
        )
        self.tokens = Counter(
            "scheduler_throughput_tokens", "Output tokens produced", ["tenant"], registry=r
        )
        self.requests = Counter(
            "scheduler_requests",
            "Requests that left the scheduler",
            ["tenant", "slo_class", "outcome"],
            registry=r,
        )
        self.rejections = Counter(
            "scheduler_admission_rejections", "Requests refused", ["code"], registry=r
        )
        self.cancelled = Counter("scheduler_cancelled", "Requests cancelled by clients", registry=r)
        self.depth = Gauge("scheduler_queue_depth", "Waiting requests", registry=r)
        self.depth_by = Gauge(
            "scheduler_queue_depth_by",
            "Waiting requests by tier or tenant",
            ["dimension", "name"],
            registry=r,
        )
        self.running = Gauge("scheduler_running", "Requests in the engine", registry=r)
        self.vtc = Gauge("scheduler_vtc_counter", "VTC service counter", ["tenant"], registry=r)
        self.borrow = Gauge(
            "scheduler_borrow_ratio",
            "Capacity share a tier borrows from another tier's unused quota",
            ["tier_from", "tier_to"],
            registry=r,
        )
        self.pool_depth = Gauge(
            "scheduler_pool_queue_depth",
            "Waiting requests per pool (disaggregated serving)",
            ["pool"],
            registry=r,
        )
        self.pool_running = Gauge(
            "scheduler_pool_running",
            "Requests running per pool (disaggregated serving)",
            ["pool"],
            registry=r,
        )
        self.kv_in_flight: Gauge | None = None  # made by the first refresh_pools
        self.step_time = Histogram(
            "scheduler_step_duration_seconds", "Engine step time", buckets=_LATENCY, registry=r
        )
        self.step_lag = Histogram(
            "scheduler_step_lag_seconds", "Real-time driver lateness", buckets=_LAG, registry=r
        )

    def admitted(self, job: Job) -> None:
        self.wait.labels(job.tenant, job.slo_class).observe((job.admit_ns - job.arrival_ns) / 1e9)

    def finished(self, job: Job) -> None:
        self.requests.labels(job.tenant, job.slo_class, "finished").inc()
        if job.max_tokens:
            self.tokens.labels(job.tenant).inc(job.max_tokens)

    def rejected(self, code: int) -> None:
        self.rejections.labels(str(code)).inc()

    def queue_depth(self, n: int) -> None:
        self.depth.set(n)

    def step(self, res: Any, lag_ns: int, policy: Any) -> None:
        self.step_time.observe(res.duration_ns / 1e9)
        self.step_lag.observe(lag_ns / 1e9)

    def refresh(self, engine: Any) -> None:
        """Gauges that are cheaper to read on scrape than to keep current on every step."""
        self._engine_counters.engine = engine
        self._engine_counters.metrics_faults = self.faults
        policy = engine.policy
        self.depth.set(len(policy))
        self.running.set(sum(rep.slots for rep in engine.replicas))
        for key, value in policy.stats().items():
            if key.startswith("counter:"):
                self.vtc.labels(key[8:]).set(value)
        for tenant, n in engine.admission.by_tenant.items():
            self.depth_by.labels("tenant", tenant).set(n)
        for cls, n in engine.admission.by_class.items():
            self.depth_by.labels("slo_class", cls).set(n)
        if hasattr(policy, "borrowing"):
            self.borrow.clear()
            for (lender, borrower), share in policy.borrowing().items():
                self.borrow.labels(lender, borrower).set(share)
            for spec, child in zip(policy.specs, policy.children, strict=True):
                self.depth_by.labels("tier", spec.name).set(len(child))

    def refresh_pools(self, pools: dict[str, Any], kv_in_flight: int) -> None:
        """A disaggregated server's gauges: each pool's waiting and running requests, and
        the KV transfers on the link; the overall queue depth is both pools' waiting."""
        for name, engine in pools.items():
            self.pool_depth.labels(name).set(len(engine.policy))
            self.pool_running.labels(name).set(sum(rep.slots for rep in engine.replicas))
        self.depth.set(sum(len(engine.policy) for engine in pools.values()))
        self.running.set(sum(rep.slots for engine in pools.values() for rep in engine.replicas))
        if self.kv_in_flight is None:
            self.kv_in_flight = Gauge(
                "scheduler_kv_transfers_in_flight",
                "KV transfers on the prefill pool's links",
                registry=self.registry,
            )
        self.kv_in_flight.set(kv_in_flight)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GatewayMetrics(SchedulerMetrics):
    """The scheduler's SLIs plus what a gateway adds: per-upstream load, errors and saturation."""

    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.dispatch_wait = Histogram(
            "gateway_dispatch_wait_seconds",
            "Arrival to dispatch, by upstream",
            ["upstream"],
            buckets=_LATENCY,
            registry=r,
        )
        self.first_byte = Histogram(
            "gateway_upstream_first_byte_seconds",
            "Dispatch to the upstream's first body byte",
            ["upstream"],
            buckets=_LATENCY,
            registry=r,
        )
        self.inflight = Gauge("gateway_inflight", "Requests in flight", ["upstream"], registry=r)
        self.inflight_tokens = Gauge(
            "gateway_inflight_tokens", "Prompt + max_tokens in flight", ["upstream"], registry=r
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors", "Upstream failures", ["upstream", "kind"], registry=r
        )
        self.retries = Counter(
            "gateway_retries",
            "Requests retried elsewhere after failing here",
            ["upstream"],
            registry=r,
        )
        self.aborts = Counter(
            "gateway_upstream_aborts",
            "Upstream requests closed because the client went away",
            ["upstream"],
            registry=r,
        )
        self.healthy = Gauge("gateway_upstream_healthy", "1 if healthy", ["upstream"], registry=r)
        self.saturated = Gauge(
            "gateway_upstream_saturated",
            "1 while the upstream's own metrics say it is full",
            ["upstream", "reason"],
            registry=r,
        )
        self.upstream_waiting = Gauge(
            "gateway_upstream_waiting", "Scraped queue length", ["upstream"], registry=r
        )
        self.upstream_kv = Gauge(
            "gateway_upstream_kv_usage", "Scraped KV-cache usage", ["upstream"], registry=r
        )
        self.scrape_age = Gauge(
            "gateway_upstream_scrape_age_seconds",
            "Age of the last good scrape",
            ["upstream"],
            registry=r,
        )

    def refresh_pool(self, pool: Any, now_ns: int) -> None:
        """Per-upstream gauges, read from the pool at scrape time."""
        self.saturated.clear()
        for up in pool.upstreams:
            name = up.name
            self.inflight.labels(name).set(up.inflight)
            self.inflight_tokens.labels(name).set(up.inflight_tokens)
            self.healthy.labels(name).set(1 if up.healthy else 0)
            reason = up.saturation(now_ns, pool.stale_ns)
            for why in ("waiting", "kv", "stale"):
                self.saturated.labels(name, why).set(1 if reason == why else 0)
            if up.scraped:
                self.upstream_waiting.labels(name).set(up.waiting)
                self.upstream_kv.labels(name).set(up.kv_usage)
                if up.scraped_ns is not None:
                    self.scrape_age.labels(name).set((now_ns - up.scraped_ns) / 1e9)
