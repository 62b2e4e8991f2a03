"""Where the points of a sweep, the runs of an A/B and the loads of a knee search run: in this
process, in a local process pool, or as Ray tasks on a cluster (`--ray`).

The three commands describe each point the same way (a `PointJob`: the scenario document, its
run directory, its seed) and hand them to one `PointRunner`, chosen once from the command line
by `make_runner`, so none of them grows a branch of its own for Ray. Whichever runner runs it,
a point is `run_scenario` on the same scenario and seed, so a simulated point's summary.json is
the same byte for byte (virtual time; the simulator is deterministic).

Simulated points may run at once (a pool of `parallel` processes here; on Ray, as many as the
cluster has CPUs for); live points run one after another everywhere, so that they do not
compete for the target they measure. A point that raises is a failed `PointResult` with one
line naming it; the other points still run and keep their results.

On Ray, a point runs in a scratch directory on whichever node Ray picks, and its run directory
comes back to the driver as files, so the results land where the command was typed even when
the nodes share no file system. The `after` callback (the report writer) then runs on the
driver. Ray is imported only when a Ray runner is made: the core install has no ray.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import parse_scenario

AfterRun = Callable[[Path], None]  # e.g. the report writer; module-level, so a pool can pickle it

# What a point can raise that is bad input (exit 2), not a failed measurement (exit 1).
BAD_INPUT = (
    ScenarioError,
    FileExistsError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


@dataclass(frozen=True)
class PointJob:
    """One run to make: `data` (a scenario document, relative paths resolved against `source`'s
    directory) into the run directory `out`, with `seed` (None: the scenario's). `label` names
    the point in progress and error lines, e.g. `point 2 (scheduler.policy=vtc)`."""

    label: str
    data: dict[str, Any]
    source: str
    out: str
    seed: int | None = None
    after: AfterRun | None = None

    @property
    def simulated(self) -> bool:
        target = self.data.get("target")
        return isinstance(target, dict) and target.get("kind") == "sim"


@dataclass
class PointResult:
    """What became of one job: its summary, or one line saying why there is none."""

    job: PointJob
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    bad_input: bool = False  # the error is one of BAD_INPUT: the command exits 2, not 1

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def valid(self) -> bool | None:
        return None if self.failed else bool(self.summary.get("valid"))


Progress = Callable[[PointResult, int, int], None]  # a point's result, points done, points in all


class PointsFailed(RuntimeError):
    """Some points failed: one line each; `exit_code` 2 when every one failed on bad input (the
    CLI's rule for bad input), else 1."""

    def __init__(self, lines: Sequence[str], bad_input: bool) -> None:
        self.lines = list(lines)
        self.exit_code = 2 if bad_input else 1
        super().__init__("\n".join(self.lines))

    @classmethod
    def of(cls, failed: Sequence[PointResult]) -> PointsFailed:
        return cls([str(r.error) for r in failed], all(r.bad_input for r in failed))


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if isinstance(error, ScenarioError):
        text = "; ".join(error.lines)
    return text[:400] if isinstance(error, BAD_INPUT) else f"{type(error).__name__}: {text[:400]}"


def run_point(job: PointJob) -> dict[str, Any]:
    """Run the job's scenario into its run directory (then `after` on it); its summary."""
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions

    scn = parse_scenario(job.data, job.source, Path(job.source).parent)
    outcome = run_scenario(scn, RunOptions(out=Path(job.out), seed=job.seed))
    if job.after is not None:
        job.after(outcome.run_dir)
    return outcome.summary


def attempt(job: PointJob) -> PointResult:
    """`run_point`, with what it raised as the point's one-line error (the pool's and the Ray
    task's entry point: a failure comes back as a result, not as a lost worker)."""
    try:
        return PointResult(job, run_point(job))
    except Exception as error:
        return PointResult(job, error=f"{job.label}: {_one_line(error)}", bad_input=_bad(error))


def _bad(error: BaseException) -> bool:
    return isinstance(error, BAD_INPUT)


class PointRunner:
    """Runs jobs and returns their results in the jobs' order, calling `progress` as each one
    completes. Use it as a context manager: a Ray runner disconnects on exit."""

    def run(
        self, jobs: Sequence[PointJob], parallel: int = 1, progress: Progress | None = None
    ) -> list[PointResult]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the runner holds (nothing, here)."""

    def __enter__(self) -> PointRunner:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _report(
    results: list[PointResult | None], k: int, result: PointResult, progress: Progress | None
) -> None:
    results[k] = result
    if progress is not None:
        progress(result, sum(r is not None for r in results), len(results))


class LocalRunner(PointRunner):
    """This machine: simulated jobs in a pool of `parallel` processes (spawned, so each starts
    clean), anything else one after another in this process."""

    def run(
        self, jobs: Sequence[PointJob], parallel: int = 1, progress: Progress | None = None
    ) -> list[PointResult]:
        results: list[PointResult | None] = [None] * len(jobs)
        workers = min(parallel, len(jobs))
        if workers > 1 and all(job.simulated for job in jobs):
            import multiprocessing as mp

            with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
                futures: dict[Future[PointResult], int] = {
                    pool.submit(attempt, job): k for k, job in enumerate(jobs)
                }
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in sorted(done, key=futures.__getitem__):
                        k = futures[future]
                        try:
                            result = future.result()
                        except Exception as error:  # the worker process itself died
                            result = PointResult(
                                jobs[k], error=f"{jobs[k].label}: {_one_line(error)}"
                            )
                        _report(results, k, result, progress)
        else:
            for k, job in enumerate(jobs):
                _report(results, k, attempt(job), progress)
        return [r for r in results if r is not None]


# --------------------------------------------------------------------------- on a Ray cluster


def remote_attempt(job: PointJob) -> tuple[PointResult, dict[str, bytes]]:
    """The Ray task: the job in a scratch directory on this node, without `after`; its result
    and its run directory's files (relative path -> bytes), for the driver to write."""
    scratch = Path(tempfile.mkdtemp(prefix="fairbench-point-"))
    try:
        here = replace(job, out=str(scratch / Path(job.out).name), after=None)
        result = attempt(here)
        files: dict[str, bytes] = {}
        run_dir = Path(here.out)
        if run_dir.is_dir():
            for path in sorted(run_dir.rglob("*")):
                if path.is_file():
                    files[path.relative_to(run_dir).as_posix()] = path.read_bytes()
        if result.failed:  # name the driver's directory, not this node's scratch one
            result.error = str(result.error).replace(here.out, job.out)
        return replace(result, job=job), files
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class RayRunner(PointRunner):
    """Each job a Ray task (`remote_attempt`) with one CPU; with `resources`, job k needs one
    unit of the k-th name (cycled), as `fairbench run --ray-resource` places actors."""

    def __init__(self, address: str, resources: tuple[str, ...] = (), cpus: float = 1.0) -> None:
        from fairbench.run.ray_cluster import check_task_resources, connect

        self.ray, self.connected_here = connect(address)
        self.resources = resources
        self.cpus = cpus
        try:
            check_task_resources(self.ray, resources)
        except BaseException:
            self.close()
            raise
        self.task = self.ray.remote(remote_attempt)

    def _options(self, k: int) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.cpus, "max_retries": 0}
        if self.resources:
            options["resources"] = {self.resources[k % len(self.resources)]: 1}
        return options

    def run(
        self, jobs: Sequence[PointJob], parallel: int = 1, progress: Progress | None = None
    ) -> list[PointResult]:
        """Simulated jobs all at once (the cluster's CPUs set the pace), live ones one at a
        time; `parallel` is the local pool's and does not apply here."""
        ray = self.ray
        results: list[PointResult | None] = [None] * len(jobs)
        at_once = len(jobs) if all(job.simulated for job in jobs) else 1
        pending: dict[Any, int] = {}
        queue = list(range(len(jobs)))
        try:
            while queue or pending:
                while queue and len(pending) < at_once:
                    k = queue.pop(0)
                    early = self._taken(jobs[k])
                    if early is not None:
                        _report(results, k, early, progress)
                        continue
                    pending[self.task.options(**self._options(k)).remote(jobs[k])] = k
                if not pending:
                    continue
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    k = pending.pop(ref)
                    _report(results, k, self._land(ref, jobs[k]), progress)
        except BaseException:  # Ctrl-C: nothing left running on the cluster
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise
        return [r for r in results if r is not None]

    @staticmethod
    def _taken(job: PointJob) -> PointResult | None:
        """The check a local run makes of its directory, made where the files will land."""
        from fairbench.run.rundir import refuse_taken

        try:
            refuse_taken(Path(job.out))
        except FileExistsError as error:
            return PointResult(job, error=f"{job.label}: {_one_line(error)}", bad_input=True)
        return None

    def _land(self, ref: Any, job: PointJob) -> PointResult:
        """The task's result, its files written to the job's directory and `after` run there."""
        try:
            result, files = self.ray.get(ref)
        except Exception as error:  # the task's worker or node died, or it was cancelled
            lines = str(error).strip().splitlines() or [""]
            why = f"{type(error).__name__}: {lines[0][:200]}".rstrip(": ")
            return PointResult(job, error=f"{job.label}: the Ray task failed ({why})")
        if files:
            out = Path(job.out)
            for name, data in files.items():
                path = out / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        if result.failed or job.after is None:
            return result
        try:
            job.after(Path(job.out))
        except Exception as error:
            return PointResult(job, result.summary, f"{job.label}: {_one_line(error)}", _bad(error))
        return result

    def close(self) -> None:
        if self.connected_here and self.ray.is_initialized():
            self.ray.shutdown()
        self.connected_here = False


def make_runner(ray: str | None = None, resources: Sequence[str] = ()) -> PointRunner:
    """The runner a command's flags ask for: Ray at `ray` (auto, local or HOST:PORT), else this
    machine. Raises `fairbench.run.ray_cluster.RaySetupError` (one line naming the flag) when Ray
    is missing, unreachable, or lacks a resource."""
    if ray is None:
        return LocalRunner()
    return RayRunner(ray, tuple(resources))
