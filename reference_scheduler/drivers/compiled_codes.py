"""The codes the compiled driver (compiled.py) and its loop (compiled_loop.py) share: job
statuses, a tier's child kinds, the indices of the loop's scalar state, the row names of the 2D
arrays the driver fills and the loop reads. A module of their own
so that each of the two imports them, not the other (the loop needs numba, the driver's
checks do not)."""

from __future__ import annotations

NEVER = 1 << 62
# job status codes (Job.status): the order of STATUS_NAMES
WAITING, RUNNING, FINISHED, REJECTED, CANCELLED = 0, 1, 2, 3, 4
STATUS_NAMES = ("waiting", "running", "finished", "rejected", "cancelled")
# a tier's child (compiled_loop); SFQ is DWRR over hashed buckets, run as DWRR by the loop
FIFO, VTC, LCF, DWRR, PRIORITY, WFQ, SFQ = 0, 1, 2, 3, 4, 5, 6
QUEUE_FIFO, QUEUE_WFQ = 0, 1  # what orders each DWRR class's own jobs (its child)

# the loop's scalar state, one int64 each in `state` (indices)
(
    S_I,  # next arrival
    S_D,  # next job whose timeout is due
    S_NOW,
    S_ENDED,
    S_SEQ,  # submissions so far (Job.seq)
    S_WAITING,  # jobs in the policy (admission.waiting == len(policy))
    S_RUN,  # size of the running heap
    S_IDLE,  # size of the idle heap
    S_FRESH,  # jobs arrived since the last admission pass
    S_LOG,  # decode-step log entries used
) = range(10)
N_STATE = 10

# compiled_loop's row names of the loop's 2D arrays, which compiled._Arrays fills:
# J[J_I]'s rows, per job, int64
(
    JI_REPLICA,
    JI_ADMIT,
    JI_FIRST_TOKEN,
    JI_DONE,
    JI_FIRST_STEP,
    JI_LAST_STEP,
    JI_BACKLOG,
    JI_PASSED_OVER,
    JI_WAIT_SINCE,
    JI_REJECT_CODE,
    JI_GENERATED,
    JI_PREFILL_LEFT,
    JI_BLOCKS,
    JI_SEQ,
    JI_LEAD,
    JI_SEG_REPLICA,
    JI_SEG_LEAD,
    JI_SEG_FIRST,
    JI_SEG_COUNT,
    JI_NXT,
    JI_FRESH,
) = range(21)
# R[R_I]'s rows, per replica, int64; R[R_Q]'s (per slot) and R[R_T]'s (per tenant)
(
    RI_REP_BATCH,
    RI_REP_CONTEXT,
    RI_REP_DECODING,
    RI_REP_PENDING,
    RI_REP_SLOTS,
    RI_REP_FREE,
    RI_REP_EXTRA,
    RI_REP_LAST_END,
    RI_REP_STEPS,
    RI_PF_LEN,
    RI_FH_LEN,
) = range(11)
RQ_PF, RQ_FH_STEP, RQ_FH_SEQ, RQ_FH_JOB = range(4)
RT_TD, RT_TD_JOB = range(2)
# P[P_I]'s rows: per (tier, class), int64
(
    PI_QHEAD,
    PI_QTAIL,
    PI_QLIVE,
    PI_ORDER,
    PI_DWAITING,
    PI_GPS_FLOWS,
    PI_GPS_N,
    PI_HEAP_OFF,
    PI_GPS_SIZE,
    PI_JOBS_SIZE,
) = range(10)
# P[P_T]'s rows: per tier, int64
(
    PT_LAST_LEFT,
    PT_SEEN,
    PT_RING_HEAD,
    PT_RING_SIZE,
    PT_RUNNING,
    PT_TWAITING,
) = range(6)
