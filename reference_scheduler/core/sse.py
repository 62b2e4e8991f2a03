"""A lean incremental Server-Sent Events parser (the subset LLM servers use): the one SSE reader of
the project. fairbench's client and profile probe read streams with it (re-exported as
fairbench.targets.http.sse), the reference gateway's relay frames an upstream's stream with it
(`feed_raw`: each event's bytes to forward beside its data), and the tests read bodies with it.

Feed it bytes as they arrive; it returns the complete events' `data` payloads. It handles events
split across reads, several events in one read, `\\r\\n` and `\\r` line ends (also a `\\r\\n`
split between two reads), comment and keep-alive lines (`: ping`), multi-line data (joined with
`\\n`, per the spec), and ignores `event:`, `id:` and `retry:` fields. The final chunk of an
OpenAI stream may carry only `usage`; that is just another event here.
"""

from __future__ import annotations

MAX_EVENT_BYTES = 4 << 20  # an event (or a line) larger than this is a broken stream


class SSEError(ValueError):
    """The stream is broken: an event (or a line) over MAX_EVENT_BYTES."""


class SSEParser:
    __slots__ = ("_buffer", "_data", "_lines", "_pending_cr")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._lines: list[bytes] = []  # feed_raw: the current event's lines, as they came
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
        return [data for _, data in self._lines_of(chunk, raw=False)]

    def feed_raw(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """Each event completed by `chunk` as (its bytes, line ends as `\\n`, through its
        blank line; its data payload, b"" for an event of comments or other fields only): what
        a relay forwards beside what it reads."""
        if (
            not self._buffer
            and not self._lines
            and chunk.endswith(b"\n\n")
            and b"\r" not in chunk
            and chunk.startswith(b"data: ")
        ):
            # the usual case, as in feed: whole one-line `data: ` events, nothing pending
            if chunk.count(b"\n") == 2:
                return [(chunk, chunk[6:-2])]
            parts = chunk[:-2].split(b"\n\n")
            if chunk.count(b"\n") == 2 * len(parts) and all(
                part.startswith(b"data: ") for part in parts
            ):
                return [(part + b"\n\n", part[6:]) for part in parts]
        return self._lines_of(chunk, raw=True)

    def _lines_of(self, chunk: bytes, raw: bool) -> list[tuple[bytes, bytes]]:
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the \n of a \r\n split across reads
        self._pending_cr = chunk.endswith(b"\r")
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._buffer + chunk
        events: list[tuple[bytes, bytes]] = []
        lines = self._lines
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if not line:
                if self._data or (raw and lines):
                    data = b"\n".join(self._data)
                    events.append((b"\n".join(lines) + b"\n\n" if raw else b"", data))
                    self._data = []
                    lines.clear()
                continue
            if raw:
                lines.append(line)
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # comments (":...") and other fields (event, id, retry) carry nothing we use
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_EVENT_BYTES or sum(map(len, lines or self._data)) > (
            MAX_EVENT_BYTES
        ):
            # bounded memory: a server streaming bytes with no event boundary cannot grow us
            raise SSEError(f"an SSE event over {MAX_EVENT_BYTES >> 20} MiB")
        return events

    @property
    def has_partial(self) -> bool:
        return bool(self._buffer.strip()) or bool(self._data) or bool(self._lines)


def parse_events(body: bytes) -> list[bytes]:
    """The data payloads of a whole SSE body (a stream read to its end), by the same parser."""
    return SSEParser().feed(body)
