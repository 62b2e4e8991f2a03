"""The Target protocol: turn one planned request into a stream of events.

Two flavours, one contract:

- **event targets** (`send`, e.g. mock): an async stream of events; the executor stamps the time
  of each event as it consumes it.
- **transport targets** (`prepare` + `start` + `abort`, e.g. openai, reference): the request is
  built before its deadline and written at it, and the transport stamps each time on the same
  clock (`time.perf_counter_ns`) the moment bytes arrive — the executor's stamps would include
  event-loop queueing. `start` returns (future of an Outcome, the Outcome being filled).

Either way a request ends with exactly one terminal — `Done` or `Failed` — or the executor records
it as an error ("stream_incomplete"). Exceptions a target lets escape are recorded as
`error/client` with their text, never lost.

    Started   the response began (status line and headers in)
    Token(n)  n output tokens arrived (a chunk may carry several, or none)
    Done      terminal success; `output_tokens` from the server's usage report when it gave one
    Failed    terminal failure: status `error` (with kind) or `rejected` (429/503, Retry-After)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fairbench.plan.model import PlannedRequest


@dataclass(frozen=True, slots=True)
class Started:
    http_status: int = 200


@dataclass(frozen=True, slots=True)
class Token:
    n: int = 1


@dataclass(frozen=True, slots=True)
class Done:
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failed:
    kind: str
    detail: str = ""
    status: str = "error"  # or "rejected"
    http_status: int | None = None
    retry_after_s: float | None = None


TargetEvent = Started | Token | Done | Failed
STARTED = Started()
ONE_TOKEN = Token(1)


class Target(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def info(self) -> Mapping[str, str]: ...


class EventTarget(Target, Protocol):
    def send(self, req: PlannedRequest) -> AsyncIterator[TargetEvent]: ...


class TransportTarget(Target, Protocol):
    def prepare(self, req: PlannedRequest) -> Any: ...
    def start(self, prepared: Any) -> tuple[Any, Any]: ...
    def abort(self, waiter: Any) -> None: ...
