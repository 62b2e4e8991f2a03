"""The HTTP/1.1 client the live targets speak through: connection pool and request bytes
(`client`), the incremental SSE parser (`sse`) and one dialect per engine wire format (`wire`).

Stamps are taken here, as bytes arrive, so event-loop queueing is not added to latency. Imports
nothing of fairbench outside `targets.http`; `targets` may import it.
"""

from fairbench.targets.http.client import Outcome, Pool
from fairbench.targets.http.sse import SSEParser
from fairbench.targets.http.wire import Dialect

__all__ = ["Dialect", "Outcome", "Pool", "SSEParser"]
