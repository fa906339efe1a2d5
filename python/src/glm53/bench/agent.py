"""`bench agent`: scripted multi-turn tool-use sessions, as a coding agent drives the server.

Each turn resends the whole conversation (a growing shared prefix) with the tool results fed back, streamed,
so the report shows what agents feel: the prefix-cache hit rate from `/metrics`, the latency of tool-call
turns and the decode speed inside turns. When the model does not call a tool (or calls another one), the
script's call is recorded in the transcript instead, so every run has the same shape and the same prefixes.
One cache salt per invocation: sessions share the system prompt as real agents do, and nothing is reused
from earlier invocations.
"""

from __future__ import annotations

import json
import secrets
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, Field

from glm53.bench.gates import GateResult, maximum_gates, minimum_gates
from glm53.bench.metrics import MetricsDelta, diff_metrics, snapshot
from glm53.bench.prompts import PromptFactory
from glm53.bench.stream import StreamOutcome, decode_rate


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    key: {"type": "string", "description": text} for key, text in properties.items()
                },
                "required": list(properties),
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool("list_files", "List the files under a directory of the project.", path="directory, relative"),
    _tool("read_file", "Read a text file of the project.", path="file path, relative"),
    _tool("write_file", "Replace a file's content.", path="file path, relative", content="the new content"),
    _tool("run_tests", "Run the test suite, or one test file.", target="test path or 'all'"),
]

SYSTEM_INSTRUCTIONS = (
    "You are a careful software engineering agent working in a small Python project. Use the tools to "
    "inspect files, make the smallest correct change and run the tests. Call exactly one tool per turn."
)


@dataclass(frozen=True)
class Step:
    tool: str
    arguments: dict[str, str]
    result: str


@dataclass(frozen=True)
class Task:
    name: str
    request: str
    steps: tuple[Step, ...]


_INVENTORY = """def restock(items, counts):
    for name, count in counts.items():
        items[name] = items.get(name, 0) + count
    return items


def remove(items, name, count):
    items[name] = items[name] - count
    return items
"""

TASKS: tuple[Task, ...] = (
    Task(
        "fix-negative-stock",
        "The test test_remove_never_negative fails. Find out why and fix inventory.py.",
        (
            Step("list_files", {"path": "."}, "inventory.py\ntests/test_inventory.py\nREADME.md\n"),
            Step("read_file", {"path": "inventory.py"}, _INVENTORY),
            Step(
                "run_tests",
                {"target": "tests/test_inventory.py"},
                "FAILED tests/test_inventory.py::test_remove_never_negative - assert -2 == 0\n"
                "1 failed, 3 passed",
            ),
            Step(
                "write_file",
                {
                    "path": "inventory.py",
                    "content": _INVENTORY.replace(
                        "items[name] - count", "max(0, items.get(name, 0) - count)"
                    ),
                },
                "written 247 bytes",
            ),
            Step("run_tests", {"target": "all"}, "4 passed in 0.03s"),
        ),
    ),
    Task(
        "add-version-flag",
        "Add a --version flag to the command line entry point in cli.py that prints the package version.",
        (
            Step(
                "read_file",
                {"path": "cli.py"},
                "import argparse\n\n\ndef main(argv=None):\n"
                "    parser = argparse.ArgumentParser(prog='stock')\n"
                "    parser.add_argument('file')\n    args = parser.parse_args(argv)\n    print(args.file)\n",
            ),
            Step("read_file", {"path": "__init__.py"}, "__version__ = '1.4.2'\n"),
            Step(
                "write_file",
                {"path": "cli.py", "content": "(updated cli.py with --version)"},
                "written 412 bytes",
            ),
            Step("run_tests", {"target": "all"}, "5 passed in 0.04s"),
        ),
    ),
    Task(
        "explain-slow-test",
        "tests/test_report.py takes 40 seconds. Find the slow part and tell me what to change.",
        (
            Step(
                "run_tests",
                {"target": "tests/test_report.py"},
                "2 passed in 40.12s\nslowest: test_monthly 39.8s",
            ),
            Step(
                "read_file",
                {"path": "tests/test_report.py"},
                "import time\nfrom report import monthly\n\n\ndef test_monthly():\n    time.sleep(39)\n"
                "    assert monthly([1, 2, 3]) == 6\n",
            ),
            Step("list_files", {"path": "tests"}, "test_inventory.py\ntest_report.py\nconftest.py\n"),
        ),
    ),
)


class TurnRecord(BaseModel):
    task: str
    turn: int
    expected_tool: str
    model_tool_call: str | None = Field(None, description="the tool the model called, if any")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    decode_tok_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    metrics: MetricsDelta | None = None


class AgentSection(BaseModel):
    tasks: list[str]
    system_tokens: int
    max_tokens: int
    turns: list[TurnRecord]
    metrics: MetricsDelta | None = Field(None, description="/metrics counters over the whole session")
    prefix_cache_hit_pct: float | None = Field(None, description="prefix-cache hits / queries, in tokens, %")
    median_turn_latency_s: float | None = None
    median_tool_call_turn_latency_s: float | None = Field(
        None, description="median over turns in which the model itself called a tool"
    )
    mean_decode_tok_s: float | None = None
    model_tool_calls: int = 0


class ChatStreamer(Protocol):
    def stream(self, path: str, body: dict[str, Any]) -> StreamOutcome: ...
    def metrics_text(self) -> str | None: ...


def run_agent(
    client: ChatStreamer,
    prompts: PromptFactory,
    model: str,
    *,
    tasks: Sequence[Task] = TASKS,
    system_tokens: int = 2048,
    max_tokens: int = 1024,
    on_turn: Callable[[TurnRecord], None] | None = None,
) -> AgentSection:
    salt = secrets.token_hex(16)
    system, _ = prompts.haystack(system_tokens, insert=SYSTEM_INSTRUCTIONS, depth=0.0)
    start = snapshot(client)
    turns: list[TurnRecord] = []
    for task in tasks:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": task.request},
        ]
        for number, step in enumerate(task.steps, start=1):
            before = snapshot(client)
            body = {
                "model": model,
                "messages": messages,
                "tools": TOOLS,
                "tool_choice": "auto",
                "max_tokens": max_tokens,
                "temperature": 0,
                "cache_salt": salt,
                "stream_options": {"include_usage": True},
            }
            outcome = client.stream("/v1/chat/completions", body)
            record = _turn_record(task.name, number, step, outcome, diff_metrics(before, snapshot(client)))
            turns.append(record)
            if on_turn is not None:
                on_turn(record)
            messages.extend(_feed_back(task.name, number, step, outcome))
    total = diff_metrics(start, snapshot(client))
    return summarize(tasks, system_tokens, max_tokens, turns, total)


def summarize(
    tasks: Sequence[Task],
    system_tokens: int,
    max_tokens: int,
    turns: list[TurnRecord],
    total: MetricsDelta | None,
) -> AgentSection:
    ok = [t for t in turns if t.error is None and t.latency_s is not None]
    tool_turns = [t.latency_s for t in ok if t.model_tool_call and t.latency_s is not None]
    decodes = [t.decode_tok_s for t in ok if t.decode_tok_s is not None]
    rate = total.prefix_cache_hit_rate if total is not None else None
    return AgentSection(
        tasks=[task.name for task in tasks],
        system_tokens=system_tokens,
        max_tokens=max_tokens,
        turns=turns,
        metrics=total,
        prefix_cache_hit_pct=rate * 100.0 if rate is not None else None,
        median_turn_latency_s=statistics.median([t.latency_s for t in ok if t.latency_s is not None])
        if ok
        else None,
        median_tool_call_turn_latency_s=statistics.median(tool_turns) if tool_turns else None,
        mean_decode_tok_s=statistics.fmean(decodes) if decodes else None,
        model_tool_calls=sum(1 for t in turns if t.model_tool_call),
    )


def _turn_record(
    task: str, number: int, step: Step, outcome: StreamOutcome, delta: MetricsDelta | None
) -> TurnRecord:
    usage = outcome.usage
    decode = decode_rate(outcome)
    error = outcome.error or (None if usage else "no usage in the stream")
    return TurnRecord(
        task=task,
        turn=number,
        expected_tool=step.tool,
        model_tool_call=outcome.tool_calls[0].name if outcome.tool_calls else None,
        prompt_tokens=usage.prompt_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
        cached_tokens=usage.cached_tokens if usage else None,
        ttft_s=outcome.ttft_s,
        latency_s=outcome.end_s if outcome.error is None else None,
        decode_tok_s=decode,
        finish_reason=outcome.finish_reasons[0] if outcome.finish_reasons else None,
        error=error,
        metrics=delta,
    )


def _feed_back(task: str, number: int, step: Step, outcome: StreamOutcome) -> list[dict[str, Any]]:
    """The assistant's tool call and the scripted result, as the next turn's prefix."""
    call = outcome.tool_calls[0] if outcome.tool_calls else None
    if call is not None and call.name == step.tool and _json_object(call.arguments) is not None:
        call_id, name, arguments = call.call_id or f"call-{task}-{number}", call.name, call.arguments
        content = outcome.text
    else:
        call_id, name, arguments = f"call-{task}-{number}", step.tool, json.dumps(step.arguments)
        content = ""
    return [
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": step.result},
    ]


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


AGENT_FAIL_UNDER = {
    "cache-hit": "prefix-cache hit, % of prompt tokens",
    "decode": "mean decode tok/s in turns",
}
AGENT_FAIL_OVER = {"turn-latency": "median tool-call turn latency, in seconds"}


def agent_gates(section: AgentSection, under: dict[str, float], over: dict[str, float]) -> list[GateResult]:
    gates: list[GateResult] = []
    if "cache-hit" in under:
        gates += minimum_gates(
            "cache-hit", under["cache-hit"], [("session", section.prefix_cache_hit_pct)], "%"
        )
    if "decode" in under:
        gates += minimum_gates("decode", under["decode"], [("turns", section.mean_decode_tok_s)], "tok/s")
    if "turn-latency" in over:
        gates += maximum_gates(
            "turn-latency",
            over["turn-latency"],
            [("tool-call turns", section.median_tool_call_turn_latency_s)],
            "s",
        )
    return gates
