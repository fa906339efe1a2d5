"""`bench agent`: the packaged task script, the session loop, and the command against a local fake server."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import pytest

from glm53.bench.agent import AgentScript, load_script, parse_script, run_agent, scripted_tokens
from glm53.bench.prompts import PromptFactory
from glm53.bench.report import load_summary
from glm53.bench.stream import StreamOutcome, ToolCall, Usage
from glm53.errors import BadInput
from tests.support.bench_fixtures import TokenizingHandler, serve_http
from tests.support.cli import run_bench


def _packaged_raw() -> dict[str, Any]:
    text = resources.files("glm53").joinpath("data/agent-tasks.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    assert isinstance(raw, dict)
    return raw


def test_the_packaged_script_has_fifteen_distinct_multi_turn_tasks() -> None:
    script = load_script()
    assert len(script.tasks) == 15
    assert len({task.name for task in script.tasks}) == 15
    assert len({task.request for task in script.tasks}) == 15
    assert all(len(task.steps) >= 2 for task in script.tasks), "every task is multi-turn"
    used = {step.tool for task in script.tasks for step in task.steps}
    declared = {tool.name for tool in script.tools}
    assert used == declared, "every tool offered is exercised by some task"
    assert {"read_file", "search_code", "calculator", "get_weather", "run_shell", "web_search"} <= used
    # The sessions are varied: no two tasks call the same sequence of tools.
    assert len({tuple(step.tool for step in task.steps) for task in script.tasks}) == 15
    assert script.turns == sum(len(task.steps) for task in script.tasks)
    for task in script.tasks:
        for step in task.steps:
            assert step.result.strip(), f"{task.name}: every step feeds a result back"
            if step.tool == "write_file":
                assert step.result == f"written {len(step.arguments['content'].encode())} bytes"


def test_tools_are_sent_as_openai_function_schemas() -> None:
    schemas = load_script().tool_schemas()
    weather = next(s for s in schemas if s["function"]["name"] == "get_weather")
    assert weather["type"] == "function"
    parameters = weather["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["city", "unit"]
    assert all(p["type"] == "string" and p["description"] for p in parameters["properties"].values())


def test_first_cuts_the_script_or_names_the_flag() -> None:
    script = load_script()
    assert [t.name for t in script.first(3).tasks] == [t.name for t in script.tasks[:3]]
    assert script.first(3).tools == script.tools
    for bad in (0, 16):
        with pytest.raises(BadInput, match=f"--tasks {bad}: there are 15 scripted tasks"):
            script.first(bad)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda raw: raw.update(schema_version="glm53.agent-tasks/9"), "schema_version"),
        (lambda raw: raw["tasks"][0]["steps"][0].update(tool="teleport"), "unknown tool 'teleport'"),
        (
            lambda raw: raw["tasks"][0]["steps"][0].update(arguments={"dir": "."}),
            "are not list_files's parameters",
        ),
        (lambda raw: raw["tasks"][1].update(name=raw["tasks"][0]["name"]), "task names must be distinct"),
        (lambda raw: raw["tasks"][0].update(steps=[]), "tasks.0.steps"),
        (lambda raw: raw["tools"][0].update(name="list files"), "tools.0.name"),
    ],
)
def test_a_broken_task_file_is_refused_naming_the_field(mutate: Any, message: str, tmp_path: Path) -> None:
    raw = copy.deepcopy(_packaged_raw())
    mutate(raw)
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(BadInput, match=message) as info:
        load_script(path)
    assert str(path) in info.value.message
    with pytest.raises(BadInput, match="top level"):
        parse_script([raw], source="list.json")


class _Tokenizer:
    def tokenize(self, model: str, text: str) -> list[int]:
        return [ord(c) % 251 + 1 for c in text]


class _FakeChat:
    """Answers each turn with a tool call (the expected one on even requests, `calculator` on odd ones) and
    counts prompt characters as prefix-cache queries, the part shared with the previous request as hits."""

    def __init__(self, script: AgentScript) -> None:
        self.expected = [step for task in script.tasks for step in task.steps]
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.queries = 0.0
        self.hits = 0.0
        self._previous = ""

    def stream(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> StreamOutcome:
        assert path == "/v1/chat/completions"
        self.bodies.append(copy.deepcopy(body))
        self.headers.append(dict(headers or {}))
        prompt = json.dumps(body["messages"])
        shared = next(
            (i for i, (a, b) in enumerate(zip(prompt, self._previous, strict=False)) if a != b),
            min(len(prompt), len(self._previous)),
        )
        self.queries += len(prompt)
        self.hits += shared
        self._previous = prompt
        step = self.expected[len(self.bodies) - 1]
        if len(self.bodies) % 2:
            call = ToolCall(name="calculator", arguments='{"expression": "1+1"}', call_id="model-odd")
        else:
            call = ToolCall(name=step.tool, arguments=json.dumps(step.arguments), call_id="model-even")
        return StreamOutcome(
            http_status=200,
            ttft_s=0.1,
            end_s=0.5,
            token_events=5,
            tool_calls=[call],
            finish_reasons=["tool_calls"],
            usage=Usage(prompt_tokens=len(prompt), completion_tokens=9),
            done=True,
        )

    def metrics_text(self) -> str:
        return (
            f'vllm:prefix_cache_queries_total{{engine="0"}} {self.queries}\n'
            f'vllm:prefix_cache_hits_total{{engine="0"}} {self.hits}\n'
        )


def test_sessions_grow_their_prefix_and_feed_back_the_scripted_results() -> None:
    script = load_script().first(3)
    fake = _FakeChat(script)
    seen: list[int] = []
    section = run_agent(
        fake,
        PromptFactory(_Tokenizer(), "m"),
        "m",
        script=script,
        system_tokens=64,
        max_tokens=16,
        on_turn=lambda t: seen.append(t.turn),
    )
    assert len(fake.bodies) == script.turns == len(section.turns) == len(seen)
    assert section.tasks == [task.name for task in script.tasks]
    assert len({body["cache_salt"] for body in fake.bodies}) == 1, "one salt per invocation"
    assert all(body["return_token_ids"] is True and body["stream_options"]["include_usage"] for body in fake.bodies)
    assert all(body["tools"] == script.tool_schemas() for body in fake.bodies)
    systems = {body["messages"][0]["content"] for body in fake.bodies}
    assert len(systems) == 1 and script.system_instructions in systems.pop()
    first_task = fake.bodies[: len(script.tasks[0].steps)]
    lengths = [len(body["messages"]) for body in first_task]
    assert lengths == list(range(2, 2 + 2 * len(first_task), 2)), "each turn adds a call and its result"
    last = first_task[-1]["messages"]
    results = [m["content"] for m in last if m["role"] == "tool"]
    assert results == [step.result for step in script.tasks[0].steps[:-1]]
    calls = [m["tool_calls"][0] for m in last if m["role"] == "assistant"]
    # The model's own call is kept when it is the expected tool (even requests), the script's otherwise.
    assert [c["id"].startswith("model-") for c in calls] == [False, True, False, True]
    assert [c["function"]["name"] for c in calls] == [s.tool for s in script.tasks[0].steps[:-1]]
    second_task_start = fake.bodies[len(first_task)]["messages"]
    assert [m["role"] for m in second_task_start] == ["system", "user"], "each task starts afresh"
    assert section.model_tool_calls == script.turns
    assert section.median_tool_call_turn_latency_s == 0.5
    assert section.mean_decode_tok_s == pytest.approx(8 / 0.4)
    assert section.prefix_cache_hit_pct == pytest.approx(100 * fake.hits / fake.queries)
    assert 0 < section.prefix_cache_hit_pct < 100
    # One stable X-Session-ID per conversation (a router's consistent_hash key), a different one per task.
    keys = [h["X-Session-ID"] for h in fake.headers]
    starts = [sum(len(t.steps) for t in script.tasks[:i]) for i in range(len(script.tasks))]
    per_task = [keys[s : s + len(t.steps)] for s, t in zip(starts, script.tasks, strict=True)]
    assert all(len(set(k)) == 1 for k in per_task) and len({k[0] for k in per_task}) == len(script.tasks)
    assert [t.session_id for t in section.turns] == keys


class _ChatHandler(TokenizingHandler):
    """A minimal OpenAI-compatible server: every chat turn streams a `list_files` call and its usage."""

    model = "fake-agent"
    max_model_len = 8192
    requests = 0
    prompt_chars = 0
    refuse = False
    other_posts: ClassVar[list[str]] = []

    def get(self) -> None:
        cls = type(self)
        if self.path == "/metrics":
            text = (
                f"vllm:prefix_cache_queries_total {cls.prompt_chars}\n"
                f"vllm:prefix_cache_hits_total {cls.prompt_chars // 2}\n"
            )
            self._send(200, text.encode(), "text/plain")
        else:
            super().get()

    def post(self, body: Any) -> None:
        if self.path != "/v1/chat/completions":  # vLLM has no /finish_session: that is the router's
            cls = type(self)
            cls.other_posts.append(self.path)
            self._send(404, b'{"detail":"Not Found"}')
            return
        cls = type(self)
        cls.requests += 1
        if cls.refuse:
            error = {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}}
            self._send(400, json.dumps(error).encode())
            return
        prompt = len(json.dumps(body["messages"]))
        cls.prompt_chars += prompt
        call = {"index": 0, "id": f"c{cls.requests}", "function": {"name": "list_files", "arguments": '{"path": "."}'}}
        events = [
            {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": 12}},
        ]
        self._send_events(events)


@pytest.fixture
def chat_server() -> Iterator[str]:
    _ChatHandler.requests, _ChatHandler.prompt_chars, _ChatHandler.max_model_len = 0, 0, 8192
    _ChatHandler.refuse, _ChatHandler.other_posts = False, []
    with serve_http(_ChatHandler) as url:
        yield url


def _agent(url: str, out: Path, *extra: str) -> Any:
    return run_bench("agent", url, out, "--system-tokens", "64", "--max-tokens", "16", "--json", *extra)


def test_agent_runs_all_fifteen_tasks_by_default(chat_server: str, tmp_path: Path) -> None:
    result = _agent(chat_server, tmp_path, "--fail-under", "cache-hit=40")
    assert result.code == 0, result.stderr
    agent = result.json()["agent"]
    script = load_script()
    assert agent["tasks"] == [task.name for task in script.tasks]
    assert len(agent["turns"]) == script.turns == _ChatHandler.requests
    assert [t["expected_tool"] for t in agent["turns"]] == [step.tool for task in script.tasks for step in task.steps]
    assert all(t["error"] is None and t["model_tool_call"] == "list_files" for t in agent["turns"])
    assert agent["prefix_cache_hit_pct"] == pytest.approx(50, abs=0.1)
    # Each conversation is closed on a router after its last turn; a plain server answers 404 and nothing fails.
    sessions = sorted({t["session_id"] for t in agent["turns"]})
    assert sorted(p.split("session_id=")[1] for p in _ChatHandler.other_posts) == sessions
    assert len(sessions) == 15 and agent["sessions_finished"] == 0
    summary = load_summary(tmp_path)
    assert summary.agent is not None and len(summary.agent.tasks) == 15
    assert [(g.name, g.passed) for g in summary.gates["agent"]] == [("cache-hit", True)]


def test_tasks_option_runs_the_first_n(chat_server: str, tmp_path: Path) -> None:
    result = _agent(chat_server, tmp_path, "--tasks", "2")
    assert result.code == 0, result.stderr
    agent = result.json()["agent"]
    first_two = load_script().tasks[:2]
    assert agent["tasks"] == [task.name for task in first_two]
    assert len(agent["turns"]) == sum(len(task.steps) for task in first_two)


def test_bad_tasks_and_budgets_are_refused_before_any_turn(chat_server: str, tmp_path: Path) -> None:
    too_many = _agent(chat_server, tmp_path, "--tasks", "16")
    assert too_many.code == 2 and "--tasks 16: there are 15 scripted tasks" in too_many.stderr
    none = _agent(chat_server, tmp_path, "--tasks", "0")
    assert none.code == 2
    _ChatHandler.max_model_len = 64
    no_room = _agent(chat_server, tmp_path, "--tasks", "1")
    assert no_room.code == 2 and "max_model_len is 64" in no_room.stderr
    assert "serve with a larger MAX_MODEL_LEN" in no_room.stderr
    # The conversation itself counts, not only the system prompt and the answer (this server's tokens are
    # characters): the defaults on a 4,096-token server would see every turn refused with HTTP 400.
    scripted = scripted_tokens(load_script().first(1), len)
    _ChatHandler.max_model_len = scripted + 64 + 16 - 1
    tight = _agent(chat_server, tmp_path, "--tasks", "1")
    assert tight.code == 2 and f"+ {scripted} tokens of the scripted conversation" in tight.stderr, tight.stderr
    assert f"need {scripted + 80} tokens of context" in tight.stderr
    assert "pass --system-tokens 63 or less" in tight.stderr
    assert _ChatHandler.requests == 0 and not (tmp_path / "summary.json").exists()
    _ChatHandler.max_model_len = scripted + 64 + 16
    assert _agent(chat_server, tmp_path, "--tasks", "1").code == 0


def test_a_session_in_which_no_turn_completes_is_exit_1_with_the_report(chat_server: str, tmp_path: Path) -> None:
    _ChatHandler.refuse = True
    result = _agent(chat_server, tmp_path, "--tasks", "2")
    assert result.code == 1
    turns = sum(len(task.steps) for task in load_script().tasks[:2])
    assert f"agent: none of the {turns} turns completed (first error: HTTP 400:" in result.stderr
    summary = load_summary(tmp_path)
    assert summary.agent is not None and len(summary.agent.turns) == turns == _ChatHandler.requests
    assert all(t.error is not None and t.error.startswith("HTTP 400") for t in summary.agent.turns)
    assert summary.agent.median_turn_latency_s is None and summary.agent.prefix_cache_hit_pct is None
