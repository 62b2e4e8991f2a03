"""vLLM V1's own request scheduling, as a simulated engine (`scheduler: {engine: vllm}`).

Why it exists: `engine.Engine` runs this package's policies with reservation admission, which
is how S-LoRA and the VTC evaluation admit, not how vLLM does. A scenario that asks "what would
vLLM itself do with this load" needs vLLM's rules, so this engine follows vLLM V1's scheduler
rule by rule (learned from the source, not copied; file paths are in vllm-project/vllm):

* The waiting queue (vllm/v1/core/sched/request_queue.py). `fcfs`: a deque, new requests at the
  tail, a preempted request pushed back at the head (`prepend_request`). `priority`: a heap
  ordered by (priority, arrival time), lower first; a preempted request re-enters the heap by
  the same order (a priority queue has no head to prepend to). Ties break by submission order.
* One step (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`). A token budget of
  `max_num_batched_tokens`. RUNNING requests first, in running order: each is given
  `min(tokens not yet computed, budget)` tokens (1 for a decode, a chunk for a prefill) and KV
  blocks for them; then, only if nothing was preempted in this step, WAITING requests in queue
  order while the budget lasts and fewer than `max_num_seqs` run. Without chunked prefill a
  waiting request whose prompt exceeds the remaining budget stops the waiting loop, and so does
  a waiting request whose blocks do not fit (`allocate_slots` returns None: `break`). Checked
  against vllm/v1/core/sched/scheduler.py at commit 00024d314514900f361ad072af6931e403b7f589
  (December 2026): V1 does *not* skip a head that does not fit and go on to the next. It
  skips (`skipped_waiting_requests`, put back at the head after the loop) only a request
  waiting for remote KV, for its grammar's compilation or for a streaming input, or over the
  LoRA limit, none of which the model has; the running loop `continue`s past a request with
  no tokens to schedule (pipeline parallelism, async scheduling), which the model has not
  either. So the rule here stays `break`, and tests/test_sim_vllm.py pins it.
* KV blocks (vllm/v1/core/kv_cache_manager.py, `allocate_slots`). Blocks are allocated as
  tokens are scheduled: a request holds ceil(computed tokens / block_size) blocks, not its
  prompt plus max output up front; an allocation that does not fit fails.
* Preemption by recompute (`Scheduler.schedule` and `_preempt_request`). When a running
  request's allocation fails, vLLM preempts, until it fits, the lowest-priority running request
  (largest (priority, arrival time)) under `priority`, or the last request in the running list
  (the most recently scheduled) under `fcfs`; the victim's blocks are freed, its computed tokens
  drop to 0 and it goes back to the waiting queue, so on resumption it re-prefills its prompt and
  every token it had generated. If the victim is the request itself, that request waits and the
  running loop stops. A step that preempted admits no waiting request.
* A request whose computed tokens catch up with its tokens samples one new token at the step's
  end: the last prefill chunk yields the first token (or, after a recompute, the next one), every
  decode step one more; with ignore_eos semantics it finishes at `max_tokens`.

* Automatic prefix caching, with `scheduler: {engine: vllm, prefix_caching: true}` (off by
  default, as under `--no-enable-prefix-caching`, which the fidelity protocol runs with; on in
  vLLM's own default): the cache is the KV pool itself, shared blocks counted once, freed
  blocks cached until an allocation evicts them LRU (scheduler/vllm_cache.py has the rules). A
  waiting request's lookup happens when it reaches the head, before its blocks are counted, so
  a hit also lowers what it needs to fit. `cache_salt` is already in the request's hashes.

What is not modelled: caching of blocks filled by generated tokens, speculative decoding, async
scheduling, the KV watermark, `long_prefill_token_threshold`, structured output, LoRA limits,
data parallelism. The step's
time is the profile's cost of its prefill tokens and decode sequences, as for `engine.Engine`,
plus the profile's `front_end_core_ms` for every request that arrived while the engine was
running requests since the last step began: the core time its API server took from the steps
(a CPU engine's; costmodel says why); and its `idle_wake_ms` for the step that starts a request
which found the engine with nothing to do for `idle_after_ms` or longer (costmodel).

It emits the same `StepResult` events and keeps the same per-job fields, so the virtual driver
(`drivers/virtual.py`) and `fairbench`'s `sim` target run it unchanged. A job's tokens are kept
as runs of step indices in `job.segments` (a running request can sit out a step when the budget
runs out), read back through the replica's `decode_ends`, which here holds every step's end.

Speed: a step visits every running request, as vLLM's does (~2-3 µs each here), so it is
slower than `engine.Engine`, which never touches a decoding sequence per step; see
docs/simulator.md for the measured rates.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Any

from reference_scheduler.core.admission import refuse_too_long
from reference_scheduler.core.costmodel import StepNoise
from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Verdict
from reference_scheduler.scheduler.config import SchedulerConfig
from reference_scheduler.scheduler.engine import Engine, StepResult
from reference_scheduler.scheduler.passover import PassOver, wait_ends, wait_from
from reference_scheduler.scheduler.vllm_cache import BlockPool

ACCEPTED = Verdict(True)


class WaitingQueue:
    """vLLM's waiting queue for one scheduling policy (FCFS deque, or priority heap)."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._fcfs: deque[Job] = deque()
        self._heap: list[tuple[int, int, int, Job]] = []
        self.enqueued = 0

    def add(self, job: Job) -> None:
        self.enqueued += 1
        if self.policy == "priority":
            heapq.heappush(self._heap, (job.priority, job.arrival_ns, job.seq, job))
        else:
            self._fcfs.append(job)

    def prepend(self, job: Job) -> None:
        """A preempted request goes back in front (FCFS) or by its order (priority)."""
        if self.policy == "priority":
            heapq.heappush(self._heap, (job.priority, job.arrival_ns, job.seq, job))
        else:
            self._fcfs.appendleft(job)

    def peek(self) -> Job:
        return self._heap[0][3] if self.policy == "priority" else self._fcfs[0]

    def pop(self) -> Job:
        return heapq.heappop(self._heap)[3] if self.policy == "priority" else self._fcfs.popleft()

    def remove(self, job: Job) -> None:
        """A waiting (or preempted, waiting to resume) job leaves the queue: cancelled."""
        if self.policy == "priority":
            self._heap = [entry for entry in self._heap if entry[3] is not job]
            heapq.heapify(self._heap)
        else:
            self._fcfs.remove(job)

    def __iter__(self) -> Iterator[Job]:
        if self.policy == "priority":
            return (entry[3] for entry in sorted(self._heap))
        return iter(self._fcfs)

    def stats(self) -> dict[str, float]:
        return {"enqueued": self.enqueued, "waiting": len(self)}

    def __len__(self) -> int:
        return len(self._heap) if self.policy == "priority" else len(self._fcfs)


class VllmReplica:
    """One vLLM instance's state: the running list, the free KV blocks, the step history."""

    __slots__ = ("decode_ends", "free_blocks", "index", "noise", "result", "running", "stolen_ns")

    def __init__(self, index: int, blocks: int) -> None:
        self.index = index
        self.running: list[Job] = []  # vLLM's `self.running`, in scheduling order
        self.free_blocks = blocks
        self.decode_ends: list[int] = []  # the end time of every step (tokens index into it)
        self.result = StepResult(index)
        self.noise: StepNoise | None = None
        self.stolen_ns = 0  # the front end's core time taken since the last step began

    @property
    def steps(self) -> int:
        return len(self.decode_ends)

    @property
    def slots(self) -> int:
        return len(self.running)


class VllmEngine:
    """The vLLM V1 scheduling model; `step(0, now)` runs one engine step (see the module doc)."""

    def __init__(self, config: SchedulerConfig, *, keep_history: bool = True) -> None:
        """`keep_history` is accepted for the drivers' sake; every step's end time is kept
        because the simulator rebuilds token times from it."""
        self.config = config
        self.profile = config.profile
        self.block_size = config.spec.block_size
        self.kv_blocks = config.kv_blocks
        limit = config.max_model_len
        if not self.profile.chunked_prefill:  # vLLM: max_num_batched_tokens >= max_model_len
            limit = min(limit, self.profile.max_num_batched_tokens)
        self.max_model_len = limit
        self.policy = WaitingQueue(str(config.spec.policy))
        self.replicas = [VllmReplica(0, self.kv_blocks)]
        # vLLM's automatic prefix caching over the same blocks (vllm_cache.py); None: off
        self.pool = (
            BlockPool(self.kv_blocks, self.block_size) if config.spec.prefix_caching else None
        )
        self.log: list[tuple[int, str, int, int]] = []  # (t, preempt|recompute, job id, tokens)
        self.preemptions = 0
        self.recompute_tokens = 0
        self._seq = 0
        self.passover = PassOver()  # who a step left waiting (contention)
        self._steal_ns = round(self.profile.front_end_core_ms * 1e6)
        self._wake_ns = round(self.profile.idle_wake_ms * 1e6)
        self._idle_after_ns = round(self.profile.idle_after_ms * 1e6)
        noise = StepNoise.per_replica(
            config.spec.step_noise_cv, config.spec.seed, len(self.replicas)
        )
        for rep, stream in zip(self.replicas, noise, strict=True):
            rep.noise = stream

    # ------------------------------------------------------------------ requests

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def submit(self, job: Job, now_ns: int) -> Verdict:
        self._seq += 1
        job.seq = self._seq
        too_long = refuse_too_long(job, self.max_model_len, self.block_size, self.kv_blocks)
        if too_long is not None:
            return too_long
        job.status = "waiting"
        job.prefill_left = job.prompt_tokens  # tokens not yet computed (num_tokens - computed)
        rep = self.replicas[0]
        if self._wake_ns and not rep.running and not len(self.policy):
            last = rep.decode_ends[-1] if rep.decode_ends else None
            if last is None or now_ns - last >= self._idle_after_ns:
                rep.stolen_ns += self._wake_ns  # an engine that idled wakes up first
        self.policy.add(job)
        self.passover.arrived(job)
        if self._steal_ns and rep.running:  # its front end ran while the engine stepped
            rep.stolen_ns += self._steal_ns
        return ACCEPTED

    def cancel(self, job: Job, now_ns: int) -> bool:
        """Stop a job wherever it is (its client went away: a timeout, the end of the run).
        True if it was still live. A running job's blocks are freed; the tokens it produced
        (a preempted one's too) stay readable from `segments`."""
        if job.status in ("waiting", "preempted"):
            self.policy.remove(job)
            wait_ends(job, now_ns)
        elif job.status == "running":
            rep = self.replicas[0]
            rep.running.remove(job)
            self._free(rep, job)
        else:
            return False
        self._close_run(job, 0)
        job.status = "cancelled"
        job.done_ns = now_ns
        return True

    @staticmethod
    def _close_run(job: Job, r: int) -> None:
        """Move the job's open run of tokens into `segments`; first_step becomes the step of
        its first token again."""
        if job.first_step >= 0 and (
            not job.segments or job.segments[-1][2] + job.segments[-1][3] <= job.first_step
        ):
            job.add_segment((r, -1, job.first_step, job.last_step - job.first_step + 1))
        if job.segments:
            job.first_step = job.segments[0][2]

    # ------------------------------------------------------------------ one step

    def _computed(self, job: Job) -> int:
        return job.prompt_tokens + job.generated - job.prefill_left

    def _allocate(self, rep: VllmReplica, job: Job, tokens: int) -> bool:
        """Blocks for `tokens` more of `job`'s tokens, if they fit (`allocate_slots`)."""
        need = self.blocks_for(self._computed(job) + tokens) - job.blocks
        if need > rep.free_blocks:
            return False
        if need > 0:
            self._grow(rep, job, need)
        return True

    def _grow(self, rep: VllmReplica, job: Job, need: int) -> None:
        """Give `job` `need` more blocks from the free queue (evicting cached ones as vLLM's
        pool pops them) and cache its prompt blocks now full (`cache_blocks`)."""
        job.blocks += need
        pool = self.pool
        if pool is None:
            rep.free_blocks -= need
            return
        pool.allocate(need)
        rep.free_blocks = pool.free

    def _cache_progress(self, job: Job, computed: int) -> None:
        if self.pool is not None and job.block_hashes:
            self.pool.cache(job, computed)

    def _free(self, rep: VllmReplica, job: Job) -> None:
        """The job's blocks go back (a cached block only once no running request holds it)."""
        if self.pool is None:
            rep.free_blocks += job.blocks
        else:
            self.pool.release(job)
            rep.free_blocks = self.pool.free
        job.blocks = 0

    def _victim(self, rep: VllmReplica) -> Job:
        if self.policy.policy == "priority":
            return max(rep.running, key=lambda j: (j.priority, j.arrival_ns, j.seq))
        return rep.running[-1]

    def _preempt(self, rep: VllmReplica, job: Job, now_ns: int) -> None:
        rep.running.remove(job)
        self._free(rep, job)
        lost = self._computed(job)
        job.prefill_left = job.prompt_tokens + job.generated  # computed tokens drop to 0
        job.status = "preempted"
        job.lead_ns = 0  # marks that its next token comes from a recompute's prefill
        job.preemptions += 1
        self.preemptions += 1
        wait_from(job, now_ns)
        self.log.append((now_ns, "preempt", job.id, lost))
        self.policy.prepend(job)
        rep.result.preempted.append(job)

    def _schedule(self, rep: VllmReplica, now_ns: int) -> tuple[list[Job], list[int], list[int]]:
        """One `Scheduler.schedule`: the jobs scheduled this step in running order, their
        tokens, and [prefill tokens, decode sequences, decode context] for the cost model."""
        prof = self.profile
        bs = self.block_size
        budget = prof.max_num_batched_tokens
        jobs: list[Job] = []
        tokens_of: list[int] = []
        n_prefill = n_decode = context = 0
        preempted = False
        running = rep.running
        i = 0
        while i < len(running) and budget > 0:
            job = running[i]
            left = job.prefill_left
            tokens = left if left < budget else budget
            computed = job.prompt_tokens + job.generated - left
            after = computed + tokens
            if after > job.blocks * bs:  # needs a new block (the common case needs none)
                need = -(-after // bs) - job.blocks
                if need <= rep.free_blocks:
                    self._grow(rep, job, need)
                else:
                    fits = True
                    while not self._allocate(rep, job, tokens):
                        victim = self._victim(rep)
                        if victim in jobs:  # give its tokens back, and keep our place
                            at = jobs.index(victim)
                            budget += tokens_of[at]
                            del jobs[at], tokens_of[at]
                            i -= 1
                        self._preempt(rep, victim, now_ns)
                        preempted = True
                        if victim is job:
                            fits = False
                            break
                    if not fits:
                        break
                if left > 1 or not job.generated:  # a prefill chunk: its full blocks are cached
                    self._cache_progress(job, after)
            jobs.append(job)
            tokens_of.append(tokens)
            if left == 1 and job.generated:
                n_decode += 1
                context += computed
            else:
                n_prefill += tokens
            budget -= tokens
            i += 1
        if preempted:  # victims taken back out: count again; the waiting were passed over
            self.passover.pass_ended(now_ns, len(self.policy))
            return jobs, tokens_of, self._cost_terms(jobs, tokens_of)
        waiting = self.policy
        pool = self.pool
        while len(waiting) and budget > 0 and len(running) < prof.max_num_seqs:
            job = waiting.peek()
            hit: list[int] = []
            touched = 0
            if pool is not None and job.block_hashes:  # no computed tokens: look the prompt up
                hit, touched = pool.lookup(job)
            hit_tokens = len(hit) * bs
            tokens = job.prefill_left - hit_tokens
            if not prof.chunked_prefill and tokens > budget:
                break  # vLLM: "If chunked_prefill is disabled, we can stop the scheduling here."
            tokens = min(tokens, budget)
            # allocate_slots: the touched cached blocks leave the free queue too
            need = self.blocks_for(hit_tokens + tokens) - len(hit)
            if need + touched > rep.free_blocks:
                break  # vLLM: allocate_slots returned None, "The request cannot be scheduled."
            waiting.pop()
            if pool is not None:
                cached = pool.take(job, hit)
                job.blocks = len(hit)
                job.prefill_left -= cached
                if job.status != "preempted":
                    job.cached_tokens = cached
                self._grow(rep, job, need)
                self._cache_progress(job, cached + tokens)
            else:
                self._grow(rep, job, need)
            running.append(job)
            if job.status == "preempted":
                self.recompute_tokens += job.prefill_left
                self.log.append((now_ns, "recompute", job.id, job.prefill_left))
            else:
                job.admit_ns = now_ns
                job.replica = rep.index
            job.status = "running"
            wait_ends(job, now_ns)
            rep.result.admitted.append(job)
            jobs.append(job)
            tokens_of.append(tokens)
            n_prefill += tokens  # a new prompt, or a preempted job's recompute
            budget -= tokens
        self.passover.pass_ended(now_ns, len(waiting))
        return jobs, tokens_of, [n_prefill, n_decode, context]

    def _cost_terms(self, jobs: list[Job], tokens_of: list[int]) -> list[int]:
        n_prefill = n_decode = context = 0
        for job, tokens in zip(jobs, tokens_of, strict=True):
            if job.prefill_left == 1 and job.generated:
                n_decode += 1
                context += self._computed(job)
            else:
                n_prefill += tokens
        return [n_prefill, n_decode, context]

    def step(self, r: int, now_ns: int) -> StepResult | None:
        rep = self.replicas[r]
        res = rep.result
        res.admitted.clear()
        res.first_tokens.clear()
        res.finished.clear()
        res.preempted.clear()
        jobs, tokens_of, terms = self._schedule(rep, now_ns)
        if not jobs and res.preempted:
            # A step that only preempted costs nothing; vLLM's next step (at once) admits.
            jobs, tokens_of, terms = self._schedule(rep, now_ns)
        if not jobs:
            rep.stolen_ns = 0  # nothing runs: no step pays for the front ends seen before
            return None
        n_prefill, n_decode, context = terms
        ms = self.profile.step_ms(n_prefill, n_decode, context)
        if rep.noise is not None:
            ms *= rep.noise()
        duration = (int(ms * 1e6) or 1) + rep.stolen_ns
        rep.stolen_ns = 0
        end = now_ns + duration
        k = len(rep.decode_ends)
        rep.decode_ends.append(end)
        res.start_ns = now_ns
        res.end_ns = end
        res.duration_ns = duration
        res.n_prefill = n_prefill
        res.n_decode = n_decode

        # Tokens: a job whose computed tokens caught up samples one. A job's tokens are kept
        # as runs of consecutive steps: first_step..last_step is the open run, closed into
        # `segments` when the job sits a step out and at the end.
        done: list[Job] = []
        first_tokens = res.first_tokens
        for job, tokens in zip(jobs, tokens_of, strict=True):
            left = job.prefill_left - tokens
            if left:
                job.prefill_left = left  # a prefill chunk: no token yet
                continue
            if job.max_tokens == 0:  # an embedding: the prefill is the whole response
                job.first_token_ns = end
                first_tokens.append(job)
                done.append(job)
                continue
            generated = job.generated
            if generated == 0:
                job.first_token_ns = end
                job.lead_ns = -1  # (a job preempted mid-prompt also lands here)
                first_tokens.append(job)
            elif job.lead_ns >= 0:  # the token a recompute's prefill yields
                job.lead_ns = -1
                first_tokens.append(job)
            if job.first_step >= 0 and job.last_step == k - 1:
                job.last_step = k
            else:
                if job.first_step >= 0:
                    job.add_segment((r, -1, job.first_step, job.last_step - job.first_step + 1))
                job.first_step = job.last_step = k
            job.generated = generated + 1
            if generated + 1 >= job.max_tokens:
                done.append(job)
            else:
                job.prefill_left = 1  # the sampled token is computed next step
        for job in done:
            rep.running.remove(job)
            self._free(rep, job)
            job.status = "finished"
            job.done_ns = end
            self._close_run(job, r)
            res.finished.append(job)
        return res

    def busy(self, r: int) -> bool:
        return bool(self.replicas[r].running)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "preemptions": self.preemptions,
            "recompute_tokens": self.recompute_tokens,
            "waiting": len(self.policy),
            "running": len(self.replicas[0].running),
        }
        if self.pool is not None:
            out["prefix_cache"] = self.pool.stats()
        return out


def make_engine(
    config: SchedulerConfig, *, keep_history: bool = True, group_counts: bool = True
) -> Engine | VllmEngine:
    """The engine a configuration asks for (`scheduler.engine`); `group_counts` as for Engine
    (the vLLM model keeps its own counts either way)."""
    if config.engine == "vllm":
        return VllmEngine(config, keep_history=keep_history)
    return Engine(config, keep_history=keep_history, group_counts=group_counts)
