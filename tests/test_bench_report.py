"""The report's environment and its files: git state, output directories, schema versions, non-finite numbers."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glm53.bench import report
from glm53.bench.client import ServerInfo
from glm53.bench.gates import maximum_gates, minimum_gates
from glm53.bench.metrics import parse_prometheus
from glm53.bench.report import (
    collect_environment,
    ensure_same_server,
    finite_or_none,
    git_state,
    load_summary,
    prepare_out_dir,
    write_section,
)
from glm53.bench.runner import run_gates
from glm53.errors import BadInput
from tests.support.bench_fixtures import TokenizingHandler, serve_http
from tests.support.bench_runs import one_run_section
from tests.support.cli import run_bench, run_glm53

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed checkout: one tracked file, a .gitignore for *.log, an untracked-files=no user setting."""
    for key, value in {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1",
    }.items():
        monkeypatch.setenv(key, value)
    root = tmp_path / "checkout"
    (root / "pkg").mkdir(parents=True)
    _git(root, "init", "-q")
    # A user who hides untracked files from `git status` must not hide them from the report.
    _git(root, "config", "status.showUntrackedFiles", "no")
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("*.log\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "initial")
    return root


@needs_git
def test_git_state_is_clean_on_a_fresh_commit(repo: Path) -> None:
    commit, dirty = git_state(repo / "pkg")
    assert commit == _git(repo, "rev-parse", "HEAD").strip() and len(commit) == 40
    assert dirty is False


@needs_git
def test_untracked_files_make_the_checkout_dirty_ignored_ones_do_not(repo: Path) -> None:
    (repo / "pkg" / "run.log").write_text("ignored\n")
    assert git_state(repo / "pkg")[1] is False, "an ignored file is not a change"
    (repo / "pkg" / "new.py").write_text("y = 2\n")
    assert git_state(repo / "pkg")[1] is True, "an untracked, not ignored file is a change"
    (repo / "pkg" / "new.py").unlink()
    assert git_state(repo / "pkg")[1] is False
    (repo / "pkg" / "mod.py").write_text("x = 3\n")
    assert git_state(repo / "pkg")[1] is True, "a modified tracked file is a change"


@needs_git
def test_git_state_outside_a_checkout_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert git_state(outside) == (None, None)


# --- output directories -------------------------------------------------------------------------------


def test_an_out_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "report"
    target.write_text("not a directory\n")
    with pytest.raises(BadInput, match="is a file, not a directory"):
        prepare_out_dir(target)
    with pytest.raises(BadInput, match="cannot create the directory"):
        prepare_out_dir(target / "below")
    with pytest.raises(BadInput, match="is a file, not a directory"):
        write_section(target, collect_environment(None, environ={}))
    assert target.read_text() == "not a directory\n"


def test_a_summary_json_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(BadInput, match=r"summary\.json is not a file"):
        prepare_out_dir(tmp_path)
    with pytest.raises(BadInput, match=r"summary\.json is not a file"):
        load_summary(tmp_path)


def test_an_unwritable_out_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(report.tempfile, "mkstemp", refuse)
    with pytest.raises(BadInput, match="cannot write there: Permission denied") as info:
        prepare_out_dir(tmp_path / "new")
    assert info.value.exit_code == 2 and info.value.fix == "pass a directory you can write to"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_a_read_only_out_directory_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(BadInput, match="cannot write there"):
            prepare_out_dir(locked)
    finally:
        locked.chmod(0o700)


def test_the_write_check_leaves_nothing_behind(tmp_path: Path) -> None:
    assert prepare_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list((tmp_path / "a" / "b").iterdir()) == []


# --- reading reports -------------------------------------------------------------------------------------


def _valid_summary(tmp_path: Path) -> dict[str, Any]:
    path = write_section(tmp_path / "ok", collect_environment(None, environ={}))
    raw = json.loads(path.read_text())
    assert isinstance(raw, dict)
    return raw


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw.update(schema_version="glm53.bench/2"), "schema_version 'glm53.bench/2' is not"),
        (lambda raw: raw.pop("schema_version"), "has no schema_version"),
        (lambda raw: raw["environment"].update(python=None), "environment.python"),
    ],
)
def test_compare_refuses_another_schema_with_exit_2(tmp_path: Path, edit: Any, message: str) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_valid_summary(tmp_path)))
    raw = _valid_summary(tmp_path)
    edit(raw)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(raw))
    for args in ((str(other),), (str(good), str(other)), (str(other), str(good))):
        result = run_glm53("bench", "compare", *args)
        assert result.code == 2, result.stderr
        assert message in result.stderr and str(other) in result.stderr
        assert "Traceback" not in result.stderr


def test_a_report_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    result = run_glm53("bench", "compare", str(path))
    assert result.code == 2 and "a JSON list, not an object" in result.stderr


def test_a_report_with_nan_or_infinity_is_refused_naming_the_field(tmp_path: Path) -> None:
    raw = _valid_summary(tmp_path)
    raw["run"] = one_run_section(decode_tok_s=50.0).model_dump(mode="json")
    text = json.dumps(raw).replace('"decode_tok_s": 50.0', '"decode_tok_s": NaN', 1)
    path = tmp_path / "nan.json"
    path.write_text(text)
    result = run_glm53("bench", "compare", str(path))
    assert result.code == 2
    assert "run.shapes.0.runs.0.decode_tok_s (nan) is not a finite number" in result.stderr
    path.write_text(json.dumps(raw).replace('"decode_tok_s": 50.0', '"decode_tok_s": -Infinity'))
    assert "(-inf) is not a finite number" in run_glm53("bench", "compare", str(path)).stderr


def test_non_finite_values_are_written_as_null_and_gated_as_missing(tmp_path: Path) -> None:
    section = one_run_section(decode_tok_s=math.nan)
    gates = run_gates(section, {"decode": 1.0}, {})
    assert [(g.value, g.passed) for g in gates] == [(None, False)]
    assert gates[0].detail == "no valid value: the minimum 1 tok/s is not shown"
    assert not minimum_gates("x", 1.0, [("s", math.inf)], "tok/s")[0].passed, "infinity shows nothing"
    assert not maximum_gates("x", 1.0, [("s", -math.inf)], "s")[0].passed
    path = write_section(tmp_path, collect_environment(None, environ={}), run=section, gates={"run": gates})

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} written to the report")

    raw = json.loads(path.read_text(), parse_constant=refuse)
    assert raw["run"]["shapes"][0]["best"]["decode_tok_s"] is None
    loaded = load_summary(tmp_path)
    assert loaded.run is not None and loaded.run.shapes[0].runs[0].decode_tok_s is None


def test_finite_or_none_replaces_only_non_finite_numbers() -> None:
    value = {"a": [math.nan, 1.5, {"b": math.inf, "c": -math.inf}], "d": "NaN", "e": 3, "f": None}
    assert finite_or_none(value) == {"a": [None, 1.5, {"b": None, "c": None}], "d": "NaN", "e": 3, "f": None}


def test_prometheus_nan_and_infinity_are_skipped() -> None:
    text = 'vllm:prefix_cache_hits_total 5\nvllm:prefix_cache_hits_total{x="1"} +Inf\nvllm:prompt_tokens_total NaN\n'
    assert parse_prometheus(text) == {"vllm:prefix_cache_hits_total": 5.0}


def test_an_out_directory_holding_an_unreadable_report_is_refused_before_measuring(tmp_path: Path) -> None:
    raw = _valid_summary(tmp_path)
    raw["schema_version"] = "glm53.bench/0"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text(json.dumps(raw))
    with pytest.raises(BadInput, match="holds a report this glm53 cannot update") as info:
        ensure_same_server(tmp_path / "old", ServerInfo(base_url="http://a:1", model="m"))
    assert info.value.fix == "pass another --out directory, or move the old report away"


# --- the commands against a small well-behaved server -----------------------------------------------------


class _Handler(TokenizingHandler):
    """/v1/models, /tokenize, and /v1/completions streaming exactly the tokens asked for."""

    model = "steady"
    completions = 0

    def post(self, body: Any) -> None:
        type(self).completions += 1
        n = int(body["max_tokens"])
        events = [
            {"choices": [{"index": 0, "text": "a", "finish_reason": "length" if i == n - 1 else None}]}
            for i in range(n)
        ]
        events.append({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}})
        self._send_events(events)


@pytest.fixture
def steady_server() -> Iterator[str]:
    _Handler.completions = 0
    with serve_http(_Handler) as url:
        yield url


def _bench_run(url: str, out: Path, *extra: str) -> Any:
    return run_bench("run", url, out, "--shapes", "64:4", "--runs", "1", *extra)


def test_bench_run_into_a_file_fails_before_measuring(steady_server: str, tmp_path: Path) -> None:
    target = tmp_path / "report"
    target.write_text("x")
    result = _bench_run(steady_server, target, "--no-plots")
    assert result.code == 2 and f"--out {target} is a file, not a directory" in result.stderr
    assert _Handler.completions == 0, "nothing was measured"
    ok = _bench_run(steady_server, tmp_path / "fine", "--no-plots", "--json")
    assert ok.code == 0, ok.stderr
    assert _Handler.completions == 1 and ok.json()["run"]["shapes"][0]["best"]["valid_runs"] == 1


def test_a_plot_that_cannot_be_written_does_not_hide_the_result(steady_server: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "ttft_vs_context.png").mkdir()
    result = _bench_run(steady_server, tmp_path, "--json", "--fail-under", "decode=1e12")
    assert result.code == 1, "the failing gate decides the exit code, not the plot"
    assert "plots skipped" in result.stderr and "gates failed: decode (64:4)" in result.stderr
    assert load_summary(tmp_path).run is not None
    assert (tmp_path / "ttft_vs_context.png").is_dir()


def test_a_timeout_that_is_not_finite_is_refused(tmp_path: Path) -> None:
    forever = run_glm53("bench", "coherence", "--timeout", "inf", "--out", str(tmp_path))
    assert forever.code == 2 and "--timeout inf: not a finite number of seconds" in forever.stderr
    undefined = run_glm53("bench", "coherence", "--timeout", "nan", "--out", str(tmp_path))
    assert undefined.code == 2 and "--timeout" in undefined.stderr
