"""`bench agent`: scripted multi-turn tool-use sessions, as an agent drives the server.

The tasks, the tools and the scripted tool results are data (`glm53/data/agent-tasks.json`): fifteen
sessions, as in the recipe's agent benchmark, mixing code edits, shell, search, database, web, weather,
time and calculator tools. Each turn resends the whole conversation (a growing shared prefix) with the tool
results fed back, streamed, so the report shows what agents feel: the prefix-cache hit rate from
`/metrics`, the latency of tool-call turns and the decode speed inside turns. When the model does not call
a tool (or calls another one), the script's call is recorded in the transcript instead, so every run has
the same shape and the same prefixes. One cache salt per invocation: sessions share the system prompt and
the tool list as real agents do, and nothing is reused from earlier invocations.
"""

from __future__ import annotations

import functools
import json
import secrets
import statistics
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from glm53.bench.backends import FleetSplit
from glm53.bench.gates import GateResult, maximum_gates, minimum_gates
from glm53.bench.metrics import MetricsDelta, delta_after, diff_metrics, snapshot
from glm53.bench.prompts import PromptFactory
from glm53.bench.stream import StreamOutcome, decode_rate
from glm53.bench.timing import TimingSource, settle_timing
from glm53.errors import BadInput, CheckFailed, invalid_document
from glm53.fsutil import read_json

TASKS_SCHEMA: Literal["glm53.agent-tasks/1"] = "glm53.agent-tasks/1"
TASKS_RESOURCE = "data/agent-tasks.json"
# The shared system prompt's size and the budget per turn, in tokens (glm53.bench.settings.AgentSettings).
DEFAULT_SYSTEM_TOKENS = 2048
DEFAULT_MAX_TOKENS = 1024
SESSION_HEADER = "X-Session-ID"


class ToolSpec(BaseModel):
    """A tool offered to the model: every parameter is a required string, described for the model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    description: str = Field(min_length=1)
    parameters: dict[str, str] = Field(min_length=1, description="parameter name -> description")

    def openai_tool(self) -> dict[str, Any]:
        """The OpenAI `tools` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        key: {"type": "string", "description": text} for key, text in self.parameters.items()
                    },
                    "required": list(self.parameters),
                },
            },
        }


class Step(BaseModel):
    """One turn: the tool call the script expects, and the result fed back whatever the model did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    arguments: dict[str, str]
    result: str


class Task(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    request: str = Field(min_length=1)
    steps: tuple[Step, ...] = Field(min_length=1)


class AgentScript(BaseModel):
    """The packaged tasks (`glm53/data/agent-tasks.json`): every task is sent with every tool, so the system
    prompt and the tool list are the prefix all sessions share."""

    model_config = ConfigDict(frozen=True)

    schema_version: Literal["glm53.agent-tasks/1"]
    about: str = ""
    system_instructions: str = Field(min_length=1)
    tools: tuple[ToolSpec, ...] = Field(min_length=1)
    tasks: tuple[Task, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> AgentScript:
        for kind, names in (("tool", [t.name for t in self.tools]), ("task", [t.name for t in self.tasks])):
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                raise ValueError(f"{kind} names must be distinct: {', '.join(repeated)} repeated")
        tools = {tool.name: tool for tool in self.tools}
        for task in self.tasks:
            for number, step in enumerate(task.steps, start=1):
                where = f"task {task.name!r} step {number}"
                if step.tool not in tools:
                    raise ValueError(f"{where}: unknown tool {step.tool!r}")
                if set(step.arguments) != set(tools[step.tool].parameters):
                    raise ValueError(
                        f"{where}: arguments {sorted(step.arguments)} are not {step.tool}'s parameters "
                        f"{sorted(tools[step.tool].parameters)}"
                    )
        return self

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [tool.openai_tool() for tool in self.tools]

    def first(self, count: int) -> AgentScript:
        """The script cut to its first `count` tasks (the --tasks option)."""
        if not 1 <= count <= len(self.tasks):
            raise BadInput(
                f"--tasks {count}: there are {len(self.tasks)} scripted tasks",
                fix=f"pass --tasks between 1 and {len(self.tasks)}",
            )
        return self.model_copy(update={"tasks": self.tasks[:count]})

    @property
    def turns(self) -> int:
        return sum(len(task.steps) for task in self.tasks)


def parse_script(raw: Any, *, source: str) -> AgentScript:
    """Validate a task file's JSON; errors name the file and the field."""
    if isinstance(raw, dict) and raw.get("schema_version") != TASKS_SCHEMA:
        raise BadInput(
            f"{source}: schema_version {raw.get('schema_version')!r} is not {TASKS_SCHEMA!r}",
            fix="the file is not an agent task file this version of glm53 reads",
        )
    try:
        return AgentScript.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, source, fix="fix the agent task file") from exc


def load_script(path: Path | None = None) -> AgentScript:
    """The tasks from `path`, or the packaged ones."""
    if path is not None:
        return parse_script(read_json(path, what="agent task file"), source=str(path))
    return _packaged_script()


@functools.cache
def _packaged_script() -> AgentScript:
    raw = resources.files("glm53").joinpath(TASKS_RESOURCE).read_text(encoding="utf-8")
    return parse_script(json.loads(raw), source=f"glm53/{TASKS_RESOURCE}")


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
    decode_rejected: str | None = Field(
        None,
        description="why this turn's decode rate is left out of the session's (timing neither the client nor the "
        "engine's /metrics can vouch for)",
    )
    decode_source: TimingSource | None = Field(
        None, description="whose clock decode_tok_s comes from: 'client', or 'server' (the engine's /metrics)"
    )
    session_id: str | None = Field(None, description="the X-Session-ID header sent: one per conversation")
    backend: str | None = Field(None, description="the backend that served it (--backend), from its /metrics")


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
    median_decode_tok_s: float | None = None
    model_tool_calls: int = 0
    complete: bool = Field(True, description="False in a report written while turns were still to come")
    backends: FleetSplit | None = Field(None, description="per-backend split through a router (--backend)")
    sessions_finished: int = Field(
        0,
        description="conversations closed with the router's POST /finish_session after their last turn (0 when "
        "the server is not a vllm-router)",
    )


class ChatStreamer(Protocol):
    def stream(self, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> StreamOutcome: ...
    def metrics_text(self) -> str | None: ...


@runtime_checkable
class SessionCloser(Protocol):
    """A client that can close a conversation on the router (glm53.bench.client.BenchClient)."""

    def finish_session(self, session_id: str) -> bool: ...


# What a chat template adds around each message (role markers, separators), counted generously.
MESSAGE_OVERHEAD_TOKENS = 8


def scripted_tokens(script: AgentScript, count: Callable[[str], int]) -> int:
    """Tokens of the longest conversation's last turn besides the system prompt, as `count` tokenizes text:
    the tool list, the task's request and every earlier step's tool call and result (the model's own words,
    unknown before it answers, are not counted: a lower bound on what the last turn sends)."""
    tools = count(json.dumps(script.tool_schemas()))
    longest = 0
    for task in script.tasks:
        earlier = task.steps[:-1]
        text = task.request + "".join(step.tool + json.dumps(step.arguments) + step.result for step in earlier)
        messages = 2 + 2 * len(earlier)
        longest = max(longest, count(text) + messages * MESSAGE_OVERHEAD_TOKENS)
    return tools + longest


def check_fits(system_tokens: int, max_tokens: int, max_model_len: int | None, scripted: int = 0) -> None:
    """Every turn must fit the server's context: the shared system prompt, the conversation so far (at least
    `scripted` tokens by its last turn, see `scripted_tokens`) and the turn's answer budget; else every turn
    would be refused with HTTP 400."""
    if max_model_len is None:
        return
    needed = system_tokens + scripted + max_tokens
    if needed <= max_model_len:
        return
    room = max_model_len - scripted
    if room - max_tokens >= 0:
        fix = f"pass --system-tokens {room - max_tokens} or less"
    elif room >= 64:
        answer = max(2, min(max_tokens, room // 4))
        fix = f"e.g. --system-tokens {room - answer} --max-tokens {answer}"
    else:
        fix = "serve with a larger MAX_MODEL_LEN, or pass fewer --tasks"
    raise BadInput(
        f"--system-tokens {system_tokens} + --max-tokens {max_tokens} + {scripted} tokens of the scripted "
        f"conversation (tools, requests, earlier calls and results) need {needed} tokens of context; the "
        f"server's max_model_len is {max_model_len}",
        fix=fix,
    )


def run_agent(
    client: ChatStreamer,
    prompts: PromptFactory,
    model: str,
    *,
    script: AgentScript | None = None,
    system_tokens: int = DEFAULT_SYSTEM_TOKENS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    on_turn: Callable[[TurnRecord], None] | None = None,
    on_section: Callable[[AgentSection], None] | None = None,
) -> AgentSection:
    """Every task of `script` (default: the packaged tasks) in order, one streamed request per step;
    `on_section` gets the session so far after each turn (`complete` False)."""
    script = script if script is not None else load_script()
    tools = script.tool_schemas()
    salt = secrets.token_hex(16)
    system, _ = prompts.haystack(system_tokens, insert=script.system_instructions, depth=0.0)
    start = snapshot(client)
    turns: list[TurnRecord] = []
    finished = 0
    for task in script.tasks:
        # One stable key per conversation: a router's sticky policy keeps all its turns on the box that holds
        # its prefix in cache (without the header a request is placed alone).
        session_id = f"glm53-bench-agent-{salt[:16]}-{task.name}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": task.request},
        ]
        for number, step in enumerate(task.steps, start=1):
            before = snapshot(client)
            body = {
                "model": model,
                "messages": messages,
                "tools": tools,
                "tool_choice": "auto",
                "max_tokens": max_tokens,
                "temperature": 0,
                "cache_salt": salt,
                "stream_options": {"include_usage": True},
                # vLLM then streams every generated token's id, even while the tool-call parser holds the
                # text of a call back until it is complete: TTFT and decode speed are timed per token.
                "return_token_ids": True,
            }
            outcome = client.stream("/v1/chat/completions", body, headers={SESSION_HEADER: session_id})
            after, delta = delta_after(client, before, finished=outcome.error is None and outcome.done)
            record = _turn_record(task.name, number, step, outcome, delta)
            record.session_id = session_id
            turns.append(record)
            if on_turn is not None:
                on_turn(record)
            if on_section is not None:
                partial = summarize(
                    script.tasks, system_tokens, max_tokens, turns, diff_metrics(start, after), complete=False
                )
                on_section(partial)
            messages.extend(_feed_back(task.name, number, step, outcome))
        # The conversation is over: a router running sticky_least_loaded stops counting it on its box (else it
        # counts for two idle hours, and new sessions are placed as if it were still there).
        if isinstance(client, SessionCloser) and client.finish_session(session_id):
            finished += 1
    total = diff_metrics(start, snapshot(client))
    section = summarize(script.tasks, system_tokens, max_tokens, turns, total)
    section.sessions_finished = finished
    return section


def summarize(
    tasks: Sequence[Task],
    system_tokens: int,
    max_tokens: int,
    turns: list[TurnRecord],
    total: MetricsDelta | None,
    *,
    complete: bool = True,
) -> AgentSection:
    ok = [t for t in turns if t.error is None and t.latency_s is not None]
    tool_turns = [t.latency_s for t in ok if t.model_tool_call and t.latency_s is not None]
    decodes = [t.decode_tok_s for t in ok if t.decode_tok_s is not None and t.decode_rejected is None]
    rate = total.prefix_cache_hit_rate if total is not None else None
    return AgentSection(
        tasks=[task.name for task in tasks],
        system_tokens=system_tokens,
        max_tokens=max_tokens,
        turns=turns,
        metrics=total,
        prefix_cache_hit_pct=rate * 100.0 if rate is not None else None,
        median_turn_latency_s=statistics.median([t.latency_s for t in ok if t.latency_s is not None]) if ok else None,
        median_tool_call_turn_latency_s=statistics.median(tool_turns) if tool_turns else None,
        mean_decode_tok_s=statistics.fmean(decodes) if decodes else None,
        median_decode_tok_s=statistics.median(decodes) if decodes else None,
        model_tool_calls=sum(1 for t in turns if t.model_tool_call),
        complete=complete,
    )


def _turn_record(task: str, number: int, step: Step, outcome: StreamOutcome, delta: MetricsDelta | None) -> TurnRecord:
    usage = outcome.usage
    decode = decode_rate(outcome)
    error = outcome.error or (None if usage else "no usage in the stream")
    # A stream the client cannot time (coalesced by a busy engine, buffered by a proxy) is timed by the engine's
    # own /metrics when they show this turn alone; a turn neither can vouch for leaves the session's rate.
    verdict = settle_timing(outcome, delta) if error is None else None
    if verdict is not None and verdict.source == "server" and verdict.engine is not None:
        decode = verdict.engine.decode_tok_s
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
        decode_rejected=verdict.rejected if verdict is not None else None,
        decode_source=verdict.source if verdict is not None and decode is not None else None,
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
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
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
        gates += minimum_gates("cache-hit", under["cache-hit"], [("session", section.prefix_cache_hit_pct)], "%")
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


def require_completed_turns(section: AgentSection, report: Path) -> None:
    """Exit 1 (CheckFailed) when no turn completed: the session measured nothing, whatever the gates."""
    if not any(turn.error is None for turn in section.turns):
        first = section.turns[0].error if section.turns else "no turn ran"
        raise CheckFailed(
            f"agent: none of the {len(section.turns)} turns completed (first error: {first})",
            fix=f"each turn's error is in {report}",
        )
