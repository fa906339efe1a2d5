"""Pure parts of the bench: Prometheus parsing, prompt building, thresholds, reports and comparisons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm53.bench.compare import compare_summaries, compare_to_recipe
from glm53.bench.gates import maximum_gates, minimum_gates, parse_thresholds
from glm53.bench.metrics import diff_metrics, parse_prometheus
from glm53.bench.needle import (
    extract_json_object,
    judge_answer,
    parse_depths,
    parse_sizes,
)
from glm53.bench.prompts import PromptFactory
from glm53.bench.report import (
    SCHEMA_VERSION,
    Environment,
    Summary,
    collect_environment,
    load_summary,
    plan_env,
    write_section,
)
from glm53.bench.runner import (
    RUN_FAIL_UNDER,
    BestOf,
    RunRecord,
    RunSection,
    Shape,
    ShapeResult,
    best_of,
    check_fits,
    parse_shapes,
    run_gates,
)
from glm53.errors import BadInput
from glm53.recipe.performance import recipe_performance
from tests.support.bench_runs import run_record, run_section, shape_result

METRICS_BEFORE = """# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:prompt_tokens_total{engine="0",model_name="m {weird} label"} 100.0
vllm:generation_tokens_total{engine="0",model_name="m"} 5.0 1700000000000
vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN
"""


def test_prometheus_parse_and_diff() -> None:
    before = parse_prometheus(METRICS_BEFORE)
    assert before["vllm:prompt_tokens_total"] == 100.0
    assert "vllm:kv_cache_usage_perc" not in before
    after = parse_prometheus(
        METRICS_BEFORE.replace('preemptions_total{engine="0",model_name="m"} 1.0', "preemptions_total 3")
        .replace('queries_total{engine="0",model_name="m"} 100.0', "queries_total 400")
        .replace('hits_total{engine="0",model_name="m"} 10.0', "hits_total 160")
    )
    delta = diff_metrics(before, after)
    assert delta is not None
    assert delta.preemptions == 2.0
    assert delta.prefix_cache_queries == 300.0 and delta.prefix_cache_hits == 150.0
    assert delta.prefix_cache_hit_rate == 0.5
    assert delta.prompt_tokens == 0.0
    assert diff_metrics(None, after) is None
    assert diff_metrics({}, {}) is not None and diff_metrics({}, {}).preemptions is None  # type: ignore[union-attr]


class CountingTokenizer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def tokenize(self, model: str, text: str) -> list[int]:
        self.calls.append(text)
        return [ord(c) % 251 + 1 for c in text]


def test_exact_prompts_are_tiled_not_retokenized() -> None:
    tokenizer = CountingTokenizer()
    factory = PromptFactory(tokenizer, "m")
    for length in (1, 17, 8192, 260_096):
        assert len(factory.exact(length)) == length
        assert len(factory.exact(length, "random", seed=3)) == length
    assert len(tokenizer.calls) == 1, "one tokenization of the base text, whatever the lengths"
    assert factory.exact(1000, "random", seed=1) == factory.exact(1000, "random", seed=1)
    assert set(factory.exact(5000, "random")) <= set(factory.base_ids())


def test_haystack_respects_the_budget_and_places_the_insert() -> None:
    tokenizer = CountingTokenizer()
    factory = PromptFactory(tokenizer, "m")
    for depth in (0.0, 0.5, 1.0):
        text, used = factory.haystack(20_000, insert="NEEDLE-LINE", depth=depth)
        assert used <= 20_000 and len(tokenizer.tokenize("m", text)) <= 20_000 + 2
        position = text.index("NEEDLE-LINE") / len(text)
        assert abs(position - depth) < 0.05
    assert len(tokenizer.calls) < 20


def test_shapes_and_thresholds_parse_or_name_the_flag() -> None:
    assert parse_shapes("8192:2048, 131_072:2048") == [
        Shape(prompt_tokens=8192, output_tokens=2048),
        Shape(prompt_tokens=131072, output_tokens=2048),
    ]
    for bad in ("8192", "8192:1", "x:2", ""):
        with pytest.raises(BadInput, match="--shapes"):
            parse_shapes(bad)
    assert parse_thresholds("decode=45, prefill=1000", RUN_FAIL_UNDER) == {
        "decode": 45.0,
        "prefill": 1000.0,
    }
    with pytest.raises(BadInput, match="--fail-under: 'speed=3'") as info:
        parse_thresholds("speed=3", RUN_FAIL_UNDER)
    assert info.value.exit_code == 2 and info.value.fix is not None and "decode" in info.value.fix
    with pytest.raises(BadInput, match="not a number"):
        parse_thresholds("decode=fast", RUN_FAIL_UNDER)
    with pytest.raises(BadInput, match="max_model_len is 4096"):
        check_fits([Shape(prompt_tokens=4000, output_tokens=200)], 4096)
    assert parse_sizes("512,1_024") == [512, 1024]
    assert parse_depths("0.05,0.95") == [0.05, 0.95]
    with pytest.raises(BadInput, match="--depths"):
        parse_depths("0.5,1.5")
    with pytest.raises(BadInput, match="--sizes"):
        parse_sizes("64")


def _record(run: int, valid: bool, ttft: float, decode: float) -> RunRecord:
    return run_record(
        "8192:2048",
        run=run,
        ttft_ms=ttft,
        prefill_tok_s=8192 / ttft * 1000,
        decode_tok_s=decode,
        valid=valid,
        invalid_reason=None if valid else "broken",
    )


def test_best_of_uses_valid_runs_only_and_gates_every_shape() -> None:
    runs = [
        _record(1, True, 8000, 49.0),
        _record(2, True, 7000, 48.0),
        _record(3, False, 10, 999.0),
    ]
    best = best_of(runs)
    assert best.valid_runs == 2 and best.ttft_ms == 7000 and best.decode_tok_s == 49.0
    section = run_section(
        shape_result(*runs),
        ShapeResult(shape="1:2", prompt_tokens=1, output_tokens=2, runs=[], best=BestOf(valid_runs=0)),
        runs_per_shape=3,
    )
    gates = run_gates(section, {"decode": 45}, {"ttft": 7.5})
    verdicts = {(g.name, g.subject): g.passed for g in gates}
    assert verdicts == {
        ("decode", "8192:2048"): True,
        ("decode", "1:2"): False,
        ("ttft", "8192:2048"): True,
        ("ttft", "1:2"): False,
    }
    assert not minimum_gates("x", 1.0, [("s", 0.5)], "")[0].passed
    assert maximum_gates("x", 1.0, [("s", 0.5)], "s")[0].passed


def test_needle_answers_are_judged_on_exact_json() -> None:
    expected = {"vault": "amber-123", "code": 12345, "shelf": "quartz"}
    assert judge_answer(
        '```json\n{"vault": "amber-123", "code": 12345, "shelf": "quartz"}\n```',
        expected,
    )[0]
    assert judge_answer('Sure: {"shelf": "quartz", "vault": "amber-123", "code": 12345}.', expected)[0]
    assert judge_answer('{"vault": "amber-123", "code": 12346, "shelf": "quartz"}', expected) == (
        False,
        "the JSON object differs from the hidden record",
    )
    assert judge_answer("no idea", expected) == (False, "no JSON object in the answer")
    assert extract_json_object('{broken {"a": 1}') == {"a": 1}


def _summary_with(run: RunSection) -> Summary:
    return Summary(environment=collect_environment(None, environ={}), run=run)


def _section(ttft: float, decode: float) -> RunSection:
    return run_section(shape_result(_record(1, True, ttft, decode)))


def test_write_section_merges_atomically_and_load_checks_schema(tmp_path: Path) -> None:
    env = collect_environment(
        None,
        environ={"EXL3_PINNED_FRAC": "0.2", "VLLM_API_KEY": "secret", "HOME": "/x"},
    )
    assert env.plan_env == {"EXL3_PINNED_FRAC": "0.2"}, "plan keys only, never secrets"
    assert len(env.tool_sha256) == 64
    path = write_section(tmp_path / "out", env, run=_section(7000, 49.0), gates={"run": []})
    loaded = load_summary(tmp_path / "out")
    assert loaded.schema_version == SCHEMA_VERSION and loaded.run is not None
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json"], "no temp file left behind"
    raw = json.loads(path.read_text())
    raw["schema_version"] = "glm53.bench/0"
    path.write_text(json.dumps(raw))
    with pytest.raises(BadInput, match="schema_version"):
        load_summary(path)
    path.write_text("{")
    with pytest.raises(BadInput, match="not valid JSON"):
        load_summary(path)
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "environment": {}}))
    with pytest.raises(BadInput, match="environment"):
        load_summary(path)


def test_sections_accumulate_in_one_summary(tmp_path: Path) -> None:
    env = collect_environment(None, environ={})
    write_section(tmp_path, env, run=_section(7000, 49.0), gates={"run": []})
    from glm53.bench.coherence import CoherenceResult, CoherenceSection

    coherence = CoherenceSection(
        max_tokens=8,
        results=[CoherenceResult(name="arithmetic", prompt="p", passed=False)],
    )
    write_section(tmp_path, env, coherence=coherence, gates={"coherence": []})
    summary = load_summary(tmp_path / "summary.json")
    assert summary.run is not None and summary.coherence is not None
    assert set(summary.gates) == {"run", "coherence"}


def test_compare_two_reports_and_against_the_recipe() -> None:
    a, b = _summary_with(_section(8000, 40.0)), _summary_with(_section(6000, 50.0))
    rows = {(r.subject, r.metric): r for r in compare_summaries(a, b).rows}
    decode = rows[("8192:2048", "decode_tok_s")]
    assert decode.delta == 10.0 and decode.delta_pct == 25.0 and decode.b_better is True
    ttft = rows[("8192:2048", "ttft_ms")]
    assert ttft.delta == -2000.0 and ttft.b_better is True, "lower TTFT is better"
    recipe = recipe_performance()
    assert [p.context_len for p in recipe.profiles["prefill-256k"]] == [
        8192,
        131072,
        260096,
    ]
    vs_recipe = compare_to_recipe(b)
    mine = {(r.subject, r.metric): r for r in vs_recipe.rows}
    assert mine[("8192:2048", "decode_tok_s")].a == 50.4
    assert mine[("131072:2048", "decode_tok_s")].b is None, "shapes not measured show as missing"
    with pytest.raises(BadInput, match="--figures"):
        compare_to_recipe(b, profile="nope")


def test_environment_model_round_trips() -> None:
    env = collect_environment(None, environ={})
    assert Environment.model_validate_json(env.model_dump_json()) == env
    assert plan_env({"MAX_MODEL_LEN": "262144", "HF_TOKEN": "x", "GLM53_SECRET_THING": "y"}) == {
        "MAX_MODEL_LEN": "262144"
    }


def test_one_summary_holds_one_server(tmp_path: Path) -> None:
    from glm53.bench.client import ServerInfo
    from glm53.bench.report import ensure_same_server

    first = ServerInfo(base_url="http://a:1", model="m")
    write_section(tmp_path, collect_environment(first, environ={}), run=_section(7000, 49.0))
    ensure_same_server(tmp_path, first)
    with pytest.raises(BadInput, match="--out") as info:
        ensure_same_server(tmp_path, ServerInfo(base_url="http://b:1", model="m"))
    assert info.value.fix == "pass another --out directory for this server"


def test_environment_records_gpus_and_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    from glm53.host import gpus

    fake = gpus.GpuInfo(
        index=0,
        name="NVIDIA GeForce RTX 3090",
        memory_total_bytes=24 << 30,
        memory_used_bytes=1 << 30,
        driver_version="580.95.05",
        compute_capability=(8, 6),
    )
    monkeypatch.setattr(gpus, "read_gpus", lambda: [fake, fake.model_copy(update={"index": 1})])
    env = collect_environment(None, environ={})
    assert env.driver == "580.95.05" and env.gpu_note is None
    assert [g["index"] for g in env.gpus] == [0, 1] and env.gpus[0]["name"] == "NVIDIA GeForce RTX 3090"

    def no_gpu() -> list[gpus.GpuInfo]:
        raise gpus.NoGpu("NVML cannot start: no driver")

    monkeypatch.setattr(gpus, "read_gpus", no_gpu)
    env = collect_environment(None, environ={})
    assert env.gpus == [] and env.driver is None and env.gpu_note == "NVML cannot start: no driver"
