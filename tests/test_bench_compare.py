"""`bench compare --fail-under/--fail-over`: compare as a gate on the candidate report (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.bench.coherence import CoherenceResult, CoherenceSection
from glm53.bench.compare import compare_gates
from glm53.bench.report import Summary, collect_environment, write_section
from glm53.bench.runner import BestOf, RunSection, ShapeResult
from tests.support.bench_runs import run_record, run_section, shape_result
from tests.support.cli import run_glm53


def _section(ttft_ms: float, decode: float, prefill: float, shapes: tuple[int, ...] = (8192,)) -> RunSection:
    return run_section(
        *(
            shape_result(
                run_record(
                    f"{prompt}:2048",
                    started_at="2026-11-30T00:00:00+00:00",
                    cache_salt="0" * 32,
                    prompt_tokens=prompt,
                    completion_tokens=2048,
                    ttft_ms=ttft_ms,
                    prefill_tok_s=prefill,
                    decode_tok_s=decode,
                )
            )
            for prompt in shapes
        )
    )


@pytest.fixture
def reports(tmp_path: Path) -> tuple[Path, Path]:
    """A: decode 40 tok/s, TTFT 8 s, prefill 900; B: decode 50, TTFT 6 s, prefill 1200 (two shapes)."""
    env = collect_environment(None, environ={})
    a, b = tmp_path / "a", tmp_path / "b"
    write_section(a, env, run=_section(8000, 40.0, 900.0, (8192, 131072)))
    write_section(b, env, run=_section(6000, 50.0, 1200.0, (8192, 131072)))
    return a, b


def test_the_gate_is_on_the_candidate_and_passes(reports: tuple[Path, Path]) -> None:
    a, b = reports
    result = run_glm53(
        "bench",
        "compare",
        str(a),
        str(b),
        "--fail-under",
        "decode=45,prefill=1000",
        "--fail-over",
        "ttft=7",
        "--json",
    )
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["gated"] == str(b)
    assert {(g["name"], g["subject"], g["passed"]) for g in payload["gates"]} == {
        (name, shape, True) for name in ("decode", "prefill", "ttft") for shape in ("8192:2048", "131072:2048")
    }
    assert any(r["metric"] == "decode_tok_s" and r["delta"] == 10.0 for r in payload["rows"]), "rows still there"


def test_a_failing_gate_exits_1_and_names_it(reports: tuple[Path, Path]) -> None:
    a, b = reports
    result = run_glm53("bench", "compare", str(a), str(b), "--fail-under", "decode=55")
    assert result.code == 1
    assert "compare: 2 of 2 gates failed: decode (8192:2048), decode (131072:2048)" in result.stderr
    assert "decode tok/s" in result.stdout, "the side-by-side table is printed before the verdict"
    slow = run_glm53("bench", "compare", str(a), str(b), "--fail-over", "ttft=5", "--json")
    assert slow.code == 1
    assert [g["detail"] for g in slow.json()["gates"]] == ["6 s exceeds the maximum 5 s"] * 2
    # A alone (against the recipe) is the candidate: its 40 tok/s does not reach 45.
    alone = run_glm53("bench", "compare", str(a), "--fail-under", "decode=45", "--json")
    assert alone.code == 1 and alone.json()["gated"] == str(a)
    assert [g["value"] for g in alone.json()["gates"]] == [40.0, 40.0]
    assert run_glm53("bench", "compare", str(b), "--fail-under", "decode=45").code == 0


def test_bad_thresholds_are_exit_2_before_reading_reports(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    for flag, spec, message in (
        ("--fail-under", "speed=3", "--fail-under: 'speed=3' is not KEY=NUMBER with a known KEY"),
        ("--fail-under", "decode=nan", "--fail-under: decode='nan' is not a finite number"),
        ("--fail-under", "decode=inf", "--fail-under: decode='inf' is not a finite number"),
        ("--fail-over", "ttft=fast", "--fail-over: ttft='fast' is not a number"),
        ("--fail-over", "decode=3", "--fail-over: 'decode=3' is not KEY=NUMBER"),
    ):
        result = run_glm53("bench", "compare", missing, flag, spec)
        assert result.code == 2 and message in result.stderr, (spec, result.stderr)


def test_a_candidate_without_a_run_section_fails_every_threshold(tmp_path: Path) -> None:
    env = collect_environment(None, environ={})
    coherence = CoherenceSection(max_tokens=8, results=[CoherenceResult(name="arithmetic", prompt="p", passed=True)])
    write_section(tmp_path / "a", env, run=_section(8000, 40.0, 900.0))
    write_section(tmp_path / "b", env, coherence=coherence)
    result = run_glm53(
        "bench",
        "compare",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
        "--fail-under",
        "decode=1",
        "--fail-over",
        "ttft=100",
        "--json",
    )
    assert result.code == 1
    gates = result.json()["gates"]
    assert [(g["name"], g["subject"], g["value"], g["passed"]) for g in gates] == [
        ("decode", "no run section", None, False),
        ("ttft", "no run section", None, False),
    ]


def test_compare_gates_treat_a_shape_without_valid_runs_as_failing() -> None:
    section = _section(6000, 50.0, 1200.0)
    empty = ShapeResult(
        shape="260096:2048", prompt_tokens=260096, output_tokens=2048, runs=[], best=BestOf(valid_runs=0)
    )
    section = section.model_copy(update={"shapes": [*section.shapes, empty]})
    summary = Summary(environment=collect_environment(None, environ={}), run=section)
    gates = compare_gates(summary, {"decode": 45.0}, {})
    assert [(g.subject, g.passed) for g in gates] == [("8192:2048", True), ("260096:2048", False)]
    assert compare_gates(summary, {}, {}) == []


def test_a_comparison_of_nothing_says_what_each_side_has_and_exits_1(tmp_path: Path) -> None:
    """The demo's tiny-model report against the recipe: no shape in common, so every B - A would be empty."""
    env = collect_environment(None, environ={})
    small = tmp_path / "small"
    write_section(small, env, run=_section(300, 20.0, 500.0, (512,)))
    result = run_glm53("bench", "compare", str(small))
    assert result.code == 1
    assert "nothing to compare: no shape (context:output tokens) is measured on both sides" in result.stderr
    assert "A has 8192:2048, 131072:2048, 260096:2048, B has 512:2048" in result.stderr
    assert "the recipe's: 8192:2048, 131072:2048, 260096:2048" in result.stderr
    # the table is still printed, and --json still carries the rows
    assert "B - A" in result.stdout
    assert run_glm53("bench", "compare", str(small), "--json").code == 1


def test_a_comparison_with_a_shape_in_common_is_not_refused(reports: tuple[Path, Path]) -> None:
    a, b = reports
    assert run_glm53("bench", "compare", str(a)).code == 0  # 8192:2048 and 131072:2048 are the recipe's too
    assert run_glm53("bench", "compare", str(a), str(b)).code == 0


def test_the_default_report_directory_is_ignored_by_git() -> None:
    """`glm53 bench run` without --out writes glm53-bench/ in the checkout: git ignores it, so a demo's bench run
    leaves the tree clean (git itself answers, with the repository's own .gitignore)."""
    import shutil
    import subprocess

    from glm53.bench.target import DEFAULT_REPORT_DIR

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probe = f"{DEFAULT_REPORT_DIR}/report.json"
    done = subprocess.run(["git", "check-ignore", "-q", "--no-index", probe], cwd=root, check=False)
    assert done.returncode == 0, f"{probe} is not ignored by the repository's .gitignore"
