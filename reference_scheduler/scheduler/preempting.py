"""Preemption, demotion and promotion for `engine.Engine` (a mixin it inherits).

Apart from the step's logic so that engine.py stays under 600 lines (issue 31): these run only
when a scenario configures preemption or tiers, never on the common path of a step. The rules
are in core/preemption.py; the engine's state they change (replica slots, KV blocks, the
decoding batch, the resume queue) is described in engine.py."""

from __future__ import annotations

import heapq
from typing import Any

from reference_scheduler.core.job import Job
from reference_scheduler.scheduler.passover import wait_ends, wait_from
from reference_scheduler.scheduler.replica import Replica


class Preempting:
    """The engine's preemption verbs; `Engine.__init__` sets the state they read."""

    # set by Engine.__init__ (declared here for readers and type checkers)
    policy: Any
    profile: Any
    preemption: Any
    control: Any
    cache: Any
    tier_ranks: list[tuple[str, int]]
    _granted: Job | None

    def blocks_for(self, job: Job) -> int:  # pragma: no cover - Engine's
        raise NotImplementedError

    def _untrack(self, rep: Replica, job: Job) -> None:  # pragma: no cover - Engine's
        raise NotImplementedError

    def _join_decode(self, rep: Replica, job: Job) -> None:  # pragma: no cover - Engine's
        raise NotImplementedError

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
        last = job.first_step + job.max_tokens - job.generated - 1  # its key in finish_at
        bucket = rep.finish_at[last]
        bucket.remove(job)
        if not bucket:
            del rep.finish_at[last]
        rep.batch -= 1
        rep.context -= job.prompt_tokens + job.generated + done
        self._untrack(rep, job)
        job.add_segment((rep.index, job.lead_ns, job.first_step, done))
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
        rep.result.dirty = True

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
        rep.result.dirty = True
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
