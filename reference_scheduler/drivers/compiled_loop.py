"""The compiled driver's loop (numba): `virtual.simulate` and `scheduler.engine.Engine`,
transcribed onto arrays. Read compiled.py first; every function here names what it
transcribes, and keeps its order of operations (integer sums may be regrouped, float ones are
not).

The arrays come in tuples: J per job, R per replica, P the policy's state (queues, VTC's
counters, DWRR's rings, WFQ's heaps, the tiers' counts), C its configuration
(compiled._policy_config), H the two replica heaps. `state` holds the scalars (compiled.S_*),
`ints` and `floats` the engine's configuration (compiled.simulate_columns lists them). Status
codes are compiled.STATUS_NAMES'.

Why the arrays of a tuple are grouped, same type and length as the rows of one 2D array
(J[J_I][JI_DONE], not a tuple member per column): numba passes a tuple to a function as every
field of every array in it, about seven words an array, so each call of a function taking
J, R, P and C copied some 600 words while they held 90 arrays. Grouped, they hold 23. On the
10-minute fleet the loop's time for FIFO, VTC and three-tier fell by about 15% against the
ungrouped loop before WFQ, SFQ and priority were added (which had made it 20% slower), and WFQ's
by 40%."""

from __future__ import annotations

import numpy as np
from numba import njit

from reference_scheduler.drivers.compiled_codes import (
    CANCELLED,
    DWRR,
    FIFO,
    FINISHED,
    JI_ADMIT,
    JI_BACKLOG,
    JI_BLOCKS,
    JI_DONE,
    JI_FIRST_STEP,
    JI_FIRST_TOKEN,
    JI_FRESH,
    JI_GENERATED,
    JI_LAST_STEP,
    JI_LEAD,
    JI_PASSED_OVER,
    JI_PREFILL_LEFT,
    JI_REJECT_CODE,
    JI_REPLICA,
    JI_SEG_COUNT,
    JI_SEG_FIRST,
    JI_SEG_LEAD,
    JI_SEG_REPLICA,
    JI_SEQ,
    JI_WAIT_SINCE,
    LCF,
    NEVER,
    PI_DWAITING,
    PI_GPS_FLOWS,
    PI_GPS_N,
    PI_GPS_SIZE,
    PI_HEAP_OFF,
    PI_JOBS_SIZE,
    PI_ORDER,
    PI_QHEAD,
    PI_QLIVE,
    PI_QTAIL,
    PRIORITY,
    PT_LAST_LEFT,
    PT_RING_HEAD,
    PT_RING_SIZE,
    PT_RUNNING,
    PT_SEEN,
    PT_TWAITING,
    QUEUE_WFQ,
    REJECTED,
    RI_FH_LEN,
    RI_PF_LEN,
    RI_REP_BATCH,
    RI_REP_CONTEXT,
    RI_REP_DECODING,
    RI_REP_EXTRA,
    RI_REP_FREE,
    RI_REP_LAST_END,
    RI_REP_PENDING,
    RI_REP_SLOTS,
    RI_REP_STEPS,
    RQ_FH_JOB,
    RQ_FH_SEQ,
    RQ_FH_STEP,
    RQ_PF,
    RT_TD,
    RT_TD_JOB,
    RUNNING,
    S_D,
    S_ENDED,
    S_FRESH,
    S_I,
    S_IDLE,
    S_LOG,
    S_NOW,
    S_RUN,
    S_SEQ,
    S_WAITING,
    VTC,
    WAITING,
    WFQ,
)

# ints' indices
(
    I_TIERED,
    I_NREP,
    I_SHIFT,
    I_MAX_SEQS,
    I_CAP,
    I_CHUNKED,
    I_ADMIT_EVERY,
    I_BLOCK,
    I_FITS,
    I_KV_BLOCKS,
    I_STEAL,
    I_WAKE,
    I_IDLE_AFTER,
    I_TIMEOUT,
    I_STOP,
    I_CONSTANT,
    I_MIXED_SUM,
    I_CHARGING,
    I_RELEASES,
    I_NTEN,
    I_WIDTH,
) = range(21)
# J: per job, grouped as P is (compiled._Arrays.jobs()): the int64 columns as the rows of one
# 2D array, the status (int8) and whether in a policy queue (bool)
J_I, J_STATUS, J_INQ = range(3)
# R: per replica (compiled._Arrays.replicas()): the int64 counts as rows of one 2D array, the
# per-slot arrays (prefilling jobs, the decode heap) and the per-tenant ones as 3D arrays
R_I, R_Q, R_T = range(3)
# P: the policy's state, its arrays grouped by type and length (each group one 2D array, its
# rows the arrays below): a tuple is passed to a function as all its arrays' fields, so fewer
# arrays make every call cheaper (compiled._Arrays.policy())
P_I, P_F, P_B, P_RING, P_T, P_HEAD_COST, P_NXT, P_INQ, P_SLOT_F, P_GPS_ON, P_HEAP_F, P_HEAP_I = (
    range(12)
)
# P_F's rows: per (tier, class), float64
(
    PF_COUNTERS,
    PF_DEFICIT,
    PF_VTIME,
    PF_TLAST,
    PF_ACTIVE_WEIGHT,
) = range(5)
# P_B's rows: per (tier, class), bool
(
    PB_BACKLOGGED,
    PB_ACTIVE,
) = range(2)
# P_SLOT_F's rows: per (WFQ instance, flow) slot, float64
(
    PS_FINISH,
    PS_FLOW_WEIGHT,
) = range(2)
# P_HEAP_F's rows: the WFQ heaps' keys
(
    HF_GPS_KEY,
    HF_JOBS_KEY,
) = range(2)
# P_HEAP_I's rows: the WFQ heaps' ties and payloads
(
    HI_GPS_TIE,
    HI_GPS_FLOW,
    HI_JOBS_TIE,
    HI_JOBS_JOB,
) = range(4)
# C: the policy's configuration (compiled._policy_config), grouped as P is
C_JOB_I, C_JOB_F, C_PAIR_F, C_TIER_I, C_TIER_F = range(5)
CJ_TIER, CJ_CLASS, CJ_FLOW = range(3)  # C_JOB_I's rows: per job, int64
CJF_COST, CJF_WFQ_COST, CJF_WFQ_WEIGHT = range(3)  # C_JOB_F's: per job, float64 (DWRR, WFQ)
CP_QUANTUM, CP_DIVISOR = range(2)  # C_PAIR_F's: per (tier, class), float64 (DWRR, VTC)
CT_KIND, CT_QUEUE = range(2)  # C_TIER_I's: per tier, int64
CTF_FLOOR, CTF_LEND, CTF_RATE, CTF_PRICE_IN, CTF_PRICE_OUT = range(5)  # C_TIER_F's: float64
F_A, F_B, F_C, F_D, F_E, F_F, F_FLOOR, F_CONSTANT = range(8)


# ---------------------------------------------------------------- min-heaps of int64 keys


@njit(cache=True, _nrt=False)
def _sift_down(h, size, i):
    key = h[i]
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and h[c + 1] < h[c]:
            c += 1
        if h[c] >= key:
            break
        h[i] = h[c]
        i = c
    h[i] = key


@njit(cache=True, _nrt=False)
def _push(h, size, key):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if h[p] <= key:
            break
        h[i] = h[p]
        i = p
    h[i] = key


@njit(cache=True, _nrt=False)
def _pop(h, size):
    """The smallest key; the heap is one shorter (the caller stores size - 1)."""
    top = h[0]
    if size > 1:
        h[0] = h[size - 1]
        _sift_down(h, size - 1, 0)
    return top


# ------------------------------------- a replica's decoding jobs: (last step, seq) -> job


@njit(cache=True, _nrt=False)
def _less(steps, seqs, a, b):
    return steps[a] < steps[b] or (steps[a] == steps[b] and seqs[a] < seqs[b])


@njit(cache=True, _nrt=False)
def _fh_swap(steps, seqs, jobs, a, b):
    steps[a], steps[b] = steps[b], steps[a]
    seqs[a], seqs[b] = seqs[b], seqs[a]
    jobs[a], jobs[b] = jobs[b], jobs[a]


@njit(cache=True, _nrt=False)
def _fh_up(steps, seqs, jobs, i):
    while i > 0:
        p = (i - 1) >> 1
        if not _less(steps, seqs, i, p):
            break
        _fh_swap(steps, seqs, jobs, i, p)
        i = p


@njit(cache=True, _nrt=False)
def _fh_down(steps, seqs, jobs, size, i):
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _less(steps, seqs, c + 1, c):
            c += 1
        if not _less(steps, seqs, c, i):
            break
        _fh_swap(steps, seqs, jobs, i, c)
        i = c


@njit(cache=True, _nrt=False)
def _fh_remove(steps, seqs, jobs, size, i):
    """Remove entry i of a heap of `size`; the caller stores size - 1."""
    last = size - 1
    if i != last:
        _fh_swap(steps, seqs, jobs, i, last)
        _fh_down(steps, seqs, jobs, last, i)
        _fh_up(steps, seqs, jobs, i)


# ------------------------------------------------------------ the policy: tiers of children
# One or more tiers (Tiered's; one tier when the policy is not tiered), each with a child of
# kind FIFO, VTC, LCF, DWRR (over FIFO or WFQ queues; SFQ runs as DWRR over its buckets),
# PRIORITY or WFQ. Each job has a class in its tier (C_CLASS: its tenant for VTC, LCF and DWRR,
# its bucket for SFQ, its level for PRIORITY, 0 for FIFO and WFQ), and queue q = tier * W +
# class (W: ints[I_WIDTH], the most classes a tier has), so a tier's classes have their own
# queues, counters and deficits. A WFQ (a tier's child, or a DWRR class's) is instance q of
# the WFQ arrays; each (instance, flow) that has jobs has a slot of its own, and a job's
# CJ_FLOW is its slot (compiled._policy_config numbers them), which the GPS heap carries too.


@njit(cache=True, _nrt=False)
def _qpush(P, q, j):
    """JobQueue.push."""
    qhead, qtail, qlive, nxt, inq = (
        P[P_I][PI_QHEAD],
        P[P_I][PI_QTAIL],
        P[P_I][PI_QLIVE],
        P[P_NXT],
        P[P_INQ],
    )
    nxt[j] = -1
    if qtail[q] >= 0:
        nxt[qtail[q]] = j
    else:
        qhead[q] = j
    qtail[q] = j
    inq[j] = True
    qlive[q] += 1


@njit(cache=True, _nrt=False)
def _head(P, q):
    """JobQueue.head: the first job not removed, -1 if none (removed ones are dropped)."""
    qhead, qtail, nxt, inq = P[P_I][PI_QHEAD], P[P_I][PI_QTAIL], P[P_NXT], P[P_INQ]
    head = qhead[q]
    while head >= 0 and not inq[head]:
        head = nxt[head]
    qhead[q] = head
    if head < 0:
        qtail[q] = -1
    return head


@njit(cache=True, _nrt=False)
def _pop_head(P, q, j):
    """JobQueue.take of its head j."""
    qhead, qtail, qlive, nxt, inq = (
        P[P_I][PI_QHEAD],
        P[P_I][PI_QTAIL],
        P[P_I][PI_QLIVE],
        P[P_NXT],
        P[P_INQ],
    )
    qhead[q] = nxt[j]
    if qhead[q] < 0:
        qtail[q] = -1
    inq[j] = False
    qlive[q] -= 1


@njit(cache=True, _nrt=False)
def _discard(P, q, j):
    """JobQueue.discard: True if j was in the queue."""
    qhead, qtail, qlive, inq = P[P_I][PI_QHEAD], P[P_I][PI_QTAIL], P[P_I][PI_QLIVE], P[P_INQ]
    if not inq[j]:
        return False
    inq[j] = False
    qlive[q] -= 1
    if qlive[q] == 0:  # JobQueue.discard clears its items
        qhead[q] = -1
        qtail[q] = -1
    return True


@njit(cache=True, _nrt=False)
def _wfq_advance(P, rate, w, now):
    """Wfq._advance of WFQ instance w: GPS virtual time brought to `now`, retiring the flows
    whose fluid backlog drains (their stale heap entries popped on the way)."""
    vtime, t_last, weight = P[P_F][PF_VTIME], P[P_F][PF_TLAST], P[P_F][PF_ACTIVE_WEIGHT]
    flows, finish, flow_weight, active = (
        P[P_I][PI_GPS_FLOWS],
        P[P_SLOT_F][PS_FINISH],
        P[P_SLOT_F][PS_FLOW_WEIGHT],
        P[P_GPS_ON],
    )
    if now <= t_last[w]:
        return
    off = P[P_I][PI_HEAP_OFF][w]
    gsize = P[P_I][PI_GPS_SIZE]
    key, tie, flow = (
        P[P_HEAP_F][HF_GPS_KEY][off:],
        P[P_HEAP_I][HI_GPS_TIE][off:],
        P[P_HEAP_I][HI_GPS_FLOW][off:],
    )
    while flows[w]:
        top = key[0]
        s = flow[0]
        if not active[s] or finish[s] != top:  # stale
            _fh_remove(key, tie, flow, gsize[w], 0)
            gsize[w] -= 1
            continue
        reach = t_last[w] + (top - vtime[w]) * weight[w] / rate
        if reach > now:
            vtime[w] += (now - t_last[w]) * rate / weight[w]
            break
        vtime[w] = top
        t_last[w] = reach
        _fh_remove(key, tie, flow, gsize[w], 0)
        gsize[w] -= 1
        active[s] = False
        flows[w] -= 1
        weight[w] -= flow_weight[s]
        if not flows[w]:
            weight[w] = 0.0
    t_last[w] = now


@njit(cache=True, _nrt=False)
def _wfq_enqueue(P, C, k, w, j, now):
    """Wfq.enqueue of job j into WFQ instance w (of tier k): its finish tag, its flow GPS
    backlogged. Ties between tags break by submission order, which is the jobs' index order
    here (Job.seq)."""
    _wfq_advance(P, C[C_TIER_F][CTF_RATE][k], w, now)
    vtime, finish, flow_weight, active = (
        P[P_F][PF_VTIME],
        P[P_SLOT_F][PS_FINISH],
        P[P_SLOT_F][PS_FLOW_WEIGHT],
        P[P_GPS_ON],
    )
    s = C[C_JOB_I][CJ_FLOW][j]
    weight = C[C_JOB_F][CJF_WFQ_WEIGHT][j]
    flow_weight[s] = weight
    start = finish[s] if finish[s] > vtime[w] else vtime[w]  # max(vtime, finish)
    tag = start + C[C_JOB_F][CJF_WFQ_COST][j] / weight
    finish[s] = tag
    P[P_I][PI_GPS_N][w] += 1
    if not active[s]:
        active[s] = True
        P[P_I][PI_GPS_FLOWS][w] += 1
        P[P_F][PF_ACTIVE_WEIGHT][w] += weight
    off = P[P_I][PI_HEAP_OFF][w]
    size = P[P_I][PI_GPS_SIZE][w]
    key, tie, flow = (
        P[P_HEAP_F][HF_GPS_KEY][off:],
        P[P_HEAP_I][HI_GPS_TIE][off:],
        P[P_HEAP_I][HI_GPS_FLOW][off:],
    )
    key[size], tie[size], flow[size] = tag, P[P_I][PI_GPS_N][w], C[C_JOB_I][CJ_FLOW][j]
    _fh_up(key, tie, flow, size)
    P[P_I][PI_GPS_SIZE][w] = size + 1
    size = P[P_I][PI_JOBS_SIZE][w]
    key, tie, jobs = (
        P[P_HEAP_F][HF_JOBS_KEY][off:],
        P[P_HEAP_I][HI_JOBS_TIE][off:],
        P[P_HEAP_I][HI_JOBS_JOB][off:],
    )
    key[size], tie[size], jobs[size] = tag, j, j
    _fh_up(key, tie, jobs, size)
    P[P_I][PI_JOBS_SIZE][w] = size + 1
    P[P_INQ][j] = True


@njit(cache=True, _nrt=False)
def _wfq_head(P, w):
    """Wfq.peek of instance w: the smallest finish tag's job, removed ones popped; -1 if none."""
    off = P[P_I][PI_HEAP_OFF][w]
    key, tie, jobs = (
        P[P_HEAP_F][HF_JOBS_KEY][off:],
        P[P_HEAP_I][HI_JOBS_TIE][off:],
        P[P_HEAP_I][HI_JOBS_JOB][off:],
    )
    size, inq = P[P_I][PI_JOBS_SIZE], P[P_INQ]
    while size[w] and not inq[jobs[0]]:
        _fh_remove(key, tie, jobs, size[w], 0)
        size[w] -= 1
    return jobs[0] if size[w] else -1


@njit(cache=True, _nrt=False)
def _wfq_take(P, w, j):
    """Wfq.dequeue of the job `_wfq_head` just returned."""
    off = P[P_I][PI_HEAP_OFF][w]
    size = P[P_I][PI_JOBS_SIZE]
    _fh_remove(
        P[P_HEAP_F][HF_JOBS_KEY][off:],
        P[P_HEAP_I][HI_JOBS_TIE][off:],
        P[P_HEAP_I][HI_JOBS_JOB][off:],
        size[w],
        0,
    )
    size[w] -= 1
    P[P_INQ][j] = False


@njit(cache=True, _nrt=False)
def _lift(P, base, width, k, t):
    """Vtc._lift of tenant t in tier k's VTC."""
    counters, backlogged, last_left = (
        P[P_F][PF_COUNTERS],
        P[P_B][PB_BACKLOGGED],
        P[P_T][PT_LAST_LEFT],
    )
    found = False
    floor = 0.0
    for u in range(width):
        if backlogged[base + u] and u != t:
            c = counters[base + u]
            if not found or c < floor:
                floor = c
                found = True
    if not found:
        left = last_left[k]
        if left < 0 or left == t:
            return
        floor = counters[base + left]
    if floor > counters[base + t]:
        counters[base + t] = floor


@njit(cache=True, _nrt=False)
def _enqueue(P, C, width, j, now):
    """The policy's enqueue (Tiered's, then its tier's child); every job is accepted."""
    kinds, jtier, quantum = C[C_TIER_I][CT_KIND], C[C_JOB_I][CJ_TIER], C[C_PAIR_F][CP_QUANTUM]
    counters, order, backlogged, seen = (
        P[P_F][PF_COUNTERS],
        P[P_I][PI_ORDER],
        P[P_B][PB_BACKLOGGED],
        P[P_T][PT_SEEN],
    )
    ring, ring_head, ring_size = P[P_RING], P[P_T][PT_RING_HEAD], P[P_T][PT_RING_SIZE]
    deficit, active, dwaiting = P[P_F][PF_DEFICIT], P[P_B][PB_ACTIVE], P[P_I][PI_DWAITING]
    k = jtier[j]
    kind = kinds[k]
    base = k * width
    t = C[C_JOB_I][CJ_CLASS][j]
    q = base + t
    if kind == FIFO:
        _qpush(P, base, j)
    elif kind == PRIORITY:  # Priority.enqueue: its level's queue
        _qpush(P, q, j)
    elif kind == WFQ:
        _wfq_enqueue(P, C, k, base, j, now)
    elif kind == DWRR:  # Dwrr.enqueue: the class's child, then the ring
        if C[C_TIER_I][CT_QUEUE][k] == QUEUE_WFQ:
            _wfq_enqueue(P, C, k, q, j, now)
        else:
            _qpush(P, q, j)
        dwaiting[q] += 1
        if not active[q]:  # joins the ring at the back with one quantum
            active[q] = True
            deficit[q] = quantum[q]
            ring[k, (ring_head[k] + ring_size[k]) % width] = t
            ring_size[k] += 1
    else:
        if order[q] < 0:  # its queue is made, its counter starts at 0
            counters[q] = 0.0
            order[q] = seen[k]
            seen[k] += 1
        if P[P_I][PI_QLIVE][q] == 0:
            if kind == VTC:
                _lift(P, base, width, k, t)
            backlogged[q] = True
        _qpush(P, q, j)
    P[P_T][PT_TWAITING][k] += 1


@njit(cache=True, _nrt=False)
def _class_head(P, C, k, q):
    """A DWRR class's child's peek: its FIFO's head or its WFQ's smallest tag."""
    if C[C_TIER_I][CT_QUEUE][k] == QUEUE_WFQ:
        return _wfq_head(P, q)
    return _head(P, q)


@njit(cache=True, _nrt=False)
def _peek_tier(P, C, width, k):
    """Tier k's child's peek: -1 if it has nothing to give."""
    kind = C[C_TIER_I][CT_KIND][k]
    base = k * width
    if kind == FIFO:
        return _head(P, base)
    if kind == WFQ:
        return _wfq_head(P, base)
    if kind == PRIORITY:  # Priority._first: the most urgent level with live jobs
        qlive = P[P_I][PI_QLIVE]
        for q in range(base, base + width):
            if qlive[q]:
                return _head(P, q)
        return -1
    if kind == DWRR:  # Dwrr._advance: rotate until the head class affords its head job
        cost, quantum = C[C_JOB_F][CJF_COST], C[C_PAIR_F][CP_QUANTUM]
        ring, ring_head, ring_size = P[P_RING], P[P_T][PT_RING_HEAD], P[P_T][PT_RING_SIZE]
        deficit, active = P[P_F][PF_DEFICIT], P[P_B][PB_ACTIVE]
        while ring_size[k]:
            t = ring[k, ring_head[k]]
            q = base + t
            j = _class_head(P, C, k, q)
            if j < 0:  # emptied by removals
                ring_head[k] = (ring_head[k] + 1) % width
                ring_size[k] -= 1
                active[q] = False
                deficit[q] = 0.0
                continue
            c = cost[j]
            if c <= deficit[q]:
                P[P_HEAD_COST][k] = c
                return j
            deficit[q] += quantum[q]
            ring_head[k] = (ring_head[k] + 1) % width  # rotate(-1): the head to the back
            ring[k, (ring_head[k] + ring_size[k] - 1) % width] = t
        return -1
    # Vtc._pick: the lowest (counter, first-seen order) backlogged tenant
    counters, order, backlogged = P[P_F][PF_COUNTERS], P[P_I][PI_ORDER], P[P_B][PB_BACKLOGGED]
    q = -1
    best_c = 0.0
    for u in range(base, base + width):
        if backlogged[u]:
            c = counters[u]
            if q < 0 or c < best_c or (c == best_c and order[u] < order[q]):
                q = u
                best_c = c
    if q < 0:
        return -1
    return _head(P, q)


@njit(cache=True, _nrt=False)
def _peek(P, C, width, tiered):
    """The policy's peek: the job to admit next, -1 if none (Tiered: its tier's child's)."""
    if not tiered:
        return _peek_tier(P, C, width, 0)
    running, twaiting = P[P_T][PT_RUNNING], P[P_T][PT_TWAITING]
    floor_slots, lend_slots = C[C_TIER_F][CTF_FLOOR], C[C_TIER_F][CTF_LEND]
    borrower = -1  # Tiered._choose: the guarantee pass, then the borrowing pass
    for k in range(len(twaiting)):
        if not twaiting[k]:
            continue
        if running[k] < floor_slots[k]:
            return _peek_tier(P, C, width, k)
        if borrower < 0 and running[k] < lend_slots[k]:
            borrower = k
    if borrower < 0:
        return -1
    return _peek_tier(P, C, width, borrower)


@njit(cache=True, _nrt=False)
def _gone(P, C, width, k, t):
    """A VTC child's tenant queue emptied: it leaves the backlog."""
    kind = C[C_TIER_I][CT_KIND][k]
    if (kind == VTC or kind == LCF) and P[P_I][PI_QLIVE][k * width + t] == 0:  # noqa: SIM109
        P[P_B][PB_BACKLOGGED][k * width + t] = False
        P[P_T][PT_LAST_LEFT][k] = t


@njit(cache=True, _nrt=False)
def _take(P, C, width, j):
    """The policy's take of the job `_peek` just returned."""
    k = C[C_JOB_I][CJ_TIER][j]
    kind = C[C_TIER_I][CT_KIND][k]
    base = k * width
    t = C[C_JOB_I][CJ_CLASS][j]
    q = base + t
    if kind == FIFO:
        _pop_head(P, base, j)
    elif kind == PRIORITY:
        _pop_head(P, q, j)
    elif kind == WFQ:
        _wfq_take(P, base, j)
    elif kind == DWRR:  # Dwrr.take: the ring's head class pays the job's cost
        if C[C_TIER_I][CT_QUEUE][k] == QUEUE_WFQ:
            _wfq_take(P, q, j)
        else:
            _pop_head(P, q, j)
        P[P_F][PF_DEFICIT][q] -= P[P_HEAD_COST][k]
        P[P_I][PI_DWAITING][q] -= 1
        if P[P_I][PI_DWAITING][q] == 0:
            P[P_T][PT_RING_HEAD][k] = (P[P_T][PT_RING_HEAD][k] + 1) % width
            P[P_T][PT_RING_SIZE][k] -= 1
            P[P_B][PB_ACTIVE][q] = False
            P[P_F][PF_DEFICIT][q] = 0.0
    else:
        _pop_head(P, q, j)
        _gone(P, C, width, k, t)
    P[P_T][PT_RUNNING][k] += 1  # Tiered.take's counts (kept, unread, when not tiered)
    P[P_T][PT_TWAITING][k] -= 1


@njit(cache=True, _nrt=False)
def _remove(P, C, width, j):
    """The policy's remove of a waiting job (cancelled)."""
    k = C[C_JOB_I][CJ_TIER][j]
    kind = C[C_TIER_I][CT_KIND][k]
    base = k * width
    t = C[C_JOB_I][CJ_CLASS][j]
    q = base + t
    inq = P[P_INQ]
    if kind == FIFO:
        gone = _discard(P, base, j)
    elif kind == PRIORITY:
        gone = _discard(P, q, j)
    elif kind == WFQ:  # Wfq.remove: popped when it reaches the heap's top
        gone = inq[j]
        inq[j] = False
    elif kind == DWRR:
        if C[C_TIER_I][CT_QUEUE][k] == QUEUE_WFQ:
            gone = inq[j]
            inq[j] = False
        else:
            gone = _discard(P, q, j)
        if gone:
            P[P_I][PI_DWAITING][q] -= 1
    else:
        gone = _discard(P, q, j)
        _gone(P, C, width, k, t)
    if gone:
        P[P_T][PT_TWAITING][k] -= 1


@njit(cache=True, _nrt=False)
def _release(P, C, j):
    """Tiered.release: a running job of tier k finished or was cancelled."""
    P[P_T][PT_RUNNING][C[C_JOB_I][CJ_TIER][j]] -= 1


@njit(cache=True, _nrt=False)
def _charge(P, C, width, k, t, prefill, decode):
    """The policy's charge (Tiered's: tier k's child; Vtc.charge, the same float operations)."""
    kind = C[C_TIER_I][CT_KIND][k]
    if kind == VTC or kind == LCF:  # noqa: SIM109 (numba)
        q = k * width + t
        price_in, price_out = C[C_TIER_F][CTF_PRICE_IN][k], C[C_TIER_F][CTF_PRICE_OUT][k]
        P[P_F][PF_COUNTERS][q] += (price_in * prefill + price_out * decode) / C[C_PAIR_F][
            CP_DIVISOR
        ][q]


# ---------------------------------------------------------------- the engine


@njit(cache=True, _nrt=False)
def _step_ms(floats, constant, mixed_sum, n, batch, context):
    """costmodel.Profile.step_ms, the same operations in the same order."""
    a, b, c, d, e, f = floats[F_A], floats[F_B], floats[F_C], floats[F_D], floats[F_E], floats[F_F]
    floor = floats[F_FLOOR]
    if constant:
        return floats[F_CONSTANT]
    fn = float(n)
    fb = float(batch)
    if batch == 0:
        if n == 0:
            return 0.0
        x = a + b * fn + c * fn * fn
        return x if x > floor else floor
    if n and mixed_sum:
        x = d + e * fb
        y = a + b * fb
        decode = y if y > x else x
        z = a + b * fn + c * fn * fn
        return decode + (z if z > floor else floor) + f * float(context)
    compute = a + b * (float(n + batch))
    if n:
        compute = compute + c * fn * fn
        compute = compute if compute > floor else floor
    x = d + e * fb
    return (compute if compute > x else x) + f * float(context)


@njit(cache=True, _nrt=False)
def _pass_ended(J, state, now):
    """PassOver.pass_ended: the fresh jobs an admission pass left waiting are passed over."""
    status, wait_since, passed_over, fresh = (
        J[J_STATUS],
        J[J_I][JI_WAIT_SINCE],
        J[J_I][JI_PASSED_OVER],
        J[J_I][JI_FRESH],
    )
    m = state[S_FRESH]
    if state[S_WAITING]:
        for x in range(m):
            j = fresh[x]
            if status[j] == WAITING and wait_since[j] < 0:
                if passed_over[j] < 0:
                    passed_over[j] = now
                wait_since[j] = now
    state[S_FRESH] = 0


@njit(cache=True, _nrt=False)
def _admit(J, R, P, state, ints, floats, prompt, outs, ten, C, r, now):
    """Engine._admit without preemption, resumes or a prefix cache."""
    status = J[J_STATUS]
    replica = J[J_I][JI_REPLICA]
    admit = J[J_I][JI_ADMIT]
    backlog = J[J_I][JI_BACKLOG]
    wait_since = J[J_I][JI_WAIT_SINCE]
    prefill_left = J[J_I][JI_PREFILL_LEFT]
    blocks = J[J_I][JI_BLOCKS]
    rep_batch = R[R_I][RI_REP_BATCH]
    rep_pending = R[R_I][RI_REP_PENDING]
    rep_slots = R[R_I][RI_REP_SLOTS]
    rep_free = R[R_I][RI_REP_FREE]
    rep_extra = R[R_I][RI_REP_EXTRA]
    rep_last_end = R[R_I][RI_REP_LAST_END]
    pf = R[R_Q][RQ_PF]
    pf_len = R[R_I][RI_PF_LEN]
    tiered = ints[I_TIERED] != 0
    width = ints[I_WIDTH]
    chunked = ints[I_CHUNKED] != 0
    cap = ints[I_CAP]
    max_seqs = ints[I_MAX_SEQS]
    block = ints[I_BLOCK]
    charging = ints[I_CHARGING] != 0
    budget = cap - rep_batch[r] if chunked else cap
    steal = 0 if (ints[I_NREP] == 1 or rep_slots[r] == 0) else ints[I_STEAL]
    wake = 0
    if rep_slots[r] == 0 and now - rep_last_end[r] >= ints[I_IDLE_AFTER]:
        wake = ints[I_WAKE]
    while True:
        if chunked and rep_pending[r] >= budget:
            break
        cand = _peek(P, C, width, tiered) if state[S_WAITING] else -1
        if cand < 0:
            break
        if not chunked and rep_pending[r] and rep_pending[r] + prompt[cand] > cap:
            break
        need = -(-(prompt[cand] + outs[cand]) // block)
        if rep_slots[r] >= max_seqs or need > rep_free[r]:
            break
        t = ten[cand]
        _take(P, C, width, cand)
        rep_free[r] -= need
        rep_slots[r] += 1
        blocks[cand] = need
        status[cand] = RUNNING
        replica[cand] = r
        admit[cand] = now
        if wait_since[cand] >= 0:
            backlog[cand] += now - wait_since[cand]
            wait_since[cand] = -1
        state[S_WAITING] -= 1
        left = prompt[cand]
        prefill_left[cand] = left
        rep_pending[r] += left
        pf[r, pf_len[r]] = cand
        pf_len[r] += 1
        if charging:  # policy.charge(job, now, prompt_tokens): its prefill
            _charge(P, C, width, C[C_JOB_I][CJ_TIER][cand], t, prompt[cand], 0)
        rep_extra[r] += steal + wake
        wake = 0
    if state[S_FRESH]:
        _pass_ended(J, state, now)


@njit(cache=True, _nrt=False)
def _take_off(J, R, prompt, outs, ten, r, j):
    """Preempting._take_off: a running job leaves its replica's batch (cancelled)."""
    first_step = J[J_I][JI_FIRST_STEP]
    generated = J[J_I][JI_GENERATED]
    prefill_left = J[J_I][JI_PREFILL_LEFT]
    lead = J[J_I][JI_LEAD]
    seg_replica = J[J_I][JI_SEG_REPLICA]
    seg_lead = J[J_I][JI_SEG_LEAD]
    seg_first = J[J_I][JI_SEG_FIRST]
    seg_count = J[J_I][JI_SEG_COUNT]
    rep_batch = R[R_I][RI_REP_BATCH]
    rep_context = R[R_I][RI_REP_CONTEXT]
    rep_decoding = R[R_I][RI_REP_DECODING]
    rep_pending = R[R_I][RI_REP_PENDING]
    pf = R[R_Q][RQ_PF]
    pf_len = R[R_I][RI_PF_LEN]
    fh_step = R[R_Q][RQ_FH_STEP]
    fh_seq = R[R_Q][RQ_FH_SEQ]
    fh_job = R[R_Q][RQ_FH_JOB]
    fh_len = R[R_I][RI_FH_LEN]
    td = R[R_T][RT_TD]
    m = pf_len[r]
    at = -1
    for x in range(m):
        if pf[r, x] == j:
            at = x
            break
    if prefill_left[j] > 0 or at >= 0:
        for x in range(at, m - 1):
            pf[r, x] = pf[r, x + 1]
        pf_len[r] = m - 1
        rep_pending[r] -= prefill_left[j]
        return
    ran = rep_decoding[r] - first_step[j]  # decode steps this segment has run
    size = fh_len[r]
    for x in range(size):
        if fh_job[r, x] == j:
            _fh_remove(fh_step[r], fh_seq[r], fh_job[r], size, x)
            fh_len[r] = size - 1
            break
    rep_batch[r] -= 1
    rep_context[r] -= prompt[j] + generated[j] + ran
    td[r, ten[j]] -= 1
    seg_replica[j] = r
    seg_lead[j] = lead[j]
    seg_first[j] = first_step[j]
    seg_count[j] = ran
    lead[j] = -1
    generated[j] += ran


@njit(cache=True, _nrt=False)
def _cancel(J, R, P, state, ints, prompt, outs, ten, C, j, now):
    """Engine.cancel: True if the job was still live."""
    status = J[J_STATUS]
    replica = J[J_I][JI_REPLICA]
    done = J[J_I][JI_DONE]
    backlog = J[J_I][JI_BACKLOG]
    wait_since = J[J_I][JI_WAIT_SINCE]
    blocks = J[J_I][JI_BLOCKS]
    st = status[j]
    if st == WAITING:
        _remove(P, C, ints[I_WIDTH], j)
        state[S_WAITING] -= 1
        if wait_since[j] >= 0:
            backlog[j] += now - wait_since[j]
            wait_since[j] = -1
    elif st == RUNNING:
        r = replica[j]
        _take_off(J, R, prompt, outs, ten, r, j)
        R[R_I][RI_REP_SLOTS][r] -= 1
        R[R_I][RI_REP_FREE][r] += blocks[j]
        if ints[I_RELEASES]:
            _release(P, C, j)
    else:
        return False
    status[j] = CANCELLED
    done[j] = now
    return True


@njit(cache=True, _nrt=False)
def _submit(J, R, P, state, ints, prompt, outs, ten, C, j, now):
    """Engine.submit without admission limits or control: False when refused (too long)."""
    status, seq, reject_code, fresh = (
        J[J_STATUS],
        J[J_I][JI_SEQ],
        J[J_I][JI_REJECT_CODE],
        J[J_I][JI_FRESH],
    )
    state[S_SEQ] += 1
    seq[j] = state[S_SEQ]
    if prompt[j] + outs[j] > ints[I_FITS]:  # refuse_too_long: 400 context_length_exceeded
        status[j] = REJECTED
        reject_code[j] = 400
        return False
    _enqueue(P, C, ints[I_WIDTH], j, now)
    state[S_WAITING] += 1
    fresh[state[S_FRESH]] = j
    state[S_FRESH] += 1
    if ints[I_STEAL] and ints[I_NREP] == 1 and R[R_I][RI_REP_SLOTS][0] > 0:
        R[R_I][RI_REP_EXTRA][0] += ints[I_STEAL]  # its front end ran beside the steps
    return True


@njit(cache=True, _nrt=False)
def _step(J, R, P, state, ints, floats, prompt, outs, ten, C, log_end, log_rep, r, now):
    """Engine.step: (the step's end, jobs it finished), or (-1, 0) when there is nothing to
    run (Engine.step's None)."""
    status = J[J_STATUS]
    first_token = J[J_I][JI_FIRST_TOKEN]
    done = J[J_I][JI_DONE]
    first_step = J[J_I][JI_FIRST_STEP]
    last_step = J[J_I][JI_LAST_STEP]
    generated = J[J_I][JI_GENERATED]
    prefill_left = J[J_I][JI_PREFILL_LEFT]
    blocks = J[J_I][JI_BLOCKS]
    seq = J[J_I][JI_SEQ]
    lead = J[J_I][JI_LEAD]
    rep_batch = R[R_I][RI_REP_BATCH]
    rep_context = R[R_I][RI_REP_CONTEXT]
    rep_decoding = R[R_I][RI_REP_DECODING]
    rep_pending = R[R_I][RI_REP_PENDING]
    rep_slots = R[R_I][RI_REP_SLOTS]
    rep_free = R[R_I][RI_REP_FREE]
    rep_extra = R[R_I][RI_REP_EXTRA]
    rep_last_end = R[R_I][RI_REP_LAST_END]
    rep_steps = R[R_I][RI_REP_STEPS]
    pf = R[R_Q][RQ_PF]
    pf_len = R[R_I][RI_PF_LEN]
    fh_step = R[R_Q][RQ_FH_STEP]
    fh_seq = R[R_Q][RQ_FH_SEQ]
    fh_job = R[R_Q][RQ_FH_JOB]
    fh_len = R[R_I][RI_FH_LEN]
    td = R[R_T][RT_TD]
    charging = ints[I_CHARGING] != 0
    releases = ints[I_RELEASES] != 0
    n_ten = ints[I_NTEN]
    width = ints[I_WIDTH]
    td_job = R[R_T][RT_TD_JOB]
    tier = C[C_JOB_I][CJ_TIER]
    if state[S_WAITING] and (rep_batch[r] == 0 or rep_steps[r] % ints[I_ADMIT_EVERY] == 0):
        _admit(J, R, P, state, ints, floats, prompt, outs, ten, C, r, now)
    m = pf_len[r]
    extra = rep_extra[r]
    n = 0
    ready = 0  # jobs whose prefill ends in this step
    if m == 0:
        decoding = rep_batch[r]
        if decoding == 0 and extra == 0:
            return -1, 0
    elif ints[I_CHUNKED]:
        decoding = rep_batch[r]
        room = ints[I_CAP] - decoding
        for x in range(m):
            if room <= 0:
                break
            j = pf[r, x]
            left = prefill_left[j]
            chunk = left if left < room else room
            prefill_left[j] = left - chunk
            room -= chunk
            n += chunk
            if left == chunk:
                ready += 1
    else:
        decoding = 0
        for x in range(m):
            j = pf[r, x]
            n += prefill_left[j]
            prefill_left[j] = 0
        ready = m
    if n == 0 and decoding == 0 and ready == 0 and extra == 0:
        return -1, 0
    if n == 0 and decoding and not ints[I_CONSTANT]:
        # Profile.decode_base_ms(batch) + f * context
        fb = float(decoding)
        x = floats[F_D] + floats[F_E] * fb
        y = floats[F_A] + floats[F_B] * fb
        base = y if y > x else x
        ms = base + floats[F_F] * float(rep_context[r])
    else:
        ms = _step_ms(floats, ints[I_CONSTANT], ints[I_MIXED_SUM], n, decoding, rep_context[r])
    duration = np.int64(ms * 1e6)
    if duration == 0:
        duration = 1
    duration += extra
    rep_extra[r] = 0
    end = now + duration
    rep_last_end[r] = end
    rep_steps[r] += 1
    if n:
        rep_pending[r] -= n
    finished = 0
    if decoding:
        k = rep_decoding[r]
        rep_decoding[r] = k + 1
        at = state[S_LOG]
        log_end[at] = end
        log_rep[at] = r
        state[S_LOG] = at + 1
        rep_context[r] += decoding
        if charging:  # the policy's charge per decoding tenant (Vtc.charge_decode)
            for t in range(n_ten):
                count = td[r, t]
                if count:  # to the tier of the tenant's entry's job (Engine's tenant_decode)
                    _charge(P, C, width, tier[td_job[r, t]], t, 0, count)
        steps_r, seqs_r, jobs_r = fh_step[r], fh_seq[r], fh_job[r]
        while fh_len[r] and steps_r[0] == k:  # Engine._finish_decoding, in seq order
            j = jobs_r[0]
            size = fh_len[r]
            _fh_remove(steps_r, seqs_r, jobs_r, size, 0)
            fh_len[r] = size - 1
            last_step[j] = k
            td[r, ten[j]] -= 1
            status[j] = FINISHED
            done[j] = end
            rep_batch[r] -= 1
            rep_slots[r] -= 1
            rep_context[r] -= prompt[j] + outs[j]
            rep_free[r] += blocks[j]
            if releases:
                _release(P, C, j)
            finished += 1
    if ready:  # Engine._first_tokens
        dec = rep_decoding[r]
        joined = 0
        context = 0
        for x in range(ready):
            j = pf[r, x]
            g = generated[j]
            if g == 0:
                first_token[j] = end
            lead[j] = end
            most = outs[j]
            if most == 0 or g + 1 >= most:
                generated[j] = most
                status[j] = FINISHED  # Engine._finish
                done[j] = end
                rep_slots[r] -= 1
                rep_free[r] += blocks[j]
                if releases:
                    _release(P, C, j)
                finished += 1
                continue
            g += 1
            generated[j] = g
            first_step[j] = dec
            joined += 1
            context += prompt[j] + g
            size = fh_len[r]
            fh_step[r, size] = dec + most - g - 1
            fh_seq[r, size] = seq[j]
            fh_job[r, size] = j
            fh_len[r] = size + 1
            _fh_up(fh_step[r], fh_seq[r], fh_job[r], size)
            t = ten[j]
            if td[r, t] == 0:  # a new entry of tenant_decode: [count, this job]
                td_job[r, t] = j
            td[r, t] += 1
            if charging:  # policy.charge(job, end, 0, 1)
                _charge(P, C, width, tier[j], t, 0, 1)
        for x in range(ready, m):
            pf[r, x - ready] = pf[r, x]
        pf_len[r] = m - ready
        rep_batch[r] += joined
        rep_context[r] += context
    return end, finished


@njit(cache=True, _nrt=False)
def _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, C, log_end, log_rep, now):
    """virtual.simulate's kick: start a step on idle replicas while the queue may have work."""
    run_heap, idle_heap = H
    shift = ints[I_SHIFT]
    tried = -1
    while state[S_IDLE] and state[S_WAITING]:
        r = _pop(idle_heap, state[S_IDLE])
        state[S_IDLE] -= 1
        end, fin = _step(J, R, P, state, ints, floats, prompt, outs, ten, C, log_end,
                         log_rep, r, now)  # fmt: skip
        if end < 0:
            tried = r
            break
        state[S_ENDED] += fin
        _push(run_heap, state[S_RUN], (end << shift) | r)
        state[S_RUN] += 1
    if tried >= 0:
        _push(idle_heap, state[S_IDLE], tried)
        state[S_IDLE] += 1


@njit(cache=True, _nrt=False)
def run(state, ints, floats, prompt, outs, arrival, ten, C, J, R, P, H, log_end, log_rep,
        slice_events):  # fmt: skip
    """virtual.simulate's loop (`follow is None`) from where `state` left it, until the run
    ends (0), `slice_events` events ran (1), or the decode-step log has too little room left
    for one more event (2)."""
    status = J[J_STATUS]
    run_heap, idle_heap = H
    n = len(arrival)
    n_rep = ints[I_NREP]
    shift = ints[I_SHIFT]
    mask = (np.int64(1) << shift) - 1
    timeout = ints[I_TIMEOUT]
    patience = NEVER if timeout < 0 else timeout
    stop_at = ints[I_STOP]
    room = len(log_end) - n_rep - 2  # the log's use must stay below it before a step
    events = 0
    while state[S_I] < n or state[S_RUN]:
        if events >= slice_events:
            return 1
        if state[S_LOG] + n_rep + 2 > room:
            return 2
        events += 1
        i = state[S_I]
        d = state[S_D]
        limit = arrival[d] + patience if d < i else NEVER
        if stop_at < limit:
            limit = stop_at
        running = state[S_RUN] > 0
        top = run_heap[0] >> shift if running else NEVER
        if i < n and (not running or arrival[i] <= top):  # arrivals go before step ends
            if arrival[i] <= limit:
                while True:
                    j = i
                    now = arrival[j]
                    state[S_NOW] = now
                    i += 1
                    state[S_I] = i
                    if _submit(J, R, P, state, ints, prompt, outs, ten, C, j, now):
                        if state[S_IDLE]:
                            _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, C,
                                  log_end, log_rep, now)  # fmt: skip
                    else:
                        state[S_ENDED] += 1
                    if i == n or state[S_LOG] + n_rep + 2 > room:
                        break
                    t = arrival[i]
                    if (
                        (state[S_RUN] and t > (run_heap[0] >> shift))
                        or t > stop_at
                        or (d < i and t > arrival[d] + patience)
                    ):
                        break
                continue
        elif running and top < limit:  # step ends, while before the next arrival and limit
            t = arrival[i] if i < n else NEVER
            bound = t if t < limit else limit
            while state[S_RUN] and (run_heap[0] >> shift) < bound:
                # each step counts as an event, as virtual.simulate counts them for progress;
                # `>`: the event that entered here counted, and at least one step runs
                if state[S_LOG] + n_rep + 2 > room or events > slice_events:
                    break
                events += 1
                key = run_heap[0]
                now = key >> shift
                r = key & mask
                state[S_NOW] = now
                end, fin = _step(J, R, P, state, ints, floats, prompt, outs, ten, C,
                                 log_end, log_rep, r, now)  # fmt: skip
                if end < 0:
                    _pop(run_heap, state[S_RUN])
                    state[S_RUN] -= 1
                    _push(idle_heap, state[S_IDLE], r)
                    state[S_IDLE] += 1
                    continue
                run_heap[0] = (end << shift) | r  # heapreplace
                _sift_down(run_heap, state[S_RUN], 0)
                if fin:
                    state[S_ENDED] += fin
                    if state[S_IDLE] and state[S_WAITING]:
                        _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, C,
                              log_end, log_rep, now)  # fmt: skip
            continue
        # a timeout or the stop is next (or comes at the same instant as a step end)
        t_arrive = arrival[i] if i < n else NEVER
        t_step = run_heap[0] >> shift if state[S_RUN] else NEVER
        t_due = arrival[d] + timeout if timeout >= 0 and d < i else NEVER
        if t_due < t_arrive and t_due <= stop_at and t_due <= t_step:
            state[S_D] = d + 1
            now = t_due
            state[S_NOW] = now
            live = status[d] == WAITING or status[d] == RUNNING
            if live and _cancel(J, R, P, state, ints, prompt, outs, ten, C, d, now):
                state[S_ENDED] += 1
            continue
        if stop_at < t_arrive and stop_at <= t_step:
            now = stop_at
            state[S_NOW] = now
            for j in range(i):
                if status[j] == WAITING or status[j] == RUNNING:
                    _cancel(J, R, P, state, ints, prompt, outs, ten, C, j, now)
            return 0
        if t_arrive < NEVER and (not state[S_RUN] or t_arrive <= t_step):
            j = i
            state[S_I] = i + 1
            now = arrival[j]
            state[S_NOW] = now
            if _submit(J, R, P, state, ints, prompt, outs, ten, C, j, now):
                if state[S_IDLE]:
                    _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, C, log_end,
                          log_rep, now)  # fmt: skip
            else:
                state[S_ENDED] += 1
            continue
        key = _pop(run_heap, state[S_RUN])  # a step end (a timeout or the stop at that instant)
        state[S_RUN] -= 1
        now = key >> shift
        r = key & mask
        state[S_NOW] = now
        end, fin = _step(J, R, P, state, ints, floats, prompt, outs, ten, C, log_end,
                         log_rep, r, now)  # fmt: skip
        if end < 0:
            _push(idle_heap, state[S_IDLE], r)
            state[S_IDLE] += 1
            continue
        _push(run_heap, state[S_RUN], (end << shift) | r)
        state[S_RUN] += 1
        state[S_ENDED] += fin
        if fin and state[S_IDLE] and state[S_WAITING]:
            _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, C, log_end,
                  log_rep, now)  # fmt: skip
    return 0
