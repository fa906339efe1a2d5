"""The benchmark loses nothing and cannot be fooled: hostile server events are invalid runs (never a crash),
the report is written after every run, every JSON written is valid, bursting servers are caught, flags are
checked against the server up front, and the API key stays out of argv."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from glm53.bench.client import BenchClient
from glm53.bench.coherence import run_coherence
from glm53.bench.metrics import MetricsDelta
from glm53.bench.needle import chat_answer
from glm53.bench.prompts import PromptFactory
from glm53.bench.report import collect_environment, load_summary, write_section
from glm53.bench.runner import (
    DEFAULT_SHAPES,
    Shape,
    fitting_shapes,
    judge_run,
    parse_shapes,
    run_benchmark,
)
from glm53.bench.session import checkpointer, resolve_api_key
from glm53.bench.stream import StreamAccumulator, StreamOutcome, Usage
from glm53.bench.timing import implausible_timing, settle_timing
from glm53.errors import BadInput
from tests.support.bench_fixtures import QuietHandler, VllmLikeHandler, serve_http
from tests.support.bench_runs import one_run_section
from tests.support.cli import run_bench, run_glm53

PROMPT, OUTPUT = 16, 4


def _sse(events: list[Any]) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, bytes) else (e if isinstance(e, str) else json.dumps(e)).encode()) + b"\n\n"
        for e in events
    )


def _chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _good() -> list[Any]:
    return [_chunk("a"), _chunk("b"), _chunk("c"), _chunk("d", "length"), _usage(), "[DONE]"]


def _usage(prompt: Any = PROMPT, completion: Any = OUTPUT) -> bytes:
    return b'{"choices": [], "usage": {"prompt_tokens": %s, "completion_tokens": %s}}' % (
        str(prompt).encode(),
        str(completion).encode(),
    )


def _client(bodies: list[bytes | httpx.SyncByteStream], timeout_s: float = 5) -> BenchClient:
    calls = iter(bodies)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(1, 41))})
        if request.url.path == "/metrics":
            return httpx.Response(404)
        body = next(calls)
        if isinstance(body, bytes):
            kind = "text/html" if body.startswith(b"<html") else "text/event-stream"
            return httpx.Response(200, content=body, headers={"content-type": kind})
        return httpx.Response(200, stream=body, headers={"content-type": "text/event-stream"})

    return BenchClient("http://bench.test", transport=httpx.MockTransport(handler), timeout_s=timeout_s)


def _reasons(
    bodies: list[bytes | httpx.SyncByteStream], output: int = OUTPUT, timeout_s: float = 5
) -> list[str | None]:
    with _client(bodies, timeout_s) as client:
        section = run_benchmark(
            client,
            PromptFactory(client, "m"),
            "m",
            [Shape(prompt_tokens=PROMPT, output_tokens=output)],
            runs=len(bodies),
        )
    return [run.invalid_reason for run in section.shapes[0].runs]


# --- 1. one bad event is one invalid run, and the report is written after every run --------------------------


def test_deep_json_and_overflowing_usage_are_invalid_runs_not_crashes() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    events = [_chunk("a"), _chunk("b"), _chunk("c"), _chunk("d", "length")]
    reasons = _reasons(
        [
            _sse([deep, *_good()]),
            _sse([*events, _usage(prompt="1e999"), "[DONE]"]),
            _sse([*events, _usage(completion="4.0"), "[DONE]"]),
            _sse([*events, _usage(prompt="1" * 4400), "[DONE]"]),
            _sse([*events, _usage(prompt="true"), "[DONE]"]),
            _sse(_good()),
        ]
    )
    assert reasons[0] is not None and reasons[0].startswith("malformed event") and "nested too deeply" in reasons[0]
    for reason in reasons[1:5]:
        assert reason is not None and reason.startswith("malformed"), reason
    assert reasons[5] is None, "the clean run after the hostile ones still counts"


@pytest.mark.parametrize(
    "event",
    [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1e308 * 10, "function": {}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": ["x"]}}]}}]},
        {"choices": [{"index": 0, "text": "a", "finish_reason": "length"}], "usage": {"prompt_tokens": -1}},
    ],
)
def test_any_odd_event_is_an_error_never_an_exception(event: Any) -> None:
    accumulator = StreamAccumulator()
    accumulator.feed([json.dumps(event).encode().replace(b"Infinity", b"1e999"), b"[DONE]"], 0.1)
    outcome = accumulator.outcome(end_s=0.2, http_status=200)
    assert outcome.error is not None or outcome.usage is None


class _Interrupting(httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        raise KeyboardInterrupt
        yield b""  # pragma: no cover


def test_the_report_is_written_after_every_run_so_ctrl_c_loses_nothing(tmp_path: Path) -> None:
    environment = collect_environment(None, environ={})
    warnings: list[str] = []
    with _client([_sse(_good()), _sse(_good()), _Interrupting()]) as client, pytest.raises(KeyboardInterrupt):
        run_benchmark(
            client,
            PromptFactory(client, "m"),
            "m",
            [Shape(prompt_tokens=PROMPT, output_tokens=OUTPUT)],
            runs=3,
            on_section=checkpointer(tmp_path, environment, "run", warnings.append),
        )
    summary = load_summary(tmp_path)
    assert summary.run is not None and summary.run.complete is False
    runs = summary.run.shapes[0].runs
    assert [r.run for r in runs] == [1, 2] and all(r.valid for r in runs)
    assert summary.run.shapes[0].best.valid_runs == 2 and not warnings


class _HostileHandler(VllmLikeHandler):
    """vLLM-like, except that its first completion is 100k-deep JSON and its second a usage of 1e999."""

    calls = 0

    def do_POST(self) -> None:
        if self.path == "/tokenize":
            super().do_POST()
            return
        self._read_json()
        type(self).calls += 1
        body = b"[" * 100_000 + b"]" * 100_000 if type(self).calls == 1 else _usage(prompt="1e999")
        self._send(200, _sse([_chunk("a"), _chunk("b", "length"), body, "[DONE]"]), "text/event-stream")


def test_bench_run_against_a_hostile_server_writes_the_report_and_exits_1(tmp_path: Path) -> None:
    _HostileHandler.reset()
    _HostileHandler.calls = 0
    with serve_http(_HostileHandler) as url:
        result = run_bench("run", url, tmp_path, "--shapes", "64:2", "--runs", "2", "--no-plots")
    assert result.code == 1 and "Traceback" not in result.stderr
    assert "no valid run for 64:2" in result.stderr
    summary = load_summary(tmp_path)
    assert summary.run is not None and summary.run.complete
    reasons = [r.invalid_reason or "" for r in summary.run.shapes[0].runs]
    assert "nested too deeply" in reasons[0] and reasons[1].startswith("malformed usage")


# --- 2. every JSON written or printed is valid -------------------------------------------------------------


def _report(out: Path, ttft: float) -> Path:
    section = one_run_section(ttft_ms=ttft, decode_tok_s=50.0)
    return write_section(out, collect_environment(None, environ={}), run=section, gates={"run": []})


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


def test_compare_json_never_prints_infinity(tmp_path: Path) -> None:
    a, b = _report(tmp_path / "a", -1.7e308), _report(tmp_path / "b", 1.7e308)
    result = run_glm53("bench", "compare", str(a), str(b), "--json")
    assert result.code == 0, result.stderr
    rows = {r["metric"]: r for r in _strict(result.stdout)["rows"]}
    ttft = rows["ttft_ms"]
    assert ttft["delta"] is None and ttft["delta_pct"] is None
    assert ttft["note"] == "B - A overflows a float; (B - A) / A overflows a float"
    assert ttft["b_better"] is False, "B's TTFT is larger: worse, even when the difference overflows"
    assert rows["decode_tok_s"]["a_median"] == 50.0, "medians beside the bests"
    gated = run_glm53("bench", "compare", str(a), str(b), "--json", "--fail-under", "decode=1")
    assert gated.code == 0 and _strict(gated.stdout)["rows"][0]["delta"] is None
    human = run_glm53("bench", "compare", str(a), str(b))
    assert human.code == 0 and "overflows" in human.stdout


def test_non_finite_values_are_listed_with_where_they_were(tmp_path: Path) -> None:
    from glm53.bench.report import json_safe

    cleaned = json_safe({"a": [1.0, math.inf], "b": {"c": math.nan}})
    assert cleaned == {"a": [1.0, None], "b": {"c": None}, "non_finite": ["a.1: inf", "b.c: nan"]}
    _strict(json.dumps(cleaned, allow_nan=False))


# --- 3. a server that bursts cannot fool the benchmark ----------------------------------------------------


@pytest.fixture
def honest() -> Iterator[str]:
    VllmLikeHandler.reset(burst=False, token_gap_s=0.003)
    with serve_http(VllmLikeHandler) as url:
        yield url


@pytest.fixture
def bursting() -> Iterator[str]:
    """A server that holds every stream back and releases it at once, and exports no /metrics."""
    VllmLikeHandler.reset(burst=True, token_gap_s=0.003, metrics=False)
    with serve_http(VllmLikeHandler) as url:
        yield url


def _run(url: str, out: Path) -> Any:
    return run_bench("run", url, out, "--shapes", "64:64", "--runs", "3", "--no-plots", "--json")


def test_an_honest_stream_is_valid_with_best_and_median(honest: str, tmp_path: Path) -> None:
    result = _run(honest, tmp_path)
    assert result.code == 0, result.stderr
    shape = result.json()["run"]["shapes"][0]
    assert all(run["valid"] for run in shape["runs"]), [run["invalid_reason"] for run in shape["runs"]]
    best = shape["best"]
    assert best["valid_runs"] == 3 and best["rejected_runs"] == 0
    # One token every 3 ms: ~330 tok/s at most (slower when this host is busy: sleeps overrun).
    assert 0 < best["median_decode_tok_s"] <= best["decode_tok_s"] < 1000
    assert best["ttft_ms"] <= best["median_ttft_ms"]
    server = [run["server_decode_tok_s"] for run in shape["runs"]]
    assert all(rate is not None and 0 < rate < 1000 for rate in server), server


def test_a_bursting_stream_without_engine_timings_is_rejected_with_its_reason(bursting: str, tmp_path: Path) -> None:
    result = _run(bursting, tmp_path)
    assert result.code == 1 and "no valid run for 64:64" in result.stderr
    shape = result.json()["run"]["shapes"][0]
    # 3 runs and the default 2 repeats in place of rejected ones: five streams, every one held back.
    assert [run["run"] for run in shape["runs"]] == [1, 2, 3, 4, 5]
    assert shape["best"]["decode_tok_s"] is None and shape["best"]["rejected_runs"] == 5
    for run in shape["runs"]:
        reason = run["invalid_reason"]
        assert not run["valid"] and reason.startswith("implausible timing"), reason
        assert "nor can the engine's /metrics vouch for it: the server exports no /metrics" in reason
        # The burst's client-side rate is kept, for the record (its value depends on how fast this host reads).
        assert run["decode_tok_s"] is not None and run["decode_tok_s"] > 0
        assert run["timing_source"] is None
    assert "implausible timing" in result.stderr


def test_a_coalesced_stream_is_measured_by_the_engine_s_own_timings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the tables, unwrapped
    # What a busy CPU engine does to its own stream: it decodes at its pace (one token every 3 ms) and the
    # events reach the client at once. Its /metrics time the request: that is the measurement, labelled so.
    VllmLikeHandler.reset(burst=True, token_gap_s=0.003)
    with serve_http(VllmLikeHandler) as url:
        result = run_bench("run", url, tmp_path, "--shapes", "64:64", "--runs", "3", "--no-plots")
    assert result.code == 0, result.stderr
    assert VllmLikeHandler.streams == 3, "nothing to measure again"
    assert "yes, engine-timed" in result.stdout and "3/3 (3 engine-timed)" in result.stdout
    assert "valid, timed by the engine's /metrics (the stream arrived coalesced)" in result.stderr
    summary = load_summary(tmp_path)
    assert summary.run is not None
    shape = summary.run.shapes[0]
    assert shape.best.valid_runs == 3 and shape.best.rejected_runs == 0 and shape.best.server_timed_runs == 3
    for run in shape.runs:
        assert run.valid and run.timing_source == "server", run.invalid_reason
        assert run.client_timing_note is not None and run.client_timing_note.startswith("implausible timing")
        assert run.metrics is not None and run.metrics.server_decode_s and run.metrics.server_ttft_s
        assert run.decode_tok_s == pytest.approx(63 / run.metrics.server_decode_s)
        assert run.decode_tok_s == run.server_decode_tok_s and 0 < run.decode_tok_s < 1000
        assert run.ttft_ms == pytest.approx(run.metrics.server_ttft_s * 1000)
        assert run.prefill_tok_s == pytest.approx(64 / run.metrics.server_ttft_s)
    assert shape.best.decode_tok_s == max(run.decode_tok_s or 0 for run in shape.runs)


def test_a_run_rejected_for_its_timing_is_measured_again(tmp_path: Path) -> None:
    VllmLikeHandler.reset(burst_first=1, token_gap_s=0.003, metrics=False)
    with serve_http(VllmLikeHandler) as url:
        result = _run(url, tmp_path)
    assert result.code == 0, result.stderr
    shape = result.json()["run"]["shapes"][0]
    assert [(run["run"], run["valid"]) for run in shape["runs"]] == [(1, False), (2, True), (3, True), (4, True)]
    assert shape["runs"][0]["invalid_reason"].startswith("implausible timing")
    assert shape["best"]["valid_runs"] == 3 and shape["best"]["rejected_runs"] == 1
    assert VllmLikeHandler.streams == 4


def test_retries_are_bounded_and_other_failures_are_not_repeated(tmp_path: Path) -> None:
    VllmLikeHandler.reset(burst_first=2, token_gap_s=0.003, metrics=False)
    with serve_http(VllmLikeHandler) as url:
        none = run_bench(
            "run", url, tmp_path, "--shapes", "64:64", "--runs", "1", "--retries", "1", "--no-plots", "--json"
        )
    assert none.code == 1 and "no valid run for 64:64" in none.stderr
    assert [run["valid"] for run in none.json()["run"]["shapes"][0]["runs"]] == [False, False]
    assert VllmLikeHandler.streams == 2
    negative = run_glm53("bench", "run", "--base-url", url, "--retries", "-1")
    assert negative.code == 2 and "--retries" in negative.stderr


def _outcome(tokens: int, ttft: float, end: float, times: list[float]) -> StreamOutcome:
    return StreamOutcome(
        ttft_s=ttft,
        end_s=end,
        usage=Usage(prompt_tokens=8, completion_tokens=tokens),
        token_events=len(times),
        token_times_s=times,
        done=True,
    )


def test_each_timing_rule() -> None:
    paced = [0.1 + i * 0.01 for i in range(64)]
    assert implausible_timing(_outcome(64, 0.1, 0.74, paced), None) is None
    # Half of the stream held back, then released at once, then paced: the burst share gives it away.
    held = [0.5] * 40 + [0.5 + i * 0.01 for i in range(1, 25)]
    reason = implausible_timing(_outcome(64, 0.5, 0.75, held), None)
    assert reason is not None and "token events arrived less than 0.25 ms after the previous one" in reason
    # Too few tokens for the client-side rules; the engine's own timing still tells.
    short = [0.1, 0.1001, 0.1002, 0.1003]
    assert implausible_timing(_outcome(4, 0.1, 0.1004, short), None) is None
    engine = MetricsDelta(server_requests=1, server_decode_s=0.5, server_ttft_s=0.05)
    reason = implausible_timing(_outcome(4, 0.1, 0.1004, short), engine)
    assert reason is not None and "vllm:request_decode_time_seconds" in reason
    late = implausible_timing(
        _outcome(64, 5.0, 5.64, [5.0 + i * 0.01 for i in range(64)]),
        engine.model_copy(update={"server_decode_s": 0.63}),
    )
    assert late is not None and "first token" in late
    busy = MetricsDelta(server_requests=2, server_decode_s=9.0)
    assert implausible_timing(_outcome(4, 0.1, 0.1004, short), busy) is None, "other traffic: no comparison"


def test_the_engine_vouches_for_what_the_client_cannot_time_and_nothing_else() -> None:
    coalesced = _outcome(24, 0.2, 0.2004, [0.2, 0.2002, 0.2004])  # 23 tokens decoded "in 0.4 ms"
    engine = MetricsDelta(server_requests=1, server_decode_s=0.046, server_ttft_s=0.15)
    verdict = settle_timing(coalesced, engine)
    assert verdict.source == "server" and verdict.rejected is None and verdict.engine is not None
    assert verdict.client_note is not None and "vllm:request_decode_time_seconds" in verdict.client_note
    assert verdict.engine.decode_tok_s == pytest.approx(23 / 0.046)
    assert verdict.engine.ttft_s == 0.15 and verdict.engine.prefill_tok_s == pytest.approx(8 / 0.15)
    paced = _outcome(64, 0.1, 0.74, [0.1 + i * 0.01 for i in range(64)])
    kept = settle_timing(paced, engine.model_copy(update={"server_decode_s": 0.63}))
    assert kept.source == "client" and kept.client_note is None and kept.engine is not None
    # What neither can vouch for, each with both reasons (64 tokens: the client's own rules apply on their own).
    burst = _outcome(64, 0.2, 0.2004, [0.2, 0.2002, 0.2004])
    engine = engine.model_copy(update={"server_decode_s": 0.126})
    assert settle_timing(burst, engine).source == "server"
    cases = {
        "the server exports no /metrics": None,
        "not this one alone (other traffic)": engine.model_copy(update={"server_requests": 2.0}),
        "no vllm:request_decode_time_seconds": MetricsDelta(preemptions=0),
        "above 20,000 tok/s too": engine.model_copy(update={"server_decode_s": 0.002}),
        "timed its decode at 0 s": engine.model_copy(update={"server_decode_s": 0.0}),
    }
    for why, metrics in cases.items():
        rejected = settle_timing(burst, metrics)
        assert rejected.source is None and rejected.rejected is not None, why
        assert rejected.rejected.startswith("implausible timing") and why in rejected.rejected, rejected.rejected
    answered = burst.model_copy(update={"finish_reasons": ["length"]})
    judged = judge_run(
        answered, Shape(prompt_tokens=8, output_tokens=64), engine.model_copy(update={"server_requests": 2.0})
    )
    assert judged[0] is False and judged[1] is not None and "other traffic" in judged[1], judged
    assert judge_run(answered, Shape(prompt_tokens=8, output_tokens=64), engine) == (True, None)


# --- 4. coherence's answer budget is checked against the server up front ----------------------------------


def test_run_defaults_fit_the_server_they_talk_to(honest: str, tmp_path: Path) -> None:
    # The recipe's shapes need 10,240 tokens and more; this server has 4,096 (as the demo does).
    result = run_bench("run", honest, tmp_path, "--runs", "1", "--no-plots", "--json")
    assert result.code == 0, result.stderr
    assert (
        "the recipe's shapes 8192:2048, 131072:2048, 260096:2048 do not fit the server's max_model_len 4096: "
        "measuring 2048:512 (pass --shapes to choose)"
    ) in result.stderr
    assert [shape["shape"] for shape in result.json()["run"]["shapes"]] == ["2048:512"]
    assert fitting_shapes(None)[0] == fitting_shapes(300_000)[0] == parse_shapes(DEFAULT_SHAPES)
    assert fitting_shapes(300_000)[1] is None
    some, note = fitting_shapes(140_000)
    assert [s.label for s in some] == ["8192:2048", "131072:2048"] and note is not None and "260096:2048" in note
    assert [s.label for s in fitting_shapes(16)[0]] == ["8:2"]
    explicit = run_bench("run", honest, tmp_path, "--shapes", "8192:2048")
    assert explicit.code == 2 and "--shapes: 8192:2048 needs 10240 tokens of context" in explicit.stderr


def test_coherence_max_tokens_beyond_max_model_len_is_refused_before_asking(honest: str, tmp_path: Path) -> None:
    result = run_bench("coherence", honest, tmp_path)
    assert result.code == 2
    assert "--max-tokens 6144 does not fit the server's max_model_len 4096" in result.stderr
    assert "pass --max-tokens 3584 or less" in result.stderr
    assert VllmLikeHandler.counters["vllm:request_decode_time_seconds_count"] == 0
    assert not (tmp_path / "summary.json").exists()


# --- 5. the API key: a file or the environment, not argv ---------------------------------------------------


@pytest.fixture
def keyed() -> Iterator[str]:
    VllmLikeHandler.reset(api_key="s3cret-key")
    with serve_http(VllmLikeHandler) as url:
        yield url
    VllmLikeHandler.api_key = None


def _keyed_run(url: str, out: Path, *extra: str) -> Any:
    return run_bench("run", url, out, "--shapes", "64:4", "--runs", "1", "--no-plots", *extra)


def test_api_key_file_and_environment(keyed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GLM53_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert _keyed_run(keyed, tmp_path / "none").code == 1, "no key: the server answers 401"
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    key.chmod(0o600)
    ok = _keyed_run(keyed, tmp_path / "file", "--api-key-file", str(key))
    assert ok.code == 0, ok.stderr
    key.chmod(0o644)
    open_file = _keyed_run(keyed, tmp_path / "open", "--api-key-file", str(key))
    assert open_file.code == 2 and "readable by every user" in open_file.stderr
    both = _keyed_run(keyed, tmp_path / "both", "--api-key-file", str(key), "--api-key", "x")
    assert both.code == 2 and "not both" in both.stderr
    monkeypatch.setenv("OPENAI_API_KEY", "s3cret-key")
    assert _keyed_run(keyed, tmp_path / "env").code == 0
    monkeypatch.setenv("GLM53_API_KEY", "wrong")
    assert _keyed_run(keyed, tmp_path / "first").code == 1, "GLM53_API_KEY comes before OPENAI_API_KEY"
    assert _keyed_run(keyed, tmp_path / "flag", "--api-key", "s3cret-key").code == 0, "--api-key still works"
    newline = _keyed_run(keyed, tmp_path / "nl", "--api-key", "a\nb")
    assert newline.code == 2 and "header" in newline.stderr
    assert resolve_api_key(None, None, {"GLM53_API_KEY": "  ", "OPENAI_API_KEY": "k"}) == "k"
    with pytest.raises(BadInput, match="empty"):
        resolve_api_key("", None, {})


# --- 6. the sweep: flags, report files and server behaviour -----------------------------------------------


class _KeepAlive(QuietHandler):
    """A stream of keep-alive comments that never completes an event."""

    def do_POST(self) -> None:
        self._read_json()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        deadline = time.monotonic() + 60  # longer than any loaded host needs to notice
        try:
            while time.monotonic() < deadline:
                self.wfile.write(b": ping\n\n")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass


def test_a_stream_of_only_keep_alives_times_out() -> None:
    with serve_http(_KeepAlive) as url, BenchClient(url, timeout_s=1.0) as client:
        started = time.monotonic()
        outcome = client.stream("/v1/completions", {"prompt": [1], "max_tokens": 4})
    assert time.monotonic() - started < 30, "the 1 s idle timeout ended it, not the server's 60 s"
    assert outcome.error is not None and "without an event (only keep-alive data)" in outcome.error


class _Endless(httpx.SyncByteStream):
    def __init__(self, piece: bytes, times: int) -> None:
        self.piece, self.times = piece, times

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.times):
            yield self.piece


def test_hostile_streams_are_invalid_runs() -> None:
    one_line = _Endless(b"data: " + b"x" * 65536, 300)  # 19 MiB without a newline
    too_many = _Endless(_sse([_chunk("a")]), 200)  # never stops at max_tokens
    bad_utf8 = _sse([b'{"choices": [{"index": 0, "text": "\xff\xfe"}]}', *_good()])
    html = b"<html><body>502 Bad Gateway</body></html>"
    # Reading 19 MiB takes seconds on a loaded host: the idle timeout must not be what ends the first stream.
    reasons = _reasons([one_line, too_many, bad_utf8, html, _Endless(html, 1)], timeout_s=300)
    assert reasons[0] is not None and "an event larger than 16,777,216 bytes" in reasons[0]
    assert reasons[1] is not None and "did not stop at max_tokens" in reasons[1]
    assert reasons[2] is not None and reasons[2].startswith("malformed event") and "UTF-8" in reasons[2]
    assert reasons[3] == "HTTP 200 answered text/html, not an event stream: <html><body>502 Bad Gateway</body></html>"
    assert reasons[4] == "stream ended before [DONE] (the server closed the connection mid-stream)"

    def gateway(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, content=html, headers={"content-type": "text/html"})

    with BenchClient("http://x.test", transport=httpx.MockTransport(gateway), timeout_s=5) as client:
        outcome = client.stream("/v1/completions", {"max_tokens": 2})
        assert outcome.error == "HTTP 502: <html><body>502 Bad Gateway</body></html>"
        status, payload, error = client.post_json("/v1/chat/completions", {})
        assert (status, payload) == (502, None) and error is not None and error.startswith("HTTP 502")


def test_setup_answers_that_are_not_json_are_check_failures() -> None:
    def models(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"[" * 100_000)

    from glm53.errors import CheckFailed

    with BenchClient("http://x.test", transport=httpx.MockTransport(models)) as client, pytest.raises(CheckFailed):
        client.server_info()


def test_quality_answers_of_any_shape_fail_with_a_reason() -> None:
    class Poster:
        def __init__(self, payload: Any) -> None:
            self.payload = payload

        def post_json(self, path: str, body: dict[str, Any]) -> tuple[int | None, Any, str | None]:
            return 200, self.payload, None

    for payload in (
        {"choices": {"0": 1}},
        {"choices": 5},
        {"choices": [{"message": {"content": {"x": 1}, "tool_calls": 7}, "finish_reason": 3}]},
        [1],
    ):
        section = run_coherence(Poster(payload), "m", max_tokens=16)
        assert not any(r.passed for r in section.results) and all(r.reason for r in section.results)
    assert chat_answer({"choices": {"0": 1}, "usage": {"prompt_tokens": True}}) == ("", None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "--shapes", "99999999999:2"), "at most 10,000,000"),
        (("needle", "--sizes", "99999999999"), "between 128 and 10,000,000"),
        (("run", "--base-url", "http://[::1"), "--base-url"),
        (("run", "--runs", "0"), "--runs"),
    ],
)
def test_out_of_range_flags_are_exit_2(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    result = run_glm53("bench", *args, "--out", str(tmp_path))
    assert result.code == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_report_files_of_any_shape_are_exit_2(tmp_path: Path) -> None:
    cases = {
        "truncated.json": b'{"schema_version": "glm53.bench/1", "environ',
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "other.json": b'{"name": "some other tool", "version": 3}',
        "huge-int.json": b'{"schema_version": "glm53.bench/1", "x": ' + b"9" * 5000 + b"}",
        "wrong.json": b'{"schema_version": "glm53.bench/1", "environment": 3}',
    }
    nested = '{"schema_version": "glm53.bench/1", "environment": ' + '{"a": ' * 900 + "1" + "}" * 900 + "}"
    cases["nested.json"] = nested.encode()
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        result = run_glm53("bench", "compare", str(path))
        assert result.code == 2, (name, result.stderr)
        assert "Traceback" not in result.stderr and str(path) in result.stderr, (name, result.stderr)
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate(65 * 1024 * 1024)
    assert run_glm53("bench", "compare", str(big)).code == 2
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert run_glm53("bench", "compare", str(fifo)).code == 2


def test_an_agent_turn_with_a_burst_is_left_out_of_the_decode_rate() -> None:
    from glm53.bench.agent import Step, _turn_record, summarize

    step = Step(tool="t", arguments={}, result="r")
    burst = _outcome(64, 0.5, 0.5005, [0.5] * 64)
    paced = _outcome(64, 0.1, 0.74, [0.1 + i * 0.01 for i in range(64)])
    turns = [_turn_record("task", n, step, o, None) for n, o in ((1, burst), (2, paced))]
    assert turns[0].decode_rejected is not None and turns[0].decode_rejected.startswith("implausible timing")
    assert turns[1].decode_rejected is None
    section = summarize([], 0, 64, turns, None)
    assert section.mean_decode_tok_s == section.median_decode_tok_s == turns[1].decode_tok_s
    assert (turns[0].decode_source, turns[1].decode_source) == (None, "client")
    # With the engine's own timing of the turn, the burst is measured by it, labelled so.
    engine = MetricsDelta(server_requests=1, server_decode_s=0.63, server_ttft_s=0.1)
    timed = _turn_record("task", 1, step, burst, engine)
    assert timed.decode_rejected is None and timed.decode_source == "server"
    assert timed.decode_tok_s == pytest.approx(63 / 0.63)
