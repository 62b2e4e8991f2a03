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
incrementally (+B per decode step), completions are buckets keyed by the *decode-step index* at
which each job emits its last token (a dict pop per decode step; a bucket of several finishes in
submission order, as a heap of (step, seq) did), per-tenant decode counts make service charging
O(tenants), and token times are not stored per token but recovered from the replica's array of
decode-step end times. A job's output is one or more segments: a lead token (its first, or the
one a recompute's prefill yields) and a run of decode steps; preempted jobs keep the list.

Per request the simulator runs this file's code a few times (submit, an admission, a first
token, a finish) and a step about once, so its cost is Python's per call and per attribute
(issue 35: about 8 µs of CPU a request on the fleet): the hot paths inline what they would
call (Admission's counts, passover, JobQueue, the job's start and finish), take the job the
policy just peeked (`take`), skip calls that do nothing (BasePolicy's release) and sum what
several jobs change before storing it once. Each shortcut is pinned against what it replaces
in tests/test_engine_fast_paths.py; the golden outputs pin whole runs."""

from __future__ import annotations

import heapq
from collections import deque
from operator import attrgetter

from reference_scheduler.core.admission import Admission, AdmissionSpec, refuse_too_long
from reference_scheduler.core.costmodel import StepNoise
from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Policy, Verdict, policy_hook
from reference_scheduler.core.preemption import Preemption, PreemptionSpec
from reference_scheduler.core.prefix_cache import PrefixCache
from reference_scheduler.scheduler.config import SchedulerConfig
from reference_scheduler.scheduler.control import Control
from reference_scheduler.scheduler.passover import PassOver, wait_ends
from reference_scheduler.scheduler.preempting import Preempting
from reference_scheduler.scheduler.replica import Replica, StepResult

_by_seq = attrgetter("seq")


class Engine(Preempting):
    def __init__(
        self,
        config: SchedulerConfig,
        policy: Policy | None = None,
        *,
        keep_history: bool = True,
        group_counts: bool = True,
    ) -> None:
        """`keep_history=False` is for the long-running server: the simulator needs every decode
        step's end time and the preemption log to rebuild token times afterwards, a server
        streams tokens as they happen and would only grow by ~40 bytes a step forever.
        `group_counts=False` is for the simulator: the waiting counts per tenant and class
        (`admission.by_tenant`, `by_class`) are for the server's /metrics and for admission
        limits; with no limits and nobody to read them, two Counter updates a request each way
        are skipped (issue 35). `admission.waiting` is always kept."""
        self.config = config
        self.profile = config.profile
        self.policy = policy if policy is not None else config.policy_factory()
        self.block_size = config.spec.block_size
        self.kv_blocks = config.kv_blocks
        self.max_model_len = config.max_model_len
        # the most tokens a job may need: within the context, and ceil(tokens / block_size) KV
        # blocks within the pool (<=> tokens <= kv_blocks * block_size); one compare a request
        self._fits = min(self.max_model_len, self.kv_blocks * self.block_size)
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
        self._fresh = self.passover.fresh  # the same list: pass_ended clears it in place
        # Per-request calls skipped where they would do nothing (issue 35): a policy's
        # `release` that is BasePolicy's no-op, and `dequeue` after `peek` when the policy can
        # take the job it just peeked without looking again (`take`).
        self._release = policy_hook(self.policy, "release")
        self._take = getattr(self.policy, "take", None)
        noise = StepNoise.per_replica(
            config.spec.step_noise_cv, config.spec.seed, len(self.replicas)
        )
        for rep, stream in zip(self.replicas, noise, strict=True):
            rep.noise = stream
        spec = config.spec
        # Always present: with no limits it admits everything and just keeps the waiting counts
        # per tenant and class that the metrics report.
        self.admission = Admission(spec.admission or AdmissionSpec())
        # per tenant and class counts skipped only without limits (a simulation's spec is fixed)
        self._skip_counts = not group_counts and self.admission.open_for is not None
        self.cache = PrefixCache(spec.prefix_cache, self.block_size) if spec.prefix_cache else None
        self.preemption = Preemption(
            spec.preemption or PreemptionSpec(), self.profile.kv_bytes_per_token
        )
        if not keep_history:
            self.preemption.log = deque(maxlen=1024)  # type: ignore[assignment]
        self._preempting = self.preemption.enabled  # a property: read once, not per pass
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
        if job.prompt_tokens + job.max_tokens > self._fits:
            return refuse_too_long(job, self.max_model_len, self.block_size, self.kv_blocks)  # type: ignore[return-value]
        if self.control is not None:
            refused = self.control.submit(job, now_ns)
            if refused is not None:
                job.status = "rejected"
                job.reject_code = refused.code
                job.retry_after_s = refused.retry_after_s
                return refused
        adm = self.admission
        if adm.open_for is adm.spec:
            # no admission limits: `Admission.enter` without its checks, inlined (it runs once
            # per request; issue 35)
            verdict = self.policy.enqueue(job, now_ns)
            if verdict.accepted:
                adm.waiting += 1
                if not self._skip_counts:
                    adm.by_tenant[job.tenant] += 1
                    adm.by_class[job.slo_class] += 1
            else:
                job.status = "rejected"
                job.reject_code = verdict.code
                job.retry_after_s = verdict.retry_after_s
                return verdict
        else:
            verdict = adm.enter(job, now_ns, self.policy)
            if not verdict.accepted:
                return verdict
        self._fresh.append(job)  # passover.arrived
        if self._steal_ns and self._steal_at_arrival and self.replicas[0].running:
            self.replicas[0].extra_ns += self._steal_ns  # its front end ran beside the steps
        return verdict

    def cancel(self, job: Job, now_ns: int) -> bool:
        """Stop a job wherever it is (client went away). True if it was still live."""
        if job.status == "waiting":
            self.policy.remove(job)
            if self._skip_counts:
                self.admission.waiting -= 1
            else:
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

    def _join_decode(self, rep: Replica, job: Job) -> None:
        """Decode from the next decode step on, until the job's last token."""
        job.first_step = rep.decoding
        rep.batch += 1
        rep.context += job.prompt_tokens + job.generated
        last = rep.decoding + (job.max_tokens - job.generated) - 1
        bucket = rep.finish_at.get(last)
        if bucket is None:
            rep.finish_at[last] = [job]
        else:
            bucket.append(job)
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
        max_seqs = prof.max_num_seqs
        block_size = self.block_size
        budget = cap - rep.batch if chunked else cap
        preempting = self._preempting
        take = self._take
        adm = self.admission  # its `waiting` is len(policy), without a call (see step)
        skip_counts = self._skip_counts
        charge = policy.charge if self._uses_charge else None
        cache = self.cache
        running = rep.running
        prefilling = rep.prefilling
        admitted = rep.result.admitted
        index = rep.index
        # several replicas: each job admitted now pays its front end if the replica ran others
        steal = 0 if self._steal_at_arrival or not rep.running else self._steal_ns
        # a replica that had nothing to run for idle_after_ms wakes up before its first job
        last = rep.last_end_ns
        idle = not rep.running and (last is None or now_ns - last >= self._idle_after_ns)
        wake = self._wake_ns if idle else 0
        while True:
            if chunked and rep.pending >= budget:
                break
            cand = policy.peek(now_ns) if adm.waiting else None
            if (
                rep.resume
                and (cand is None or rep.resume[0][0] <= cand.priority)
                and (cand is None or cand is not self._granted)
            ):
                job = rep.resume[0][2]
                need = 0 if job.blocks else self.blocks_for(job)
                if rep.slots >= max_seqs or need > rep.free_blocks:
                    break  # a resuming job waits for room; it never preempts
                heapq.heappop(rep.resume)
                self._resume(rep, job, now_ns)
                continue
            if cand is None:
                break
            if not chunked and rep.pending and rep.pending + cand.prompt_tokens > cap:
                break
            need = -(-(cand.prompt_tokens + cand.max_tokens) // block_size)
            if rep.slots >= max_seqs or need > rep.free_blocks:
                if preempting and self._room(rep, cand, need, now_ns):
                    continue
                break
            if take is not None:
                take(cand, now_ns)  # the policy's dequeue of what it just peeked
            else:
                got = policy.dequeue(now_ns)
                assert got is cand, f"{type(policy).__name__}: peek and dequeue disagree"
            self._granted = None
            # start it (inlined: once per request)
            rep.free_blocks -= need
            rep.slots += 1
            running[cand.id] = cand
            cand.blocks = need
            cand.status = "running"
            cand.replica = index
            cand.admit_ns = now_ns
            if cand.wait_since_ns >= 0:  # passover.wait_ends
                cand.backlog_ns += now_ns - cand.wait_since_ns
                cand.wait_since_ns = -1
            adm.waiting -= 1  # Admission.left_queue
            if not skip_counts:
                adm.by_tenant[cand.tenant] -= 1
                adm.by_class[cand.slo_class] -= 1
            if cache is not None and cand.block_hashes:
                cand.cached_tokens = cache.match(cand.block_hashes, cand.prompt_tokens)
            cand.prefill_left = left = cand.prompt_tokens - cand.cached_tokens
            rep.pending += left
            prefilling.append(cand)
            admitted.append(cand)
            if charge is not None:
                charge(cand, now_ns, cand.prompt_tokens)  # its prefill, passed by position
            rep.extra_ns += steal + wake
            wake = 0
        if admitted:
            rep.result.dirty = True
        if self._fresh:
            self.passover.pass_ended(now_ns, len(policy))

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
        if self._release is not None:
            self._release(job, end)
        rep.result.finished.append(job)
        rep.result.dirty = True
        if self.control is not None:
            self.control.finished(job)

    def step(self, r: int, now_ns: int) -> StepResult | None:
        rep = self.replicas[r]
        prof = self.profile
        res = rep.result
        # Reused per replica (the driver reads it first); clearing an empty list is skipped,
        # since most steps emit nothing (issue 35: the per-step overhead is the simulator's cost).
        if res.dirty:  # one check for the four lists: most steps emit nothing
            res.dirty = False
            res.admitted.clear()
            res.first_tokens.clear()
            res.finished.clear()
            res.preempted.clear()
        if self.control is not None:
            self.control.step(now_ns, len(self.policy))
        # admission.waiting is len(policy): every job enters the policy through submit (counted
        # when accepted; no policy refuses one) and leaves by _start or cancel (counted down);
        # promote and demote re-enqueue what they removed. Read here, it spares a Python
        # `__len__` call per step (tests/test_engine_fast_paths.py checks the two agree).
        if (rep.resume or self.admission.waiting) and (
            rep.batch == 0 or rep.steps % prof.admit_every == 0
        ):
            self._admit(rep, now_ns)

        # Compose the iteration.
        prefilling = rep.prefilling
        extra = rep.extra_ns
        n = 0
        done = 0
        if not prefilling:
            decoding = rep.batch
            if not decoding and not extra:
                return None  # nothing to run (the check below, for the common case)
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
        if n:
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
            ending = rep.finish_at.pop(k, None)
            if ending is not None:
                self._finish_decoding(rep, ending, k, end)

        if done:
            self._first_tokens(rep, prefilling, done, end)
        return res

    def _finish_decoding(self, rep: Replica, ending: list[Job], k: int, end: int) -> None:
        """The jobs whose last token is decode step k's, in submission order (`_finish`,
        inlined per job)."""
        if len(ending) > 1:
            ending.sort(key=_by_seq)
        r = rep.index
        tenant_decode = rep.tenant_decode
        running = rep.running
        finished = rep.result.finished
        rep.result.dirty = True
        finishes = self.admission.finish_times
        horizon = end - 10_000_000_000  # Admission.finished's window, inlined
        release = self._release
        control = self.control
        gone = 0  # the context the finished jobs held, blocks they free: summed, stored once
        blocks = 0
        for job in ending:
            job.last_step = k
            gone += job.prompt_tokens + job.max_tokens
            entry = tenant_decode[job.tenant]  # _untrack
            entry[0] -= 1
            if entry[0] == 0:
                del tenant_decode[job.tenant]
            if job.segments:
                job.segments.append((r, job.lead_ns, job.first_step, k + 1 - job.first_step))
            finishes.append(end)
            del running[job.id]
            job.status = "finished"
            job.done_ns = end
            blocks += job.blocks
            if release is not None:
                release(job, end)
            finished.append(job)
            if control is not None:
                control.finished(job)
        while finishes[0] < horizon:
            finishes.popleft()
        rep.batch -= len(ending)
        rep.slots -= len(ending)
        rep.context -= gone
        rep.free_blocks += blocks

    def _first_tokens(self, rep: Replica, prefilling: list[Job], done: int, end: int) -> None:
        """The `done` jobs at the head of `prefilling` finished their prefill in this step: each
        yields a token, then decodes from the next decode step on, or finishes."""
        first = prefilling[:done]
        del prefilling[:done]
        cache = self.cache
        firsts = rep.result.first_tokens
        rep.result.dirty = True
        charge = self.policy.charge if self._uses_charge else None
        decoding = rep.decoding
        finish_at = rep.finish_at
        firsts.extend(first)
        joined = 0  # sequences that start decoding, and their context: stored once
        context = 0
        for job in first:
            generated = job.generated
            if generated == 0:
                job.first_token_ns = end
                if cache is not None and job.block_hashes:  # its prompt's blocks now exist
                    cache.insert(
                        job.block_hashes[: job.prompt_tokens // self.block_size], job.slo_class
                    )
            job.lead_ns = end
            max_tokens = job.max_tokens
            if max_tokens == 0 or generated + 1 >= max_tokens:
                if job.segments:
                    job.segments.append((rep.index, end, decoding, 0))
                job.generated = max_tokens
                self._finish(rep, job, end)
                continue
            job.generated = generated = generated + 1
            # _join_decode, inlined: decode from the next decode step on, until the last token
            job.first_step = decoding
            joined += 1
            context += job.prompt_tokens + generated
            last = decoding + max_tokens - generated - 1
            bucket = finish_at.get(last)
            if bucket is None:
                finish_at[last] = [job]
            else:
                bucket.append(job)
            entry = rep.tenant_decode.get(job.tenant)
            if entry is None:
                rep.tenant_decode[job.tenant] = [1, job]
            else:
                entry[0] += 1
            if charge is not None:
                charge(job, end, 0, 1)
        rep.batch += joined
        rep.context += context

    def busy(self, r: int) -> bool:
        rep = self.replicas[r]
        return bool(rep.batch or rep.prefilling or rep.resume)

    def decoding_jobs(self, r: int) -> list[Job]:
        """Jobs still decoding that produced a token in replica r's last decode step; those that
        finished in it are in that step's `finished` (server streaming)."""
        rep = self.replicas[r]
        return [
            j for bucket in rep.finish_at.values() for j in bucket if j.first_step < rep.decoding
        ]
