"""`bench run` / `bench agent` through a router with `--backend`: the per-backend split from each backend's own
/metrics, against stand-in vLLM servers (vLLM's real metric names) behind a stand-in sticky-session router whose
placement is known (tests/support/bench_fixtures.StandInRouter).
The real router in front of two real vLLM servers is tests/test_router.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm53.bench.backends import parse_backends, split_of
from glm53.bench.report import load_summary
from glm53.errors import BadInput
from tests.support.bench_fixtures import stand_in_fleet
from tests.support.cli import bench_json, run_bench


def _requests(handler: type) -> float:
    return sum(v for k, v in handler.counters.items() if k.startswith("vllm:request_success_total"))


def test_agent_through_the_router_keeps_each_session_on_one_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the tables, unwrapped
    with stand_in_fleet(2) as (router, backends, handlers):
        agent = bench_json(
            "agent", router, tmp_path, "--tasks", "6", "--system-tokens", "64", "--max-tokens", "16", backends=backends
        )
        split = agent["backends"]
        turns = agent["turns"]
        # Every turn named its conversation; the router kept each conversation on one box.
        keys = {t["task"]: set() for t in turns}
        for t in turns:
            keys[t["task"]].add(t["session_id"])
        assert all(len(k) == 1 for k in keys.values()) and len({next(iter(k)) for k in keys.values()}) == 6
        assert split["sessions"] == 6 and split["sessions_on_one_backend"] == 6
        assert split["unattributed"] == 0 and all(t["backend"] in backends for t in turns)
        by_task: dict[str, set[str]] = {}
        for t in turns:
            by_task.setdefault(t["task"], set()).add(t["backend"])
        assert all(len(b) == 1 for b in by_task.values())
        # The split is each backend's own counters, and adds up to the bench.
        rows = {row["url"]: row for row in split["backends"]}
        assert [rows[u]["requests"] for u in backends] == [_requests(h) for h in handlers]
        assert split["requests"] == len(turns) == sum(rows[u]["served"] for u in backends)
        # The stand-in router places the n-th new session on box n mod 2 (a known placement, not a hash's
        # chance): the split must find exactly that, from the boxes' own counters.
        first_turns = [next(t for t in turns if t["task"] == task) for task in agent["tasks"]]
        assert [t["backend"] for t in first_turns] == [backends[i % 2] for i in range(6)]
        assert [rows[u]["sessions"] for u in backends] == [3, 3]
        assert [rows[u]["served"] for u in backends] == [sum(1 for t in turns if t["backend"] == u) for u in backends]
        for row in rows.values():
            assert row["prefix_cache_hit_pct"] == pytest.approx(
                100 * row["prefix_cache_hits"] / row["prefix_cache_queries"]
            )
            assert 0 < row["prefix_cache_hit_pct"] < 100
        assert 0 < split["prefix_cache_hit_pct"] < 100
        # The session's own hit rate is read from the backends' summed counters (the router has none).
        assert agent["prefix_cache_hit_pct"] == pytest.approx(split["prefix_cache_hit_pct"])
        assert load_summary(tmp_path).agent.backends is not None  # type: ignore[union-attr]

        table = run_bench(
            "agent", router, tmp_path / "t", "--tasks", "2", "--system-tokens", "64", "--max-tokens", "16",
            backends=backends,
        )  # fmt: skip
        assert table.code == 0, table.stderr
        assert "per-backend split" in table.stdout and "2/2 on one box" in table.stdout


def test_run_through_the_router_splits_runs_over_the_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with stand_in_fleet(2) as (router, backends, handlers):
        for handler in handlers:
            handler.reset(token_gap_s=0.001)
        run = bench_json(
            "run", router, tmp_path, "--shapes", "64:8,128:8", "--runs", "6", "--no-plots", backends=backends
        )
        split = run["backends"]
        records = [r for shape in run["shapes"] for r in shape["runs"]]
        assert len({r["session_id"] for r in records}) == 12  # each run its own key: spread over the boxes
        assert split["requests"] == 12 and split["unattributed"] == 0
        rows = {row["url"]: row for row in split["backends"]}
        assert [rows[u]["requests"] for u in backends] == [_requests(h) for h in handlers]
        assert [rows[u]["requests"] for u in backends] == [6, 6], "12 keys, placed on the boxes in turn"
        assert [rows[u]["requests_pct"] for u in backends] == [pytest.approx(50), pytest.approx(50)]
        for url in backends:
            mine = [r for r in records if r["backend"] == url]
            assert len(mine) == rows[url]["requests"] == rows[url]["served"]
            assert rows[url]["prompt_tokens"] == sum(r["prompt_tokens"] for r in mine)
            assert rows[url]["generation_tokens"] == sum(r["completion_tokens"] for r in mine)
        # Per request, the engine's counters come from the box that served it: the timing check still runs.
        assert all(r["valid"] and r["metrics"]["server_requests"] == 1 for r in records)

        table = run_bench(
            "run", router, tmp_path / "t", "--shapes", "64:8", "--runs", "2", "--no-plots", backends=backends
        )
        assert table.code == 0, table.stderr
        assert "per-backend split" in table.stdout and backends[0] in table.stdout


@pytest.mark.parametrize(
    ("urls", "message"),
    [
        (["10.0.0.1:8000"], "not an http(s) URL"),
        (["http://10.0.0.1:8000/v1"], "without a path"),
        (["http://10.0.0.1:8000", "http://10.0.0.1:8000/"], "listed twice"),
        (["http://"], "--backend"),
    ],
)
def test_bad_backends_are_bad_input(urls: list[str], message: str) -> None:
    with pytest.raises(BadInput, match="--backend") as exc:
        parse_backends(urls)
    assert message in exc.value.message


def test_bad_or_unreachable_backends_exit_before_measuring(tmp_path: Path) -> None:
    with stand_in_fleet(1) as (router, backends, handlers):
        bad = run_bench("run", router, tmp_path, backends=["nope"])
        assert bad.code == 2 and "--backend 'nope' is not an http(s) URL" in bad.stderr
        gone = run_bench("run", router, tmp_path, "--shapes", "64:8", backends=[backends[0], "http://127.0.0.1:9"])
        assert gone.code == 3, gone.stderr
        assert "1 of 2 backends" in gone.stderr and "http://127.0.0.1:9" in gone.stderr
        assert _requests(handlers[0]) == 0 and not (tmp_path / "summary.json").exists()


def test_the_split_survives_a_backend_whose_counters_vanish() -> None:
    before = {"a": {"vllm:request_success_total": 1.0}, "b": {"vllm:request_success_total": 2.0}}
    after = {"a": {"vllm:request_success_total": 4.0}, "b": None}
    split = split_of(["a", "b"], before, after, ["a", "a", None], {"s": {"a"}}, errors={"b": "unreachable"})
    assert [row.requests for row in split.backends] == [3.0, None]
    assert split.backends[1].error == "unreachable" and split.requests is None
    assert split.unattributed == 1 and split.backends[0].served == 2
    assert json.loads(split.model_dump_json())["backends"][0]["requests_pct"] is None
