"""`glm53 bench` against a small local HTTP server that misbehaves on purpose (no vLLM needed):
invalid runs are reported with their reasons, the report is written, the exit code says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.bench.report import load_summary
from tests.support.bench_fixtures import QuietHandler, serve_http
from tests.support.cli import run_bench, run_glm53


class _Handler(QuietHandler):
    """/v1/models and /tokenize work; completions alternate between HTTP 503 and a stream cut short."""

    calls = 0

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send_models("flaky", 2048)
        else:
            self._json(404, {"error": {"message": "not here"}})

    def do_POST(self) -> None:
        body = self._read_json()
        if self.path == "/tokenize":
            self._json(200, {"count": 64, "max_model_len": 2048, "tokens": list(range(1, 65))})
            return
        type(self).calls += 1
        if type(self).calls % 2:
            self._json(503, {"error": {"message": "engine overloaded"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        assert body["stream"] is True  # then the connection closes without [DONE]


@pytest.fixture
def flaky_server() -> Iterator[str]:
    _Handler.calls = 0
    with serve_http(_Handler) as url:
        yield url


def test_broken_runs_are_kept_with_reasons_and_exit_1(flaky_server: str, tmp_path: Path) -> None:
    result = run_bench("run", flaky_server, tmp_path, "--shapes", "100:8,200:8", "--runs", "2", "--no-plots", "--json")
    assert result.code == 1
    assert "no valid run for 100:8, 200:8" in result.stderr
    summary = load_summary(tmp_path)
    assert summary.run is not None
    reasons = [run.invalid_reason for shape in summary.run.shapes for run in shape.runs]
    assert (
        reasons
        == [
            "HTTP 503: engine overloaded",
            "stream ended before [DONE] (the server closed the connection mid-stream)",
        ]
        * 2
    )
    assert all(shape.best.valid_runs == 0 and shape.best.decode_tok_s is None for shape in summary.run.shapes)
    assert summary.environment.server is not None and summary.environment.server.max_model_len == 2048
    runs = summary.run.shapes[0].runs
    assert runs[1].ttft_ms is not None, "the token that did arrive was still timed"
    assert runs[0].metrics is None, "no /metrics on this server: recorded as absent"


def test_shape_beyond_max_model_len_is_refused_before_running(flaky_server: str, tmp_path: Path) -> None:
    result = run_bench("run", flaky_server, tmp_path, "--shapes", "2000:100")
    assert result.code == 2
    assert "--shapes: 2000:100 needs 2100 tokens of context; the server's max_model_len is 2048" in result.stderr
    assert _Handler.calls == 0 and not (tmp_path / "summary.json").exists()


def test_unreachable_server_is_exit_3(tmp_path: Path) -> None:
    result = run_bench("coherence", "http://127.0.0.1:9", tmp_path)
    assert result.code == 3 and "cannot reach http://127.0.0.1:9/v1/models" in result.stderr


def test_bad_base_url_is_exit_2() -> None:
    result = run_glm53("bench", "run", "--base-url", "localhost:8000")
    assert result.code == 2 and "--base-url" in result.stderr
