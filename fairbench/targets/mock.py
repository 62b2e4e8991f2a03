"""The mock target: a handler function scripts the response (httpx's MockTransport idea).

    async def handler(req):
        await asyncio.sleep(0.02)          # TTFT
        yield Started()
        for _ in range(req.max_tokens):
            yield Token(1)
            await asyncio.sleep(0.005)     # ITL
        yield Done(req.max_tokens)

Tests script stalls, drops and errors this way without a server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

from fairbench.plan.model import PlannedRequest
from fairbench.targets.base import TargetEvent

Handler = Callable[[PlannedRequest], AsyncIterator[TargetEvent]]


class MockTarget:
    def __init__(self, handler: Handler, name: str = "mock") -> None:
        self.handler = handler
        self.name = name
        self.opened = False

    async def open(self) -> None:
        self.opened = True

    def send(self, req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        return self.handler(req)

    async def close(self) -> None:
        self.opened = False

    def info(self) -> Mapping[str, str]:
        return {"kind": "mock", "name": self.name}
