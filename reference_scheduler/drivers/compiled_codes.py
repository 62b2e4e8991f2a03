"""The codes the compiled driver (compiled.py) and its loop (compiled_loop.py) share: job
statuses, a tier's child kinds, the indices of the loop's scalar state. A module of their own
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
