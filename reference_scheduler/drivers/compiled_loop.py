"""The compiled driver's loop (numba): `virtual.simulate` and `scheduler.engine.Engine`,
transcribed onto arrays. Read compiled.py first; every function here names what it
transcribes, and keeps its order of operations (integer sums may be regrouped, float ones are
not).

The arrays come in three tuples: J per job, R per replica, P the policy's (queues, VTC's
counters). `state` holds the scalars (compiled.S_*), `ints` and `floats` the configuration
(compiled.simulate_columns lists them). Status codes are compiled.STATUS_NAMES'."""

from __future__ import annotations

import numpy as np
from numba import njit

NEVER = 1 << 62
WAITING, RUNNING, FINISHED, REJECTED, CANCELLED = 0, 1, 2, 3, 4
FIFO, VTC, LCF = 0, 1, 2
(
    S_I,
    S_D,
    S_NOW,
    S_EVENTS,
    S_ENDED,
    S_SEQ,
    S_WAITING,
    S_RUN,
    S_IDLE,
    S_FRESH,
    S_LAST_LEFT,
    S_SEEN,
    S_LOG,
    S_DONE,
    S_GRANTED,
) = range(15)
# ints' indices
(
    I_KIND,
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
) = range(17)
# the tuples' members (compiled._Arrays: jobs(), replicas(), policy())
(
    J_STATUS,
    J_REPLICA,
    J_ADMIT,
    J_FIRST_TOKEN,
    J_DONE,
    J_FIRST_STEP,
    J_LAST_STEP,
    J_BACKLOG,
    J_PASSED_OVER,
    J_WAIT_SINCE,
    J_REJECT_CODE,
    J_GENERATED,
    J_PREFILL_LEFT,
    J_BLOCKS,
    J_SEQ,
    J_LEAD,
    J_SEG_REPLICA,
    J_SEG_LEAD,
    J_SEG_FIRST,
    J_SEG_COUNT,
    J_NXT,
    J_INQ,
    J_FRESH,
) = range(23)
(
    R_REP_BATCH,
    R_REP_CONTEXT,
    R_REP_DECODING,
    R_REP_PENDING,
    R_REP_SLOTS,
    R_REP_FREE,
    R_REP_EXTRA,
    R_REP_LAST_END,
    R_REP_STEPS,
    R_PF,
    R_PF_LEN,
    R_FH_STEP,
    R_FH_SEQ,
    R_FH_JOB,
    R_FH_LEN,
    R_TD,
) = range(16)
(
    P_QHEAD,
    P_QTAIL,
    P_QLIVE,
    P_NXT,
    P_INQ,
    P_COUNTERS,
    P_ORDER,
    P_BACKLOGGED,
) = range(8)
F_A, F_B, F_C, F_D, F_E, F_F, F_FLOOR, F_CONSTANT, F_IN_PRICE, F_OUT_PRICE = range(10)


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


# ---------------------------------------------------------------- the policy (FIFO, VTC, LCF)


@njit(cache=True, _nrt=False)
def _lift(P, state, t):
    """Vtc._lift."""
    counters = P[P_COUNTERS]
    backlogged = P[P_BACKLOGGED]
    found = False
    floor = 0.0
    for u in range(len(backlogged)):
        if backlogged[u] and u != t:
            c = counters[u]
            if not found or c < floor:
                floor = c
                found = True
    if not found:
        left = state[S_LAST_LEFT]
        if left < 0 or left == t:
            return
        floor = counters[left]
    if floor > counters[t]:
        counters[t] = floor


@njit(cache=True, _nrt=False)
def _enqueue(P, state, kind, j, t):
    """Fifo.enqueue / Vtc.enqueue (every job is accepted)."""
    qhead = P[P_QHEAD]
    qtail = P[P_QTAIL]
    qlive = P[P_QLIVE]
    nxt = P[P_NXT]
    inq = P[P_INQ]
    counters = P[P_COUNTERS]
    order = P[P_ORDER]
    backlogged = P[P_BACKLOGGED]
    q = 0
    if kind != FIFO:
        q = t
        if order[t] < 0:  # its queue is made, its counter starts at 0
            counters[t] = 0.0
            order[t] = state[S_SEEN]
            state[S_SEEN] += 1
        if qlive[q] == 0:
            if kind == VTC:
                _lift(P, state, t)
            backlogged[t] = True
    nxt[j] = -1
    if qtail[q] >= 0:
        nxt[qtail[q]] = j
    else:
        qhead[q] = j
    qtail[q] = j
    inq[j] = True
    qlive[q] += 1


@njit(cache=True, _nrt=False)
def _peek(P, kind):
    """Fifo.peek / Vtc.peek: the job to admit next, -1 if none."""
    qhead = P[P_QHEAD]
    qtail = P[P_QTAIL]
    nxt = P[P_NXT]
    inq = P[P_INQ]
    counters = P[P_COUNTERS]
    order = P[P_ORDER]
    backlogged = P[P_BACKLOGGED]
    q = 0
    if kind != FIFO:  # Vtc._pick: the lowest (counter, first-seen order) backlogged
        q = -1
        best_c = 0.0
        for u in range(len(backlogged)):
            if backlogged[u]:
                c = counters[u]
                if q < 0 or c < best_c or (c == best_c and order[u] < order[q]):
                    q = u
                    best_c = c
        if q < 0:
            return -1
    head = qhead[q]
    while head >= 0 and not inq[head]:
        head = nxt[head]
    qhead[q] = head
    if head < 0:
        qtail[q] = -1
    return head


@njit(cache=True, _nrt=False)
def _leave(P, state, kind, q, t):
    qlive = P[P_QLIVE]
    backlogged = P[P_BACKLOGGED]
    if kind != FIFO and qlive[q] == 0:
        backlogged[t] = False
        state[S_LAST_LEFT] = t


@njit(cache=True, _nrt=False)
def _take(P, state, kind, j, t):
    """Fifo.take / Vtc.take of the head `_peek` just returned."""
    qhead = P[P_QHEAD]
    qtail = P[P_QTAIL]
    qlive = P[P_QLIVE]
    nxt = P[P_NXT]
    inq = P[P_INQ]
    q = 0 if kind == FIFO else t
    qhead[q] = nxt[j]
    if qhead[q] < 0:
        qtail[q] = -1
    inq[j] = False
    qlive[q] -= 1
    _leave(P, state, kind, q, t)


@njit(cache=True, _nrt=False)
def _remove(P, state, kind, j, t):
    """Fifo.remove / Vtc.remove (JobQueue.discard) of a waiting job."""
    qhead = P[P_QHEAD]
    qtail = P[P_QTAIL]
    qlive = P[P_QLIVE]
    inq = P[P_INQ]
    q = 0 if kind == FIFO else t
    if not inq[j]:
        return
    inq[j] = False
    qlive[q] -= 1
    if qlive[q] == 0:  # JobQueue.discard clears its items
        qhead[q] = -1
        qtail[q] = -1
    _leave(P, state, kind, q, t)


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
        J[J_WAIT_SINCE],
        J[J_PASSED_OVER],
        J[J_FRESH],
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
def _admit(J, R, P, state, ints, floats, prompt, outs, ten, divisor, r, now):
    """Engine._admit without preemption, resumes or a prefix cache."""
    status = J[J_STATUS]
    replica = J[J_REPLICA]
    admit = J[J_ADMIT]
    backlog = J[J_BACKLOG]
    wait_since = J[J_WAIT_SINCE]
    prefill_left = J[J_PREFILL_LEFT]
    blocks = J[J_BLOCKS]
    rep_batch = R[R_REP_BATCH]
    rep_pending = R[R_REP_PENDING]
    rep_slots = R[R_REP_SLOTS]
    rep_free = R[R_REP_FREE]
    rep_extra = R[R_REP_EXTRA]
    rep_last_end = R[R_REP_LAST_END]
    pf = R[R_PF]
    pf_len = R[R_PF_LEN]
    kind = ints[I_KIND]
    chunked = ints[I_CHUNKED] != 0
    cap = ints[I_CAP]
    max_seqs = ints[I_MAX_SEQS]
    block = ints[I_BLOCK]
    charging = kind != FIFO
    counters = P[P_COUNTERS]
    in_price = floats[F_IN_PRICE]
    out_price = floats[F_OUT_PRICE]
    budget = cap - rep_batch[r] if chunked else cap
    steal = 0 if (ints[I_NREP] == 1 or rep_slots[r] == 0) else ints[I_STEAL]
    wake = 0
    if rep_slots[r] == 0 and now - rep_last_end[r] >= ints[I_IDLE_AFTER]:
        wake = ints[I_WAKE]
    while True:
        if chunked and rep_pending[r] >= budget:
            break
        cand = _peek(P, kind) if state[S_WAITING] else -1
        if cand < 0:
            break
        if not chunked and rep_pending[r] and rep_pending[r] + prompt[cand] > cap:
            break
        need = -(-(prompt[cand] + outs[cand]) // block)
        if rep_slots[r] >= max_seqs or need > rep_free[r]:
            break
        t = ten[cand]
        _take(P, state, kind, cand, t)
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
        if charging:  # Vtc.charge(job, now, prompt_tokens)
            counters[t] += (in_price * float(prompt[cand]) + out_price * 0.0) / divisor[t]
        rep_extra[r] += steal + wake
        wake = 0
    if state[S_FRESH]:
        _pass_ended(J, state, now)


@njit(cache=True, _nrt=False)
def _take_off(J, R, prompt, outs, ten, r, j):
    """Preempting._take_off: a running job leaves its replica's batch (cancelled)."""
    first_step = J[J_FIRST_STEP]
    generated = J[J_GENERATED]
    prefill_left = J[J_PREFILL_LEFT]
    lead = J[J_LEAD]
    seg_replica = J[J_SEG_REPLICA]
    seg_lead = J[J_SEG_LEAD]
    seg_first = J[J_SEG_FIRST]
    seg_count = J[J_SEG_COUNT]
    rep_batch = R[R_REP_BATCH]
    rep_context = R[R_REP_CONTEXT]
    rep_decoding = R[R_REP_DECODING]
    rep_pending = R[R_REP_PENDING]
    pf = R[R_PF]
    pf_len = R[R_PF_LEN]
    fh_step = R[R_FH_STEP]
    fh_seq = R[R_FH_SEQ]
    fh_job = R[R_FH_JOB]
    fh_len = R[R_FH_LEN]
    td = R[R_TD]
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
def _cancel(J, R, P, state, ints, prompt, outs, ten, j, now):
    """Engine.cancel: True if the job was still live."""
    status = J[J_STATUS]
    replica = J[J_REPLICA]
    done = J[J_DONE]
    backlog = J[J_BACKLOG]
    wait_since = J[J_WAIT_SINCE]
    blocks = J[J_BLOCKS]
    st = status[j]
    if st == WAITING:
        _remove(P, state, ints[I_KIND], j, ten[j])
        state[S_WAITING] -= 1
        if wait_since[j] >= 0:
            backlog[j] += now - wait_since[j]
            wait_since[j] = -1
    elif st == RUNNING:
        r = replica[j]
        _take_off(J, R, prompt, outs, ten, r, j)
        R[R_REP_SLOTS][r] -= 1
        R[R_REP_FREE][r] += blocks[j]
    else:
        return False
    status[j] = CANCELLED
    done[j] = now
    return True


@njit(cache=True, _nrt=False)
def _submit(J, R, P, state, ints, prompt, outs, ten, j, now):
    """Engine.submit without admission limits or control: False when refused (too long)."""
    status, seq, reject_code, fresh = J[J_STATUS], J[J_SEQ], J[J_REJECT_CODE], J[J_FRESH]
    state[S_SEQ] += 1
    seq[j] = state[S_SEQ]
    if prompt[j] + outs[j] > ints[I_FITS]:  # refuse_too_long: 400 context_length_exceeded
        status[j] = REJECTED
        reject_code[j] = 400
        return False
    _enqueue(P, state, ints[I_KIND], j, ten[j])
    state[S_WAITING] += 1
    fresh[state[S_FRESH]] = j
    state[S_FRESH] += 1
    if ints[I_STEAL] and ints[I_NREP] == 1 and R[R_REP_SLOTS][0] > 0:
        R[R_REP_EXTRA][0] += ints[I_STEAL]  # its front end ran beside the steps
    return True


@njit(cache=True, _nrt=False)
def _step(J, R, P, state, ints, floats, prompt, outs, ten, divisor, log_end, log_rep, r, now):
    """Engine.step: (the step's end, jobs it finished), or (-1, 0) when there is nothing to
    run (Engine.step's None)."""
    status = J[J_STATUS]
    first_token = J[J_FIRST_TOKEN]
    done = J[J_DONE]
    first_step = J[J_FIRST_STEP]
    last_step = J[J_LAST_STEP]
    generated = J[J_GENERATED]
    prefill_left = J[J_PREFILL_LEFT]
    blocks = J[J_BLOCKS]
    seq = J[J_SEQ]
    lead = J[J_LEAD]
    rep_batch = R[R_REP_BATCH]
    rep_context = R[R_REP_CONTEXT]
    rep_decoding = R[R_REP_DECODING]
    rep_pending = R[R_REP_PENDING]
    rep_slots = R[R_REP_SLOTS]
    rep_free = R[R_REP_FREE]
    rep_extra = R[R_REP_EXTRA]
    rep_last_end = R[R_REP_LAST_END]
    rep_steps = R[R_REP_STEPS]
    pf = R[R_PF]
    pf_len = R[R_PF_LEN]
    fh_step = R[R_FH_STEP]
    fh_seq = R[R_FH_SEQ]
    fh_job = R[R_FH_JOB]
    fh_len = R[R_FH_LEN]
    td = R[R_TD]
    kind = ints[I_KIND]
    charging = kind != FIFO
    counters = P[P_COUNTERS]
    if state[S_WAITING] and (rep_batch[r] == 0 or rep_steps[r] % ints[I_ADMIT_EVERY] == 0):
        _admit(J, R, P, state, ints, floats, prompt, outs, ten, divisor, r, now)
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
        if charging:  # Vtc.charge_decode over the replica's decoding tenants
            out_price = floats[F_OUT_PRICE]
            zero = floats[F_IN_PRICE] * 0.0
            for t in range(td.shape[1]):
                count = td[r, t]
                if count:
                    counters[t] += (zero + out_price * float(count)) / divisor[t]
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
            finished += 1
    if ready:  # Engine._first_tokens
        dec = rep_decoding[r]
        joined = 0
        context = 0
        in_price = floats[F_IN_PRICE]
        out_price = floats[F_OUT_PRICE]
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
            td[r, t] += 1
            if charging:  # Vtc.charge(job, end, 0, 1)
                counters[t] += (in_price * 0.0 + out_price * 1.0) / divisor[t]
        for x in range(ready, m):
            pf[r, x - ready] = pf[r, x]
        pf_len[r] = m - ready
        rep_batch[r] += joined
        rep_context[r] += context
    return end, finished


@njit(cache=True, _nrt=False)
def _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, divisor, log_end, log_rep, now):
    """virtual.simulate's kick: start a step on idle replicas while the queue may have work."""
    run_heap, idle_heap = H
    shift = ints[I_SHIFT]
    tried = -1
    while state[S_IDLE] and state[S_WAITING]:
        r = _pop(idle_heap, state[S_IDLE])
        state[S_IDLE] -= 1
        end, fin = _step(J, R, P, state, ints, floats, prompt, outs, ten, divisor, log_end,
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
def run(state, ints, floats, prompt, outs, arrival, ten, divisor, J, R, P, H, log_end, log_rep,
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
                    if _submit(J, R, P, state, ints, prompt, outs, ten, j, now):
                        if state[S_IDLE]:
                            _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, divisor,
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
                # each step counts as an event, as virtual.simulate counts them for progress
                if state[S_LOG] + n_rep + 2 > room or events >= slice_events:
                    break
                events += 1
                key = run_heap[0]
                now = key >> shift
                r = key & mask
                state[S_NOW] = now
                end, fin = _step(J, R, P, state, ints, floats, prompt, outs, ten, divisor,
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
                        _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, divisor,
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
            if live and _cancel(J, R, P, state, ints, prompt, outs, ten, d, now):
                state[S_ENDED] += 1
            continue
        if stop_at < t_arrive and stop_at <= t_step:
            now = stop_at
            state[S_NOW] = now
            for j in range(i):
                if status[j] == WAITING or status[j] == RUNNING:
                    _cancel(J, R, P, state, ints, prompt, outs, ten, j, now)
            state[S_DONE] = 1
            return 0
        if t_arrive < NEVER and (not state[S_RUN] or t_arrive <= t_step):
            j = i
            state[S_I] = i + 1
            now = arrival[j]
            state[S_NOW] = now
            if _submit(J, R, P, state, ints, prompt, outs, ten, j, now):
                if state[S_IDLE]:
                    _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, divisor, log_end,
                          log_rep, now)  # fmt: skip
            else:
                state[S_ENDED] += 1
            continue
        key = _pop(run_heap, state[S_RUN])  # a step end (a timeout or the stop at that instant)
        state[S_RUN] -= 1
        now = key >> shift
        r = key & mask
        state[S_NOW] = now
        end, fin = _step(J, R, P, state, ints, floats, prompt, outs, ten, divisor, log_end,
                         log_rep, r, now)  # fmt: skip
        if end < 0:
            _push(idle_heap, state[S_IDLE], r)
            state[S_IDLE] += 1
            continue
        _push(run_heap, state[S_RUN], (end << shift) | r)
        state[S_RUN] += 1
        state[S_ENDED] += fin
        if fin and state[S_IDLE] and state[S_WAITING]:
            _kick(J, R, P, H, state, ints, floats, prompt, outs, ten, divisor, log_end,
                  log_rep, now)  # fmt: skip
    state[S_DONE] = 1
    return 0
