"""The Target protocol: turn one planned request into a stream of events.

The executor stamps the time of each event; a target never reads a clock for latency. A target
ends every `send` with exactly one terminal event — `Done` or `Failed` — or the executor records
the request as an error ("stream_incomplete"). Exceptions a target lets escape are recorded as
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

from fairbench.plan import PlannedRequest


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
    def send(self, req: PlannedRequest) -> AsyncIterator[TargetEvent]: ...
    async def close(self) -> None: ...
    def info(self) -> Mapping[str, str]: ...
