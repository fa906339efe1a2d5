"""The incremental SSE parser: events are the same whatever the chunking, line endings or extra fields."""

from __future__ import annotations

import json
import random

import pytest

from glm53.bench.sse import SSEParser


def _stream(payloads: list[str], newline: str = "\n") -> bytes:
    return "".join(f"data: {p}{newline}{newline}" for p in payloads).encode()


def _parse_in_chunks(raw: bytes, sizes: list[int]) -> list[bytes]:
    parser = SSEParser()
    events: list[bytes] = []
    position = 0
    for size in sizes:
        events += parser.feed(raw[position : position + size])
        position += size
    events += parser.feed(raw[position:])
    return events + parser.close()


PAYLOADS = [json.dumps({"choices": [{"index": 0, "text": f"tok{i} é ✓"}]}) for i in range(20)] + ["[DONE]"]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_every_split_point_gives_the_same_events(newline: str) -> None:
    raw = _stream([*PAYLOADS[:4], "[DONE]"], newline)
    expected = [p.encode() for p in PAYLOADS[:4]] + [b"[DONE]"]
    for cut in range(len(raw) + 1):
        assert _parse_in_chunks(raw, [cut]) == expected, f"split at byte {cut}"


def test_byte_by_byte_and_random_chunks() -> None:
    raw = _stream(PAYLOADS, "\r\n")
    expected = [p.encode() for p in PAYLOADS]
    assert _parse_in_chunks(raw, [1] * len(raw)) == expected
    rng = random.Random(7)
    for _ in range(50):
        sizes = [rng.randint(1, 64) for _ in range(len(raw) // 8)]
        assert _parse_in_chunks(raw, sizes) == expected


def test_comments_other_fields_and_multiline_data() -> None:
    raw = b": keep-alive\n\nevent: message\nid: 7\nretry: 10\ndata: first\ndata:second\n\ndata: [DONE]\n\n"
    assert _parse_in_chunks(raw, [5, 9, 3]) == [b"first\nsecond", b"[DONE]"]


def test_event_without_blank_line_is_flushed_at_close() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n\ndata: {"trunc') == [b'{"a": 1}']
    assert parser.pending
    assert parser.close() == [b'{"trunc']
    assert not parser.pending


def test_empty_chunks_and_blank_lines_alone_yield_nothing() -> None:
    parser = SSEParser()
    assert parser.feed(b"") == []
    assert parser.feed(b"\n\n\r\n") == []
    assert parser.close() == []
