"""The continuous-batching engine: a pure state machine, no clock inside.

One global policy queue feeds W replicas. `submit(job, now)` enqueues; `step(r, now)` runs one
iteration of replica r starting at `now` and returns a `StepResult` whose events happen at
`now + duration` (the simulator advances virtual time by it, the server sleeps it), or None
when the replica has nothing to do. Same inputs, same event trace, in both drivers.

An iteration: (1) admit jobs from the policy while batch slots (`max_num_seqs`), KV blocks and
the step's token budget (`max_num_batched_tokens`) allow — every `admit_every` steps, or whenever
nothing is decoding; (2) give the budget to decoding sequences (one token each) and then to
prefill chunks in admission order (chunked prefill), or, without chunked prefill, run a
prefill-only round that pauses decoding (S-LoRA); (3) cost the step with the profile; (4) emit
first tokens and completions.

KV memory is paged in blocks (`block_size`, 16 by default) and reserved at admission for the
prompt plus max output (reservation admission, as in S-LoRA/VTC's evaluation), so a running job
never runs out mid-decode. vLLM allocates lazily and preempts on exhaustion instead; that
belongs with the preemption modes.

Speed. A step must not touch every running sequence: the running context total is kept
incrementally (+B per decode step), completions are a heap keyed by the *decode-step index* at
which each job emits its last token, per-tenant decode counts make service charging O(tenants),
and token times are not stored per token but recovered from the replica's array of decode-step
end times (token j ≥ 2 of a job lands at the end of decode step `first_step + j − 2`).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from reference_scheduler.admission import Admission
from reference_scheduler.config import SchedulerConfig
from reference_scheduler.job import Job
from reference_scheduler.policy import Policy, Verdict
from reference_scheduler.prefix_cache import PrefixCache


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
        self.admitted: list[Job] = []
        self.first_tokens: list[Job] = []
        self.finished: list[Job] = []


class Replica:
    __slots__ = (
        "batch",
        "context",
        "decode_ends",
        "decoding",
        "finish_heap",
        "free_blocks",
        "index",
        "noise",
        "noise_at",
        "pending",
        "prefilling",
        "result",
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
        self.result = StepResult(index)
        self.noise: np.ndarray | None = None
        self.noise_at = 0


class Engine:
    def __init__(self, config: SchedulerConfig, policy: Policy | None = None) -> None:
        self.config = config
        self.profile = config.profile
        self.policy = policy if policy is not None else config.policy_factory()
        self.block_size = config.spec.block_size
        self.kv_blocks = config.kv_blocks
        self.max_model_len = config.max_model_len
        self.replicas = [Replica(i, self.kv_blocks) for i in range(config.replicas)]
        self.policy.bind(config.replicas * self.profile.max_num_seqs)
        self._uses_charge = bool(getattr(self.policy, "uses_charge", True))
        self._seq = 0
        cv = config.spec.step_noise_cv
        self._noise_sigma = math.sqrt(math.log1p(cv * cv)) if cv > 0 else 0.0
        self._noise_rng = np.random.default_rng(config.spec.seed)
        spec = config.spec
        self.admission = Admission(spec.admission) if spec.admission else None
        self.cache = PrefixCache(spec.prefix_cache, self.block_size) if spec.prefix_cache else None

    # ------------------------------------------------------------------ requests

    def blocks_for(self, job: Job) -> int:
        return -(-(job.prompt_tokens + job.max_tokens) // self.block_size)

    def submit(self, job: Job, now_ns: int) -> Verdict:
        self._seq += 1
        job.seq = self._seq
        total = job.prompt_tokens + job.max_tokens
        if total > self.max_model_len or self.blocks_for(job) > self.kv_blocks:
            job.status = "rejected"
            job.reject_code = 400
            return Verdict(False, 400, 0, "context_length_exceeded")
        if self.admission is not None:
            refusal = self.admission.check(job, now_ns)
            if refusal is not None:  # never enters the scheduler
                job.status = "rejected"
                job.reject_code = refusal.code
                job.retry_after_s = refusal.retry_after_s
                return refusal
        verdict = self.policy.enqueue(job, now_ns)
        if not verdict.accepted:
            job.status = "rejected"
            job.reject_code = verdict.code
            job.retry_after_s = verdict.retry_after_s
        elif self.admission is not None:
            self.admission.entered(job)
        return verdict

    def cancel(self, job: Job, now_ns: int) -> bool:
        """Stop a job wherever it is (client went away). True if it was still live."""
        if job.status == "waiting":
            self.policy.remove(job)
            if self.admission is not None:
                self.admission.left_queue(job)
        elif job.status == "running":
            rep = self.replicas[job.replica]
            if job in rep.prefilling:
                rep.prefilling.remove(job)
                rep.pending -= job.prefill_left
            else:
                rep.finish_heap = [e for e in rep.finish_heap if e[2] is not job]
                heapq.heapify(rep.finish_heap)
                rep.batch -= 1
                rep.context -= job.prompt_tokens + self._generated(job, rep)
                self._untrack(rep, job)
            rep.slots -= 1
            rep.free_blocks += job.blocks
            self.policy.release(job, now_ns)
        else:
            return False
        job.status = "cancelled"
        job.done_ns = now_ns
        return True

    @staticmethod
    def _generated(job: Job, rep: Replica) -> int:
        return 1 + rep.decoding - job.first_step if job.first_step >= 0 else 0

    # ------------------------------------------------------------------ one iteration

    def _admit(self, rep: Replica, now_ns: int) -> None:
        policy = self.policy
        prof = self.profile
        chunked = prof.chunked_prefill
        cap = prof.max_num_batched_tokens
        budget = cap - rep.batch if chunked else cap
        admitted = rep.result.admitted
        while rep.slots < prof.max_num_seqs:
            if chunked and rep.pending >= budget:
                break
            job = policy.peek(now_ns)
            if job is None:
                break
            if not chunked and rep.pending and rep.pending + job.prompt_tokens > cap:
                break
            need = -(-(job.prompt_tokens + job.max_tokens) // self.block_size)
            if need > rep.free_blocks:
                break
            got = policy.dequeue(now_ns)
            assert got is job, f"{type(policy).__name__}: peek and dequeue disagree"
            rep.free_blocks -= need
            rep.slots += 1
            job.blocks = need
            job.status = "running"
            job.replica = rep.index
            job.admit_ns = now_ns
            if self.admission is not None:
                self.admission.left_queue(job)
            if self.cache is not None and job.block_hashes:
                job.cached_tokens = self.cache.match(job.block_hashes, job.prompt_tokens)
            job.prefill_left = job.prompt_tokens - job.cached_tokens
            rep.pending += job.prefill_left
            rep.prefilling.append(job)
            admitted.append(job)
            if self._uses_charge:
                policy.charge(job, now_ns, prefill=job.prompt_tokens)

    def _untrack(self, rep: Replica, job: Job) -> None:
        entry = rep.tenant_decode[job.tenant]
        entry[0] -= 1
        if entry[0] == 0:
            del rep.tenant_decode[job.tenant]

    def _finish(self, rep: Replica, job: Job, end: int) -> None:
        if self.admission is not None:
            self.admission.finished(end)
        job.status = "finished"
        job.done_ns = end
        rep.slots -= 1
        rep.free_blocks += job.blocks
        self.policy.release(job, end)
        rep.result.finished.append(job)

    def step(self, r: int, now_ns: int) -> StepResult | None:
        rep = self.replicas[r]
        prof = self.profile
        res = rep.result
        res.admitted.clear()
        res.first_tokens.clear()
        res.finished.clear()
        if len(self.policy) and (rep.batch == 0 or rep.steps % prof.admit_every == 0):
            self._admit(rep, now_ns)

        # Compose the iteration.
        n = 0
        done = 0
        prefilling = rep.prefilling
        if prof.chunked_prefill:
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
        elif prefilling:
            decoding = 0
            for job in prefilling:
                n += job.prefill_left
                job.prefill_left = 0
            done = len(prefilling)
        else:
            decoding = rep.batch
        if n == 0 and decoding == 0 and done == 0:
            return None

        ms = prof.step_ms(n, decoding, rep.context)
        if self._noise_sigma:
            ms *= self._noise(rep)
        duration = int(ms * 1e6) or 1
        end = now_ns + duration
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
            if self._uses_charge:
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
                self._finish(rep, job, end)

        if done:
            first = prefilling[:done]
            del prefilling[:done]
            cache = self.cache
            for job in first:
                job.first_token_ns = end
                if cache is not None and job.block_hashes:  # its prompt's blocks now exist
                    cache.insert(
                        job.block_hashes[: job.prompt_tokens // self.block_size], job.slo_class
                    )
                res.first_tokens.append(job)
                if job.max_tokens <= 1:
                    self._finish(rep, job, end)
                    continue
                job.first_step = rep.decoding
                rep.batch += 1
                rep.context += job.prompt_tokens + 1
                heapq.heappush(rep.finish_heap, (rep.decoding + job.max_tokens - 2, job.seq, job))
                entry = rep.tenant_decode.get(job.tenant)
                if entry is None:
                    rep.tenant_decode[job.tenant] = [1, job]
                else:
                    entry[0] += 1
                if self._uses_charge:
                    self.policy.charge(job, end, 0, 1)
        return res

    def _noise(self, rep: Replica) -> float:
        if rep.noise is None or rep.noise_at >= len(rep.noise):
            sigma = self._noise_sigma
            rep.noise = self._noise_rng.lognormal(-0.5 * sigma * sigma, sigma, 4096)
            rep.noise_at = 0
        value = float(rep.noise[rep.noise_at])
        rep.noise_at += 1
        return value

    def busy(self, r: int) -> bool:
        rep = self.replicas[r]
        return bool(rep.batch or rep.prefilling)

    def decoding_jobs(self, r: int) -> list[Job]:
        """Jobs still decoding that produced a token in replica r's last decode step; those that
        finished in it are in that step's `finished` (server streaming)."""
        rep = self.replicas[r]
        return [e[2] for e in rep.finish_heap if e[2].first_step < rep.decoding]
