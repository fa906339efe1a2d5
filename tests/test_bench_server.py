"""`glm53 bench` end to end against the real vLLM CPU server (tiny random-weight model, small shapes).

Random weights fail every content gate: these tests check that the harness still measures, reports and
gates correctly, and exits with the documented codes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import httpx
import pytest

from glm53.bench.report import SCHEMA_VERSION, load_summary
from tests.support.cli import CliResult, run_bench, run_glm53

pytestmark = pytest.mark.slow


def _max_model_len(server: Any) -> int:
    models = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()
    return int(models["data"][0]["max_model_len"])


def _small_run(server: Any, out: Path, *extra: str) -> CliResult:
    """One run of one small shape, without plots."""
    return run_bench("run", server.base_url, out, "--shapes", "64:8", "--runs", "1", "--no-plots", *extra)


def test_run_measures_valid_runs_and_writes_the_report(vllm_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_bench(
        "run",
        vllm_server.base_url,
        out,
        "--shapes",
        "128:16,384:24",
        "--runs",
        "2",
        "--fail-under",
        "decode=1",
        "--json",
    )
    assert result.code == 0, result.stderr
    payload = result.json()
    summary = load_summary(out)
    assert summary.schema_version == SCHEMA_VERSION
    assert summary.run is not None and [s.shape for s in summary.run.shapes] == [
        "128:16",
        "384:24",
    ]
    for shape in summary.run.shapes:
        # On a busy host the CPU engine coalesces a request's output events, so the stream reaches the client
        # in bursts: the engine's own /metrics time such a run (timing_source "server"), it is not rejected.
        rejected = [run for run in shape.runs if not run.valid]
        assert not rejected and shape.best.rejected_runs == 0, [run.invalid_reason for run in rejected]
        assert shape.best.valid_runs == 2 and len(shape.runs) == 2
        for run in shape.runs:
            assert run.timing_source in ("client", "server")
            assert run.server_decode_tok_s is not None, "the engine timed every request (/metrics)"
            if run.timing_source == "server":
                assert run.decode_tok_s == run.server_decode_tok_s
                assert run.client_timing_note is not None and run.client_timing_note.startswith("implausible")
            assert (run.prompt_tokens, run.completion_tokens) == (
                shape.prompt_tokens,
                shape.output_tokens,
            )
            assert run.finish_reasons == ["length"]
            assert run.ttft_ms is not None and 0 < run.ttft_ms < 60_000
            assert run.decode_tok_s is not None and 1 < run.decode_tok_s < 100_000
            assert run.prefill_tok_s is not None and run.prefill_tok_s > 0
            assert run.total_s is not None and run.total_s * 1000 > run.ttft_ms
            assert run.metrics is not None and run.metrics.preemptions == 0
            assert run.metrics.prompt_tokens == shape.prompt_tokens
            # A fresh cache salt per request: the second run of the same prompt must not hit the cache.
            assert run.metrics.prefix_cache_hits == 0
        assert shape.best.decode_tok_s == max(r.decode_tok_s for r in shape.runs if r.valid and r.decode_tok_s)
    assert [g["passed"] for g in payload["gates"]] == [True, True]
    env = summary.environment
    assert env.server is not None and env.server.model == vllm_server.model_name
    assert env.server.vllm_version and len(env.tool_sha256) == 64
    if importlib.util.find_spec("matplotlib") is not None:
        assert sorted(Path(p).name for p in payload["plots"]) == ["decode_vs_context.png", "ttft_vs_context.png"]
    for png in payload["plots"]:
        assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fail_under_is_a_gate_and_bad_flags_exit_2(vllm_server: Any, tmp_path: Path) -> None:
    failing = _small_run(vllm_server, tmp_path, "--fail-under", "decode=1000000")
    assert failing.code == 1
    assert "gates failed: decode (64:8)" in failing.stderr
    summary = load_summary(tmp_path)
    assert summary.run is not None and summary.run.shapes[0].best.valid_runs == 1, "written before the exit"
    assert [g.passed for g in summary.gates["run"]] == [False]

    unknown = run_glm53("bench", "run", "--base-url", vllm_server.base_url, "--fail-under", "speed=3")
    assert unknown.code == 2 and "--fail-under" in unknown.stderr
    too_long = _max_model_len(vllm_server) + 1
    oversized = run_bench("run", vllm_server.base_url, tmp_path / "x", "--shapes", f"{too_long}:16")
    assert oversized.code == 2 and "max_model_len" in oversized.stderr and "--shapes" in oversized.stderr


def test_needle_reports_every_depth_with_the_answer(vllm_server: Any, tmp_path: Path) -> None:
    args = ("--sizes", "256,512", "--depths", "0.1,0.9", "--max-tokens", "12", "--json")
    result = run_bench("needle", vllm_server.base_url, tmp_path, *args)
    assert result.code == 1, "random weights cannot recall the needle: the gate fails"
    needle = result.json()["needle"]
    assert [(r["size_tokens"], r["depth"]) for r in needle["results"]] == [
        (256, 0.1),
        (256, 0.9),
        (512, 0.1),
        (512, 0.9),
    ]
    for r in needle["results"]:
        assert r["passed"] is False and r["reason"] in (
            "no JSON object in the answer",
            "the JSON object differs from the hidden record",
        )
        assert isinstance(r["answer"], str) and set(r["expected"]) == {
            "vault",
            "code",
            "shelf",
        }
        assert r["size_tokens"] // 2 < r["prompt_tokens"] <= r["size_tokens"]
    assert load_summary(tmp_path).needle is not None
    relaxed = run_bench("needle", vllm_server.base_url, tmp_path, *args, "--report-only")
    assert relaxed.code == 0


def test_coherence_reports_each_gate(vllm_server: Any, tmp_path: Path) -> None:
    result = run_bench("coherence", vllm_server.base_url, tmp_path, "--max-tokens", "12", "--json")
    assert result.code == 1
    results = {r["name"]: r for r in result.json()["coherence"]["results"]}
    assert list(results) == ["arithmetic", "tool-call", "code-no-thinking"]
    assert not any(r["passed"] for r in results.values())
    assert results["arithmetic"]["reason"] == "the answer does not contain 391"
    assert results["code-no-thinking"]["reason"] == "the answer does not contain 'def is_prime'"
    # Without a tool parser the server refuses tool_choice=auto (HTTP 400); either way it is reported.
    assert results["tool-call"]["reason"].startswith(("no get_weather tool call", "get_weather was called", "HTTP 400"))
    gates = load_summary(tmp_path).gates["coherence"]
    assert [(g.subject, g.passed) for g in gates] == [(name, False) for name in results]


def test_agent_sessions_share_their_prefix(vllm_server: Any, tmp_path: Path) -> None:
    from glm53.bench.agent import load_script

    result = run_bench(
        "agent",
        vllm_server.base_url,
        tmp_path,
        *("--tasks", "3", "--system-tokens", "256", "--max-tokens", "8", "--fail-under", "cache-hit=1", "--json"),
    )
    agent = result.json()["agent"]
    turns = agent["turns"]
    tasks = load_script().tasks[:3]
    assert agent["tasks"] == [task.name for task in tasks]
    assert [(t["task"], t["turn"]) for t in turns] == [
        (task.name, number) for task in tasks for number in range(1, len(task.steps) + 1)
    ]
    if turns[0]["error"] and turns[0]["error"].startswith("HTTP 400"):
        pytest.skip("this server does not accept tool_choice=auto (no tool parser)")
    assert result.code == 0, result.stderr
    for task in tasks:
        prompts = [t["prompt_tokens"] for t in turns if t["task"] == task.name]
        assert prompts == sorted(prompts) and prompts[0] < prompts[-1], "the conversation grows every turn"
    assert all(t["error"] is None and t["latency_s"] > 0 for t in turns)
    assert all(t["ttft_s"] is not None for t in turns), (
        "token ids stream even while the tool-call parser holds text back"
    )
    assert 0 < agent["prefix_cache_hit_pct"] < 100, "later turns reuse the earlier turns' prefix"
    assert agent["median_turn_latency_s"] > 0 and agent["mean_decode_tok_s"] > 0


def test_compare_against_the_recipe_and_between_reports(vllm_server: Any, tmp_path: Path) -> None:
    for name in ("a", "b"):
        made = _small_run(vllm_server, tmp_path / name)
        assert made.code == 0, made.stderr
    recipe = run_glm53("bench", "compare", str(tmp_path / "a"), "--json")
    # a tiny model's shapes are none of the recipe's: the rows are printed, and the exit says nothing compared
    assert recipe.code == 1 and "nothing to compare" in recipe.stderr, recipe.stderr
    rows = recipe.json()["rows"]
    assert {r["subject"] for r in rows} >= {
        "8192:2048",
        "131072:2048",
        "260096:2048",
        "64:8",
    }
    both = run_glm53("bench", "compare", str(tmp_path / "a"), str(tmp_path / "b" / "summary.json"))
    assert both.code == 0 and "decode tok/s" in both.stdout
    missing = run_glm53("bench", "compare", str(tmp_path / "nope"))
    assert missing.code == 2 and "not found" in missing.stderr
