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
