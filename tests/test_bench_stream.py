"""Protocol corner cases of one streamed request: every failure becomes an invalid run with its reason,
the other runs are kept, and nothing raises."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from glm53.bench.client import BenchClient
from glm53.bench.prompts import PromptFactory
from glm53.bench.runner import RunSection, Shape, judge_run, run_benchmark
from glm53.bench.stream import StreamAccumulator
from tests.support.bench_fixtures import QuietHandler, serve_http

PROMPT, OUTPUT = 16, 4


def chunk(text: str, finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {
        "object": "text_completion",
        "choices": [{"index": index, "text": text, "finish_reason": finish}],
    }


def usage(prompt: int = PROMPT, completion: int = OUTPUT) -> dict[str, Any]:
    return {
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


def good_events() -> list[Any]:
    return [chunk("a"), chunk("b"), chunk(""), chunk("d", "length"), usage(), "[DONE]"]


def sse(events: list[Any]) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, str) else json.dumps(e)).encode() + b"\n\n" for e in events)


class Dropping(httpx.SyncByteStream):
    """Sends some bytes, then the connection breaks."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __iter__(self) -> Iterator[bytes]:
        yield self.data
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


Responder = Callable[[httpx.Request], httpx.Response]


def mock_client(responders: list[Responder]) -> BenchClient:
    """A client whose n-th completion request is answered by responders[n]; /tokenize and /metrics work."""
    calls = iter(responders)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(
                200,
                json={"count": 40, "max_model_len": 4096, "tokens": list(range(1, 41))},
            )
        if request.url.path == "/metrics":
            return httpx.Response(200, text="vllm:num_preemptions_total 0\n")
        return next(calls)(request)

    return BenchClient("http://bench.test", transport=httpx.MockTransport(handler), timeout_s=5)


def stream_of(events: list[Any]) -> Responder:
    return lambda request: httpx.Response(200, content=sse(events), headers={"content-type": "text/event-stream"})


def run_section(responders: list[Responder]) -> RunSection:
    with mock_client(responders) as client:
        return run_benchmark(
            client,
            PromptFactory(client, "m"),
            "m",
            [Shape(prompt_tokens=PROMPT, output_tokens=OUTPUT)],
            runs=len(responders),
        )


def only_run_reason(responder: Responder) -> str | None:
    section = run_section([responder, stream_of(good_events())])
    first, second = section.shapes[0].runs
    assert second.valid, "the clean run after a broken one must still count"
    assert section.shapes[0].best.valid_runs == 1
    assert not first.valid
    return first.invalid_reason


def test_clean_stream_is_valid_and_measured() -> None:
    section = run_section([stream_of(good_events())])
    record = section.shapes[0].runs[0]
    assert record.valid and record.invalid_reason is None
    assert record.prompt_tokens == PROMPT and record.completion_tokens == OUTPUT
    assert record.token_events == 4  # the empty-text chunk still carried a token
    assert record.ttft_ms is not None and record.ttft_ms > 0
    assert record.decode_tok_s is not None and record.decode_tok_s > 0
    assert record.metrics is not None and record.metrics.preemptions == 0


def test_the_request_follows_the_method() -> None:
    bodies: list[dict[str, Any]] = []

    def capture(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return stream_of(good_events())(request)

    run_section([capture, capture])
    for body in bodies:
        assert body["prompt"] == [*range(1, 17)]
        assert body["temperature"] == 0 and body["ignore_eos"] is True and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["max_tokens"] == OUTPUT
    assert bodies[0]["cache_salt"] != bodies[1]["cache_salt"], "a fresh cache salt per request"


def test_drop_mid_stream() -> None:
    partial = sse(good_events()[:2])
    reason = only_run_reason(lambda r: httpx.Response(200, stream=Dropping(partial)))
    assert reason is not None and "connection failed" in reason and "RemoteProtocolError" in reason


def test_clean_close_without_done() -> None:
    reason = only_run_reason(stream_of(good_events()[:3]))
    assert reason is not None and "before [DONE]" in reason


def test_missing_usage() -> None:
    events = [e for e in good_events() if not (isinstance(e, dict) and "usage" in e)]
    reason = only_run_reason(stream_of(events))
    assert reason is not None and "no usage" in reason


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (
            [chunk("a"), usage(), chunk("b", "length"), "[DONE]"],
            "before every choice finished",
        ),
        ([usage(), chunk("a", "length"), "[DONE]"], "before any token"),
        (
            [chunk("a", "length"), chunk("b"), usage(), "[DONE]"],
            "after its finish reason",
        ),
        (
            [chunk("a"), chunk("b", "length"), usage(), "[DONE]", chunk("c")],
            "after [DONE]",
        ),
        (
            [chunk("a"), chunk("b", "length"), usage(), chunk("c", index=1), "[DONE]"],
            "after the final usage",
        ),
    ],
)
def test_out_of_order_events(events: list[Any], expected: str) -> None:
    reason = only_run_reason(stream_of(events))
    assert reason is not None and expected in reason and "out of order" in reason


def test_usage_that_does_not_match_the_request() -> None:
    events = [chunk("a"), chunk("b", "length"), usage(completion=2), "[DONE]"]
    reason = only_run_reason(stream_of(events))
    assert reason == f"usage reports 2 completion tokens, {OUTPUT} were requested"


def test_finish_reason_other_than_length() -> None:
    events = [chunk("a"), chunk("b"), chunk("c"), chunk("d", "stop"), usage(), "[DONE]"]
    reason = only_run_reason(stream_of(events))
    assert reason is not None and "'stop'" in reason and "expected 'length'" in reason


def test_malformed_json_and_error_events() -> None:
    def malformed(r):
        return httpx.Response(200, content=b"data: {not json\n\n" + sse(good_events()))

    reason = only_run_reason(malformed)
    assert reason is not None and reason.startswith("malformed event")
    error_event = {"error": {"message": "engine died", "code": 500}}
    reason = only_run_reason(stream_of([chunk("a"), error_event, "[DONE]"]))
    assert reason == "server error in stream: engine died"


@pytest.mark.parametrize("status", [400, 404, 500, 503])
def test_http_errors(status: int) -> None:
    def responder(r):
        return httpx.Response(status, json={"error": {"message": f"nope {status}"}})

    reason = only_run_reason(responder)
    assert reason == f"HTTP {status}: nope {status}"


def test_mocked_timeout() -> None:
    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    reason = only_run_reason(stall)
    assert reason is not None and reason.startswith("timed out after 5 s")


class _StallingHandler(QuietHandler):
    """Sends the headers and one event, then stays silent longer than the client's read timeout."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(sse([chunk("a")]))
        self.wfile.flush()
        time.sleep(1.5)


def test_real_read_timeout_on_a_silent_server() -> None:
    with serve_http(_StallingHandler) as url:
        with BenchClient(url, timeout_s=0.3) as client:
            started = time.perf_counter()
            outcome = client.stream("/v1/completions", {"prompt": [1]})
        assert time.perf_counter() - started < 1.4
        assert outcome.error is not None and outcome.error.startswith("timed out after 0.3 s")
        assert outcome.ttft_s is not None, "the event before the silence was still timed"
        valid, reason = judge_run(outcome, Shape(prompt_tokens=1, output_tokens=2))
        assert not valid and reason == outcome.error


def test_refused_connection() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with BenchClient(f"http://127.0.0.1:{port}", timeout_s=2) as client:
        outcome = client.stream("/v1/completions", {"prompt": [1]})
    assert outcome.error is not None and outcome.error.startswith("connection failed: ConnectError")


def test_chat_deltas_tool_calls_and_role_only_chunks() -> None:
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "think"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": ',
                                },
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Lisbon"}'}}]},
                    "finish_reason": "tool_calls",
                }
            ]
        },
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        },
    ]
    accumulator = StreamAccumulator()
    accumulator.feed([json.dumps(e).encode() for e in events[:1]], 0.1)
    accumulator.feed([json.dumps(e).encode() for e in events[1:]] + [b"[DONE]"], 0.2)
    outcome = accumulator.outcome(end_s=0.3, http_status=200)
    assert outcome.error is None
    assert outcome.ttft_s == 0.2, "a role-only delta carries no token"
    assert outcome.reasoning == "think"
    assert [(c.name, c.arguments, c.call_id) for c in outcome.tool_calls] == [
        ("get_weather", '{"city": "Lisbon"}', "c1")
    ]
    assert outcome.finish_reasons == ["tool_calls"]
    assert outcome.usage is not None and outcome.usage.cached_tokens == 8


@pytest.mark.parametrize(
    "event",
    [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "x", "function": "f"}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "not an object"}]}}]},
        {"choices": "nope"},
        {"choices": [{"index": 0, "text": "a", "finish_reason": "length"}], "usage": {"prompt_tokens": "many"}},
        [1, 2, 3],
    ],
)
def test_fields_of_the_wrong_type_never_raise(event: Any) -> None:
    accumulator = StreamAccumulator()
    accumulator.feed([json.dumps(event).encode(), b"[DONE]"], 0.1)
    outcome = accumulator.outcome(end_s=0.2, http_status=200)
    assert outcome.error is not None and outcome.error.startswith("malformed")
