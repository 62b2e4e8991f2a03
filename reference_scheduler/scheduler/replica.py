"""One replica's state and what one of its steps did, for `engine.Engine`.

Apart from the engine so that engine.py holds the step's logic (modules stay under 600 lines,
issue 31); `StepResult` is still importable from `scheduler.engine`."""

from __future__ import annotations

from reference_scheduler.core.costmodel import StepNoise
from reference_scheduler.core.job import Job


class StepResult:
    """What one iteration did. Reused per replica: read it before stepping that replica again."""

    __slots__ = (
        "admitted",
        "dirty",
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
        # set when any of the four lists got a job: the next step of this replica clears them
        # (one check a step instead of four; vllm.VllmEngine clears them every step)
        self.dirty = False


class Replica:
    __slots__ = (
        "batch",
        "context",
        "decode_ends",
        "decoding",
        "extra_ns",
        "finish_at",
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
        # decode step index -> the jobs whose last token it yields (a dict of buckets, not a
        # heap: a push and a pop are a dict operation instead of log(batch) tuple compares)
        self.finish_at: dict[int, list[Job]] = {}
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
