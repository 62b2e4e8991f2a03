"""The transport's response parser gives the same answer however the bytes are split into reads.

A streamed response reaches `_Conn.received` in whatever pieces the kernel hands over: a size
line cut in two, a chunk's data across reads, several chunks (events) in one read. The parser
hands a read's chunks on together (one stamp per read), so what must hold for any split: the
request ends ok with the server's token count, every text event counted once, and the first
token stamped with the time of the read that completed its event — not an earlier read that
held only part of it, not a later one. A parser that lost an event at a chunk boundary, counted
one twice, or stamped a token before its event was whole would break these.
"""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairbench.targets.http.client import Outcome, _Conn, _Response

TOKENS = 12


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n" % len(payload) + payload + b"\r\n"


def _event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _stream() -> tuple[bytes, int]:
    """A vLLM-shaped completions stream, chunked, one event per chunk; and the offset of the
    last byte of the first token's event (where that event becomes whole)."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    role = _chunk(_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
    tokens = [
        _chunk(
            _event(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": f" w{i}"},
                            "finish_reason": None if i < TOKENS - 1 else "length",
                        }
                    ]
                }
            )
        )
        for i in range(TOKENS)
    ]
    usage = _chunk(_event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 12}}))
    body = head + role + b"".join(tokens) + usage + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    first = head + role + tokens[0]
    return body, len(first) - 3  # the event's final "\n" precedes the chunk's CRLF


class _Pool:
    released = 0

    def release(self, conn: object) -> None:
        self.released += 1

    def forget(self, conn: object) -> None:
        pass


def conn_reused(cuts: list[int]) -> bool:
    """Whether the connection went back to the pool (rather than closed) after the response."""
    pool = _Pool()
    conn = _Conn(pool)  # type: ignore[arg-type]
    conn.transport = _Transport()  # type: ignore[assignment]
    conn.response = _Response(Outcome(1), stream=True)
    edges = [0, *sorted({c for c in cuts if 0 < c < len(BODY)}), len(BODY)]
    for a, b in itertools.pairwise(edges):
        conn.received(BODY[a:b], 1, 1)
        if conn.response is None:
            break
    return pool.released == 1 and not conn.transport.closed  # type: ignore[union-attr]


class _Transport:
    closed = False

    def close(self) -> None:
        self.closed = True


def _replay(body: bytes, cuts: list[int]) -> tuple[Outcome, list[tuple[int, int]]]:
    """Feed `body` cut at `cuts`; read k (from 0) is stamped 1000·(k+1). Returns the outcome and
    each read's [start, end) byte range."""
    conn = _Conn(_Pool())  # type: ignore[arg-type]
    out = Outcome(1)
    conn.response = _Response(out, stream=True)
    edges = [0, *sorted({c for c in cuts if 0 < c < len(body)}), len(body)]
    reads = list(itertools.pairwise(edges))
    for k, (a, b) in enumerate(reads):
        t = 1000 * (k + 1)
        conn.received(body[a:b], t, t)
    return out, reads


BODY, FIRST_END = _stream()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(BODY) - 1), max_size=40))
def test_any_split_gives_one_answer_and_the_completing_reads_stamp(cuts: list[int]) -> None:
    out, reads = _replay(BODY, cuts)
    assert (out.status, out.kind) == ("ok", None), out.detail
    assert out.tokens == TOKENS and out.chunks == TOKENS
    completing = next(k for k, (a, b) in enumerate(reads) if a <= FIRST_END < b)
    assert out.t_first_token == 1000 * (completing + 1)
    # done when the last chunk's size line is whole; the connection is reused only if the
    # response's final CRLF came in that read too (else its bytes would start the next answer)
    zero_end = len(BODY) - 3
    done = next(k for k, (a, b) in enumerate(reads) if a <= zero_end < b)
    assert out.t_done == 1000 * (done + 1)
    assert out.t_first_token <= out.t_last_token <= out.t_done
    assert conn_reused(cuts) == (reads[done][1] == len(BODY))


def test_one_read_and_a_byte_at_a_time_agree() -> None:
    whole, _ = _replay(BODY, [])
    bytewise, _ = _replay(BODY, list(range(1, len(BODY))))
    for field in ("status", "tokens", "chunks", "terminal", "usage_completion", "usage_prompt"):
        assert getattr(whole, field) == getattr(bytewise, field), field
    assert bytewise.t_first_token == 1000 * (FIRST_END + 1)


def test_a_bad_chunk_size_after_good_chunks_keeps_their_tokens_and_fails_the_stream() -> None:
    head_end = BODY.index(b"\r\n\r\n") + 4
    size_end = BODY.index(b"\r\n", head_end)
    first_two = BODY[: BODY.index(b"\r\n", size_end + 2) + 2]  # head + the role chunk
    token = BODY[len(first_two) : FIRST_END + 3]
    out, _ = _replay(first_two + token + b"zz\r\n", [])
    assert (out.status, out.kind) == ("error", "bad_stream")
    assert out.chunks == 1 and out.t_first_token == 1000


@pytest.mark.parametrize("size", [b"-6", b"+1", b"0x10", b"1_0", b"", b" ", b"g"])
def test_a_size_that_is_not_hex_digits_fails_the_stream_and_never_hangs(size: bytes) -> None:
    # int(b"-6", 16) is -6: a parser that took it stepped back onto the same line for ever
    head = BODY[: BODY.index(b"\r\n\r\n") + 4]
    out, _ = _replay(head + size + b"\r\nxxxxxxxxxxxxxxxx\r\n0\r\n\r\n", [])
    assert (out.status, out.kind) == ("error", "bad_stream")
    assert "bad chunk size" in (out.detail or "")


def test_a_size_line_without_an_end_is_refused_not_buffered() -> None:
    head = BODY[: BODY.index(b"\r\n\r\n") + 4]
    out, _ = _replay(head + b"1" * 2000, [len(head) + 500, len(head) + 1200])
    assert (out.status, out.kind) == ("error", "bad_stream")
    assert "size line" in (out.detail or "")
