"""The continuous-batching engine: a pure state machine, no clock inside.

One global policy queue feeds W replicas. `submit(job, now)` enqueues; `step(r, now)` runs one
iteration of replica r starting at `now` and returns a `StepResult` whose events happen at
`now + duration` (the simulator advances virtual time by it, the server sleeps it), or None
when the replica has nothing to do. Same inputs, same event trace, in both drivers.

An iteration: (1) admit — first preempted jobs waiting to resume on this replica, then jobs from
the policy, the more urgent tier first — while batch slots (`max_num_seqs`), KV blocks and the
step's token budget (`max_num_batched_tokens`) allow, preempting lower-tier jobs if configured
(see preemption.py); every `admit_every` steps, or whenever nothing is decoding; (2) give the
budget to decoding sequences (one token each) and then to prefill chunks in admission order
(chunked prefill), or, without chunked prefill, run a prefill-only round that pauses decoding
(S-LoRA); (3) cost the step with the profile, plus what was charged to it (`extra_ns`: KV
swap traffic, the profile's `front_end_core_ms` of each request that arrived while the
replica ran others, and its `idle_wake_ms` when the step starts a replica that had nothing to
run for `idle_after_ms` or longer); (4) emit tokens, completions and preemptions.

KV memory is paged in blocks (`block_size`, 16 by default) and reserved at admission for the
prompt plus max output (reservation admission, as in S-LoRA/VTC's evaluation), so a running job
never runs out mid-decode; KV pressure shows up as waiting, or as preemption of lower tiers.

Speed. A step must not touch every running sequence: the running context total is kept
incrementally (+B per decode step), completions are a heap keyed by the *decode-step index* at
which each job emits its last token, per-tenant decode counts make service charging O(tenants),
and token times are not stored per token but recovered from the replica's array of decode-step
end times. A job's output is one or more segments: a lead token (its first, or the one a
recompute's prefill yields) and a run of decode steps; preempted jobs keep the list."""

from __future__ import annotations

import heapq
from collections import deque

from reference_scheduler.core.admission import Admission, AdmissionSpec, refuse_too_long
from reference_scheduler.core.costmodel import StepNoise
from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Policy, Verdict
from reference_scheduler.core.preemption import Preemption, PreemptionSpec
from reference_scheduler.core.prefix_cache import PrefixCache
from reference_scheduler.scheduler.config import SchedulerConfig
from reference_scheduler.scheduler.control import Control
from reference_scheduler.scheduler.passover import PassOver, wait_ends, wait_from


class StepResult:
    """What one iteration did. Reused per replica: read it before stepping that replica again."""

    __slots__ = (
        "admitted",
        "duration_ns",
        "end_ns",
        "finished",
        "first_tokens",
        "n_decode",
        "n_prefill",
        "preempted",
        "replica",
        "start_ns",
    )

    def __init__(self, replica: int) -> None:
        self.replica = replica
        self.start_ns = 0
        self.end_ns = 0
        self.duration_ns = 0
        self.n_prefill = 0
        self.n_decode = 0
        self.admitted: list[Job] = []  # new or resumed
        self.first_tokens: list[Job] = []  # a token from a finished prefill (first or resumed)
        self.finished: list[Job] = []
        self.preempted: list[Job] = []


class Replica:
    __slots__ = (
        "batch",
        "context",
        "decode_ends",
        "decoding",
        "extra_ns",
        "finish_heap",
        "free_blocks",
        "index",
        "last_end_ns",
        "noise",
        "pending",
        "prefilling",
        "result",
        "resume",
        "running",
        "slots",
        "steps",
        "tenant_decode",
    )

    def __init__(self, index: int, blocks: int) -> None:
        self.index = index
        self.steps = 0  # iterations run
        self.decoding = 0  # decode steps run (the index tokens are keyed by)
        self.decode_ends: list[int] = []  # end time of each decode step
        self.batch = 0  # sequences decoding
        self.context = 0  # their total context tokens
        self.finish_heap: list[tuple[int, int, Job]] = []  # (last decode step, seq, job)
        self.prefilling: list[Job] = []
        self.pending = 0  # prefill tokens still to run for `prefilling`
        self.slots = 0
        self.free_blocks = blocks
        self.tenant_decode: dict[str, list] = {}  # tenant -> [decoding count, a job of it]
        self.running: dict[int, Job] = {}  # job id -> job, prefilling or decoding
        self.resume: list[tuple[int, int, Job]] = []  # (tier rank, seq, job) preempted here
        self.extra_ns = 0  # swap traffic and front-end core time charged to the next step
        self.last_end_ns: int | None = None  # when its last step ended (None: it never ran)
        self.result = StepResult(index)
        self.noise: StepNoise | None = None


class Engine:
    def __init__(
        self, config: SchedulerConfig, policy: Policy | None = None, *, keep_history: bool = True
    ) -> None:
        """`keep_history=False` is for the long-running server: the simulator needs every decode
        step's end time and the preemption log to rebuild token times afterwards, a server
        streams tokens as they happen and would only grow by ~40 bytes a step forever."""
        self.config = config
        self.profile = config.profile
        self.policy = policy if policy is not None else config.policy_factory()
        self.block_size = config.spec.block_size
        self.kv_blocks = config.kv_blocks
        self.max_model_len = config.max_model_len
        self.replicas = [Replica(i, self.kv_blocks) for i in range(config.replicas)]
        if not keep_history:
            for rep in self.replicas:
                rep.decode_ends = deque(maxlen=1)  # type: ignore[assignment]
        self.policy.bind(config.replicas * self.profile.max_num_seqs)
        self._uses_charge = bool(getattr(self.policy, "uses_charge", True))
        # optional: a policy may take a decode step's charges in one call (same order and sums)
        self._charge_decode = (
            getattr(self.policy, "charge_decode", None) if self._uses_charge else None
        )
        self._seq = 0
        self.passover = PassOver()  # who an admission pass left waiting (contention)
        noise = StepNoise.per_replica(
            config.spec.step_noise_cv, config.spec.seed, len(self.replicas)
        )
        for rep, stream in zip(self.replicas, noise, strict=True):
            rep.noise = stream
        spec = config.spec
        # Always present: with no limits it admits everything and just keeps the waiting counts
        # per tenant and class that the metrics report.
        self.admission = Admission(spec.admission or AdmissionSpec())
        self.cache = PrefixCache(spec.prefix_cache, self.block_size) if spec.prefix_cache else None
        self.preemption = Preemption(
            spec.preemption or PreemptionSpec(), self.profile.kv_bytes_per_token
        )
        if not keep_history:
            self.preemption.log = deque(maxlen=1024)  # type: ignore[assignment]
        self.tier_ranks = sorted(spec.tier_ranks.items(), key=lambda kv: kv[1])
        # The front end's core time per request (costmodel): one replica pays it when a request
        # arrives while it runs others, as vLLM mode does; with several, a request's replica is
        # known only at admission, so the replica that admits it pays if it ran others when
        # that admission pass began.
        self._steal_ns = round(self.profile.front_end_core_ms * 1e6)
        self._steal_at_arrival = len(self.replicas) == 1
        self._wake_ns = round(self.profile.idle_wake_ms * 1e6)
        self._idle_after_ns = round(self.profile.idle_after_ms * 1e6)
        # the congestion and resource loops (control.py), when configured
        self.control = Control(spec.control, self.policy) if spec.control is not None else None
        self._granted: Job | None = None  # a job that preempted its own tier: it goes next
        # a pure decode step's cost: the batch's term per batch size, plus f per context token
        self._decode_cost = self.profile.decode_base_ms(1) is not None
        self._decode_base: dict[int, float] = {}
        self._f = self.profile.f

    # ------------------------------------------------------------------ requests

    def blocks_for(self, job: Job) -> int:
        return -(-(job.prompt_tokens + job.max_tokens) // self.block_size)

    def submit(self, job: Job, now_ns: int) -> Verdict:
        self._seq += 1
        job.seq = self._seq
        too_long = refuse_too_long(job, self.max_model_len, self.block_size, self.kv_blocks)
        if too_long is not None:
            return too_long
        if self.control is not None:
            refused = self.control.submit(job, now_ns)
            if refused is not None:
                job.status = "rejected"
                job.reject_code = refused.code
                job.retry_after_s = refused.retry_after_s
                return refused
        verdict = self.admission.enter(job, now_ns, self.policy)
        if verdict.accepted:
            self.passover.arrived(job)
        rep = self.replicas[0]
        if self._steal_ns and self._steal_at_arrival and verdict.accepted and rep.running:
            rep.extra_ns += self._steal_ns  # its front end ran beside the replica's steps
        return verdict

    def cancel(self, job: Job, now_ns: int) -> bool:
        """Stop a job wherever it is (client went away). True if it was still live."""
        if job.status == "waiting":
            self.policy.remove(job)
            self.admission.left_queue(job)
            wait_ends(job, now_ns)
        elif job.status == "running":
            rep = self.replicas[job.replica]
            self._take_off(rep, job)
            rep.slots -= 1
            rep.free_blocks += job.blocks
            self.policy.release(job, now_ns)
        elif job.status == "preempted":
            rep = self.replicas[job.replica]
            rep.resume = [e for e in rep.resume if e[2] is not job]
            heapq.heapify(rep.resume)
            rep.free_blocks += job.blocks  # cooperative pauses keep theirs; others hold 0
            wait_ends(job, now_ns)
        else:
            return False
        job.status = "cancelled"
        job.done_ns = now_ns
        return True

    def promote(self, job: Job, now_ns: int) -> bool:
        """Move a waiting job back up one tier (the explicit, counted inverse of demotion)."""
        if job.status != "waiting" or job.tier is None:
            return False
        self.policy.remove(job)
        self._set_tier(job, job.priority - 1)
        self.policy.enqueue(job, now_ns)
        self.preemption.promotions += 1
        return True

    # ------------------------------------------------------------------ preemption

    def _set_tier(self, job: Job, rank: int) -> None:
        names = [name for name, r in self.tier_ranks if r == rank]
        job.priority = rank
        job.tier = names[0] if names else job.tier
        if job.tier == job.slo_class:
            job.tier = None

    def _lower_rank(self, rank: int) -> int | None:
        lower = [r for _, r in self.tier_ranks if r > rank]
        return min(lower) if lower else None

    def _take_off(self, rep: Replica, job: Job) -> None:
        """Remove a running job from the replica's batch (prefilling or decoding)."""
        del rep.running[job.id]
        if job.prefill_left > 0 or job in rep.prefilling:
            rep.prefilling.remove(job)
            rep.pending -= job.prefill_left
            return
        done = rep.decoding - job.first_step  # decode steps this segment has run
        rep.finish_heap = [e for e in rep.finish_heap if e[2] is not job]
        heapq.heapify(rep.finish_heap)
        rep.batch -= 1
        rep.context -= job.prompt_tokens + job.generated + done
        self._untrack(rep, job)
        job.segments.append((rep.index, job.lead_ns, job.first_step, done))
        job.lead_ns = -1
        job.generated += done

    def _room(self, rep: Replica, cand: Job, need: int, now_ns: int) -> bool:
        """Make room for `cand` on `rep` by preempting lower tiers (the resource loop's quota
        lets a missing tenant preempt its own tier too; a policy's guarantees, tiered's floors,
        are kept), or demote it. True if the admission loop should look again."""
        pre = self.preemption
        cooperative = pre.spec.mode == "cooperative"
        control = self.control
        grant = control.may_preempt if control is not None else None
        victims = sorted(
            (
                j
                for j in rep.running.values()
                if j.priority > cand.priority
                or (grant and j.priority == cand.priority and grant(cand.tenant, j))
            ),
            key=lambda j: (-j.priority, -j.admit_ns, -j.seq),
        )
        if not victims:
            return False
        slots = rep.slots
        blocks = rep.free_blocks
        chosen: list[Job] = []
        protects = getattr(self.policy, "protects", None)
        for victim in victims:
            if slots < self.profile.max_num_seqs and need <= blocks:
                break
            if protects is not None and protects(victim, chosen, cand):
                continue
            chosen.append(victim)
            slots -= 1
            if not cooperative:
                blocks += victim.blocks
        if not (slots < self.profile.max_num_seqs and need <= blocks):
            return False  # even all lower-tier victims would not make room
        same = sum(1 for victim in chosen if victim.priority == cand.priority)
        if same and (control is None or same > control.credits.get(cand.tenant, 0)):
            return False  # more same-tier victims than the resource loop granted
        for victim in chosen:
            if pre.over_budget(victim.tenant, now_ns):
                lower = self._lower_rank(cand.priority)
                if lower is None:
                    return False
                self.policy.remove(cand)  # demote the waiting job instead of preempting
                self._set_tier(cand, lower)
                self.policy.enqueue(cand, now_ns)
                pre.demotions += 1
                pre.log.append((now_ns, "demote", cand.id, lower))
                return True
        for victim in chosen:
            self._preempt(rep, victim, now_ns)
        if same and control is not None:
            control.spend(cand.tenant, same)
            self._granted = cand  # its victims must not resume into the room made for it
        return True

    def _preempt(self, rep: Replica, victim: Job, now_ns: int) -> None:
        pre = self.preemption
        mode = pre.spec.mode
        self._take_off(rep, victim)
        computed = victim.prompt_tokens + victim.generated - victim.prefill_left
        rep.slots -= 1
        pre.log.append((now_ns, "preempt", victim.id, computed))
        if mode == "swap":
            pre.swap_out_bytes += computed * pre.kv_bytes_per_token
            rep.extra_ns += pre.swap_ns(computed)
            victim.swapped_tokens = computed
        if mode != "cooperative":
            rep.free_blocks += victim.blocks
            victim.blocks = 0
        if mode == "recompute":
            victim.prefill_left = 0  # everything computed is lost; recounted at resume
        victim.status = "preempted"
        victim.preemptions += 1
        wait_from(victim, now_ns)
        pre.record(victim.tenant, victim.slo_class, now_ns)
        self.policy.release(victim, now_ns)
        heapq.heappush(rep.resume, (victim.priority, victim.seq, victim))
        rep.result.preempted.append(victim)

    def _resume(self, rep: Replica, job: Job, now_ns: int) -> None:
        pre = self.preemption
        mode = pre.spec.mode
        if job.blocks == 0:
            job.blocks = self.blocks_for(job)
            rep.free_blocks -= job.blocks
        rep.slots += 1
        rep.running[job.id] = job
        job.status = "running"
        wait_ends(job, now_ns)
        self.policy.resumed(job, now_ns)
        rep.result.admitted.append(job)
        if mode == "recompute":
            context = job.prompt_tokens + job.generated
            cached = 0
            if self.cache is not None and job.block_hashes:
                cached = self.cache.match(job.block_hashes, context)
            job.prefill_left = context - cached
            pre.recompute_tokens += job.prefill_left
            pre.log.append((now_ns, "recompute", job.id, job.prefill_left))
        elif mode == "swap" and job.swapped_tokens:
            pre.swap_in_bytes += job.swapped_tokens * pre.kv_bytes_per_token
            rep.extra_ns += pre.swap_ns(job.swapped_tokens)
            pre.log.append((now_ns, "swap_in", job.id, job.swapped_tokens))
            job.swapped_tokens = 0
        if job.prefill_left > 0:
            rep.pending += job.prefill_left
            rep.prefilling.append(job)
        else:
            self._join_decode(rep, job)

    def _join_decode(self, rep: Replica, job: Job) -> None:
        """Decode from the next decode step on, until the job's last token."""
        job.first_step = rep.decoding
        rep.batch += 1
        rep.context += job.prompt_tokens + job.generated
        last = rep.decoding + (job.max_tokens - job.generated) - 1
        heapq.heappush(rep.finish_heap, (last, job.seq, job))
        entry = rep.tenant_decode.get(job.tenant)
        if entry is None:
            rep.tenant_decode[job.tenant] = [1, job]
        else:
            entry[0] += 1

    # ------------------------------------------------------------------ one iteration

    def _admit(self, rep: Replica, now_ns: int) -> None:
        policy = self.policy
        prof = self.profile
        chunked = prof.chunked_prefill
        cap = prof.max_num_batched_tokens
        budget = cap - rep.batch if chunked else cap
        preempting = self.preemption.enabled
        # several replicas: each job admitted now pays its front end if the replica ran others
        steal = 0 if self._steal_at_arrival or not rep.running else self._steal_ns
        # a replica that had nothing to run for idle_after_ms wakes up before its first job
        last = rep.last_end_ns
        idle = not rep.running and (last is None or now_ns - last >= self._idle_after_ns)
        wake = self._wake_ns if idle else 0
        while True:
            if chunked and rep.pending >= budget:
                break
            cand = policy.peek(now_ns) if len(policy) else None
            if (
                rep.resume
                and (cand is None or rep.resume[0][0] <= cand.priority)
                and (cand is None or cand is not self._granted)
            ):
                job = rep.resume[0][2]
                need = 0 if job.blocks else self.blocks_for(job)
                if rep.slots >= prof.max_num_seqs or need > rep.free_blocks:
                    break  # a resuming job waits for room; it never preempts
                heapq.heappop(rep.resume)
                self._resume(rep, job, now_ns)
                continue
            if cand is None:
                break
            if not chunked and rep.pending and rep.pending + cand.prompt_tokens > cap:
                break
            need = -(-(cand.prompt_tokens + cand.max_tokens) // self.block_size)
            if rep.slots >= prof.max_num_seqs or need > rep.free_blocks:
                if preempting and self._room(rep, cand, need, now_ns):
                    continue
                break
            got = policy.dequeue(now_ns)
            assert got is cand, f"{type(policy).__name__}: peek and dequeue disagree"
            self._granted = None
            self._start(rep, cand, need, now_ns)
            rep.extra_ns += steal + wake
            wake = 0
        self.passover.pass_ended(now_ns, len(policy))

    def _start(self, rep: Replica, job: Job, need: int, now_ns: int) -> None:
        rep.free_blocks -= need
        rep.slots += 1
        rep.running[job.id] = job
        job.blocks = need
        job.status = "running"
        job.replica = rep.index
        job.admit_ns = now_ns
        wait_ends(job, now_ns)
        self.admission.left_queue(job)
        if self.cache is not None and job.block_hashes:
            job.cached_tokens = self.cache.match(job.block_hashes, job.prompt_tokens)
        job.prefill_left = job.prompt_tokens - job.cached_tokens
        rep.pending += job.prefill_left
        rep.prefilling.append(job)
        rep.result.admitted.append(job)
        if self._uses_charge:
            self.policy.charge(job, now_ns, prefill=job.prompt_tokens)

    def _untrack(self, rep: Replica, job: Job) -> None:
        entry = rep.tenant_decode[job.tenant]
        entry[0] -= 1
        if entry[0] == 0:
            del rep.tenant_decode[job.tenant]

    def _finish(self, rep: Replica, job: Job, end: int) -> None:
        self.admission.finished(end)
        del rep.running[job.id]
        job.status = "finished"
        job.done_ns = end
        rep.slots -= 1
        rep.free_blocks += job.blocks
        self.policy.release(job, end)
        rep.result.finished.append(job)
        if self.control is not None:
            self.control.finished(job)

    def step(self, r: int, now_ns: int) -> StepResult | None:
        rep = self.replicas[r]
        prof = self.profile
        res = rep.result
        # Reused per replica (the driver reads it first); clearing an empty list is skipped,
        # since most steps emit nothing (issue 35: the per-step overhead is the simulator's cost).
        if res.admitted:
            res.admitted.clear()
        if res.first_tokens:
            res.first_tokens.clear()
        if res.finished:
            res.finished.clear()
        if res.preempted:
            res.preempted.clear()
        if self.control is not None:
            self.control.step(now_ns, len(self.policy))
        if (rep.resume or len(self.policy)) and (
            rep.batch == 0 or rep.steps % prof.admit_every == 0
        ):
            self._admit(rep, now_ns)

        # Compose the iteration.
        n = 0
        done = 0
        prefilling = rep.prefilling
        if not prefilling:
            decoding = rep.batch
        elif prof.chunked_prefill:
            decoding = rep.batch
            room = prof.max_num_batched_tokens - decoding
            for job in prefilling:
                if room <= 0:
                    break
                chunk = job.prefill_left if job.prefill_left < room else room
                job.prefill_left -= chunk
                room -= chunk
                n += chunk
                if job.prefill_left == 0:
                    done += 1
        else:
            decoding = 0
            for job in prefilling:
                n += job.prefill_left
                job.prefill_left = 0
            done = len(prefilling)
        extra = rep.extra_ns
        if n == 0 and decoding == 0 and done == 0 and not extra:
            return None

        if n == 0 and decoding and self._decode_cost:
            # a pure decode step: the batch's term, kept per batch size, plus the context's
            # (costmodel.Profile.decode_base_ms: the same float operations as step_ms)
            base = self._decode_base.get(decoding)
            if base is None:
                base = self._decode_base[decoding] = prof.decode_base_ms(decoding)
            ms = base + self._f * rep.context
        else:
            ms = prof.step_ms(n, decoding, rep.context)
        if rep.noise is not None:
            ms *= rep.noise()
        duration = (int(ms * 1e6) or 1) + extra
        rep.extra_ns = 0
        end = now_ns + duration
        rep.last_end_ns = end
        rep.steps += 1
        rep.pending -= n
        res.start_ns = now_ns
        res.end_ns = end
        res.duration_ns = duration
        res.n_prefill = n
        res.n_decode = decoding

        if decoding:
            k = rep.decoding
            rep.decoding = k + 1
            rep.decode_ends.append(end)
            rep.context += decoding
            if self._charge_decode is not None:  # the policy's loop, one call (vtc, lcf)
                self._charge_decode(rep.tenant_decode.values(), end)
            elif self._uses_charge:
                charge = self.policy.charge
                for count, job in rep.tenant_decode.values():
                    charge(job, end, 0, count)
            heap = rep.finish_heap
            while heap and heap[0][0] == k:
                job = heapq.heappop(heap)[2]
                job.last_step = k
                rep.batch -= 1
                rep.context -= job.prompt_tokens + job.max_tokens
                self._untrack(rep, job)
                if job.segments:
                    job.segments.append((r, job.lead_ns, job.first_step, k + 1 - job.first_step))
                self._finish(rep, job, end)

        if done:
            first = prefilling[:done]
            del prefilling[:done]
            cache = self.cache
            for job in first:
                res.first_tokens.append(job)
                if job.generated == 0:
                    job.first_token_ns = end
                    if cache is not None and job.block_hashes:  # its prompt's blocks now exist
                        cache.insert(
                            job.block_hashes[: job.prompt_tokens // self.block_size], job.slo_class
                        )
                job.lead_ns = end
                if job.max_tokens == 0 or job.generated + 1 >= job.max_tokens:
                    if job.segments:
                        job.segments.append((r, end, rep.decoding, 0))
                    job.generated = job.max_tokens
                    self._finish(rep, job, end)
                    continue
                job.generated += 1
                self._join_decode(rep, job)
                if self._uses_charge:
                    self.policy.charge(job, end, 0, 1)
        return res

    def busy(self, r: int) -> bool:
        rep = self.replicas[r]
        return bool(rep.batch or rep.prefilling or rep.resume)

    def decoding_jobs(self, r: int) -> list[Job]:
        """Jobs still decoding that produced a token in replica r's last decode step; those that
        finished in it are in that step's `finished` (server streaming)."""
        rep = self.replicas[r]
        return [e[2] for e in rep.finish_heap if e[2].first_step < rep.decoding]
