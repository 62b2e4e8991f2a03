"""The SSE parser on the stream shapes real servers and proxies produce."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fairbench.targets.http.sse import SSEParser

STREAM = (
    b": keep-alive\n\n"
    b'data: {"a":1}\n\n'
    b'event: message\nid: 7\ndata: {"b":2}\n\n'
    b"data: line1\ndata: line2\n\n"
    b"retry: 100\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [b'{"a":1}', b'{"b":2}', b"line1\nline2", b"[DONE]"]


def feed_all(parts: list[bytes]) -> list[bytes]:
    parser = SSEParser()
    out: list[bytes] = []
    for part in parts:
        out.extend(parser.feed(part))
    return out


def test_whole_stream_in_one_read() -> None:
    assert feed_all([STREAM]) == EXPECTED


def test_crlf_and_cr_line_ends() -> None:
    assert feed_all([STREAM.replace(b"\n", b"\r\n")]) == EXPECTED
    assert feed_all([STREAM.replace(b"\n", b"\r")]) == EXPECTED


@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=12), crlf=st.booleans())
def test_any_split_across_reads_gives_the_same_events(cuts: list[int], crlf: bool) -> None:
    data = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
    points = sorted({min(c, len(data)) for c in cuts})
    parts = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert feed_all(parts) == EXPECTED


def test_data_without_space_and_usage_only_final_chunk() -> None:
    out = feed_all([b'data:{"choices":[],"usage":{"completion_tokens":3}}\n\ndata: [DONE]\n\n'])
    assert out == [b'{"choices":[],"usage":{"completion_tokens":3}}', b"[DONE]"]


def test_an_event_cut_off_by_the_end_is_partial_not_dispatched() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a":1}\n\ndata: {"b"') == [b'{"a":1}']
    assert parser.has_partial


def test_an_endless_event_is_refused_not_buffered() -> None:
    import pytest

    from fairbench.targets.http.sse import MAX_EVENT_BYTES

    parser = SSEParser()
    chunk = b"data: " + b"x" * (1 << 20)
    with pytest.raises(ValueError, match="MiB"):
        for _ in range(MAX_EVENT_BYTES // len(chunk) + 2):
            parser.feed(chunk)


@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=12), crlf=st.booleans())
def test_raw_events_are_the_streams_bytes_event_by_event(cuts: list[int], crlf: bool) -> None:
    """What the gateway's relay forwards (feed_raw): each event's own bytes with its data, in
    any cut of the stream; comment-only and field-only events come through too, so a relay
    passes keep-alives on untouched."""
    data = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
    points = sorted({min(c, len(data)) for c in cuts})
    parts = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    parser = SSEParser()
    events = [event for part in parts for event in parser.feed_raw(part)]
    assert b"".join(raw for raw, _ in events) == STREAM  # line ends as \n
    assert [d for _, d in events if d] == EXPECTED
    assert [raw for raw, d in events if not d] == [b": keep-alive\n\n", b"retry: 100\n\n"]
    assert not parser.has_partial


def test_the_relay_forwards_what_it_reads_with_the_same_reader() -> None:
    """The gateway's relay frames with core/sse.py: events pass byte for byte, the model is
    renamed, an unasked usage chunk is dropped, and an event over the bound is a broken stream
    (SSEError, which forward.py answers as mid_stream)."""
    import pytest

    from reference_scheduler.core.sse import MAX_EVENT_BYTES, SSEError
    from reference_scheduler.gateway.relay import Events

    events = Events(keep_usage=False, model="asked")
    chunk = b': ping\n\ndata: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    assert events.feed(chunk[:20]) == b": ping\n\n"
    assert events.feed(chunk[20:]) == chunk[8:] and events.tokens == 1
    usage = b'data: {"model":"up","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}'
    assert events.feed(usage + b"\n\n") == b""  # usage only, not asked for: dropped, but read
    assert events.usage == {"prompt_tokens": 1, "completion_tokens": 2}
    assert events.feed(b'data: {"model":"up","choices":[{"text":"x"}]}\n\n') == (
        b'data: {"model":"asked","choices":[{"text":"x"}]}\n\n'
    )
    assert events.feed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n" and events.done
    with pytest.raises(SSEError):
        Events(keep_usage=True).feed(b"data: " + b"x" * (MAX_EVENT_BYTES + 1))
