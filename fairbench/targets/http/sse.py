"""A lean incremental Server-Sent Events parser (the subset LLM servers use).

Feed it bytes as they arrive; it returns the complete events' `data` payloads. It handles events
split across reads, several events in one read, `\\r\\n` and `\\r` line ends (also a `\\r\\n`
split between two reads), comment and keep-alive lines (`: ping`), multi-line data (joined with
`\\n`, per the spec), and ignores `event:`, `id:` and `retry:` fields. The final chunk of an
OpenAI stream may carry only `usage`; that is just another event here.
"""

from __future__ import annotations

MAX_EVENT_BYTES = 4 << 20  # an event (or a line) larger than this is a broken stream


class SSEParser:
    __slots__ = ("_buffer", "_data", "_pending_cr")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data payloads of the events completed by `chunk`."""
        if (
            not self._buffer
            and not self._data
            and chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            return [chunk[6:-2]]  # the usual case: one whole event per read, nothing pending
        if (
            not self._buffer
            and not self._data
            and chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and b"\r" not in chunk
        ):
            # several whole one-line events, nothing pending (a late read, or chunked framing
            # handing on a read's chunks at once): each part is `data: ...` with no newline
            parts = chunk[:-2].split(b"\n\n")
            if chunk.count(b"\n") == 2 * len(parts) and all(
                part.startswith(b"data: ") for part in parts
            ):
                return [part[6:] for part in parts]
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the \n of a \r\n split across reads
        self._pending_cr = chunk.endswith(b"\r")
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._buffer + chunk
        events: list[bytes] = []
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # comments (":...") and other fields (event, id, retry) carry nothing we use
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_EVENT_BYTES or sum(map(len, self._data)) > MAX_EVENT_BYTES:
            # bounded memory: a server streaming bytes with no event boundary cannot grow us
            raise ValueError(f"an SSE event over {MAX_EVENT_BYTES >> 20} MiB")
        return events

    @property
    def has_partial(self) -> bool:
        return bool(self._buffer.strip()) or bool(self._data)


def parse_events(body: bytes) -> list[bytes]:
    """The data payloads of a whole SSE body (a stream read to its end), by the same parser."""
    return SSEParser().feed(body)
