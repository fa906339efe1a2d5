"""`bench coherence`: three short prompts a working deployment answers correctly; each is its own gate.

- arithmetic: 17 x 23 must come back as 391;
- tool call: `get_weather` must be called with the asked city in its arguments;
- code with thinking off: the answer must contain `def is_prime`.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from glm53.bench.gates import GateResult
from glm53.bench.needle import JsonPoster

# Room for a probe's prompt in the context: the chat template, the question and the get_weather schema.
PROMPT_ALLOWANCE = 512
# The token budget per answer, thinking included (glm53.bench.settings.CoherenceSettings).
DEFAULT_MAX_TOKENS = 6144

WEATHER_CITY = "Lisbon"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


class ToolCallSeen(BaseModel):
    name: str
    arguments: str


class CoherenceResult(BaseModel):
    name: str
    prompt: str
    passed: bool
    reason: str | None = None
    answer: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallSeen] = Field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None


class CoherenceSection(BaseModel):
    max_tokens: int
    results: list[CoherenceResult]
    complete: bool = Field(True, description="False in a report written while prompts were still to come")

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)


@dataclass(frozen=True)
class _Probe:
    name: str
    prompt: str
    thinking: bool
    tools: bool
    judge: Callable[[str, list[ToolCallSeen]], str | None]  # None when it passes, else the reason


def _judge_arithmetic(answer: str, _: list[ToolCallSeen]) -> str | None:
    return None if re.search(r"(?<!\d)391(?!\d)", answer) else "the answer does not contain 391"


def _judge_weather(_: str, calls: list[ToolCallSeen]) -> str | None:
    weather = [call for call in calls if call.name == "get_weather"]
    if not weather:
        return "no get_weather tool call" + (f" (called: {', '.join(c.name for c in calls)})" if calls else "")
    for call in weather:
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            continue
        city = arguments.get("city") if isinstance(arguments, dict) else None
        if isinstance(city, str) and WEATHER_CITY.lower() in city.lower():
            return None
    return f"get_weather was called without city {WEATHER_CITY!r} in valid JSON arguments"


def _judge_code(answer: str, _: list[ToolCallSeen]) -> str | None:
    return None if "def is_prime" in answer else "the answer does not contain 'def is_prime'"


PROBES: tuple[_Probe, ...] = (
    _Probe("arithmetic", "What is 17 x 23? Reply with the number only.", True, False, _judge_arithmetic),
    _Probe(
        "tool-call",
        f"What is the weather in {WEATHER_CITY} right now? Use the tool.",
        True,
        True,
        _judge_weather,
    ),
    _Probe(
        "code-no-thinking",
        "Write a Python function is_prime(n) that returns True when n is a prime number. Reply with the code only.",
        False,
        False,
        _judge_code,
    ),
)


def run_coherence(
    client: JsonPoster,
    model: str,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    on_result: Callable[[CoherenceResult], None] | None = None,
    on_section: Callable[[CoherenceSection], None] | None = None,
) -> CoherenceSection:
    """Each probe in turn; `on_section` gets the section so far after each (`complete` False)."""
    results: list[CoherenceResult] = []
    for probe in PROBES:
        result = _ask(client, model, probe, max_tokens)
        results.append(result)
        if on_result is not None:
            on_result(result)
        if on_section is not None:
            on_section(CoherenceSection(max_tokens=max_tokens, results=results, complete=False))
    return CoherenceSection(max_tokens=max_tokens, results=results)


def _ask(client: JsonPoster, model: str, probe: _Probe, max_tokens: int) -> CoherenceResult:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": probe.prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_salt": secrets.token_hex(16),
        "chat_template_kwargs": {"enable_thinking": probe.thinking},
    }
    if probe.tools:
        body["tools"] = [WEATHER_TOOL]
        body["tool_choice"] = "auto"
    started = time.perf_counter()
    _, payload, error = client.post_json("/v1/chat/completions", body)
    latency = time.perf_counter() - started
    if error is not None:
        return CoherenceResult(name=probe.name, prompt=probe.prompt, passed=False, reason=error, latency_s=latency)
    try:
        return _judged(probe, payload, latency)
    except Exception as exc:  # an answer shaped like nothing expected: failed with the reason, never a crash
        reason = f"malformed answer: {type(exc).__name__}: {str(exc)[:200]}"
        return CoherenceResult(name=probe.name, prompt=probe.prompt, passed=False, reason=reason, latency_s=latency)


def _judged(probe: _Probe, payload: Any, latency: float) -> CoherenceResult:
    message, finish, completion_tokens = _message(payload)
    answer = str(message.get("content") or "")
    reasoning = str(message.get("reasoning") or message.get("reasoning_content") or "")
    listed = message.get("tool_calls")
    calls = [
        ToolCallSeen(name=str(fn.get("name", "")), arguments=str(fn.get("arguments") or ""))
        for call in (listed if isinstance(listed, list) else [])
        if isinstance(call, dict) and isinstance(fn := call.get("function"), dict)
    ]
    reason = probe.judge(answer, calls)
    return CoherenceResult(
        name=probe.name,
        prompt=probe.prompt,
        passed=reason is None,
        reason=reason,
        answer=answer,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=finish,
        completion_tokens=completion_tokens,
        latency_s=latency,
    )


def _message(payload: Any) -> tuple[dict[str, Any], str | None, int | None]:
    if not isinstance(payload, dict):
        return {}, None, None
    choices = payload.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = first.get("message")
    usage = payload.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(message, dict):
        message = {}
    finish = first.get("finish_reason")
    counted = isinstance(tokens, int) and not isinstance(tokens, bool) and 0 <= tokens < 2**53
    return message, (finish if isinstance(finish, str) else None), (tokens if counted else None)


def coherence_gates(section: CoherenceSection) -> list[GateResult]:
    """Every prompt is a gate of its own."""
    return [
        GateResult(
            name="coherence",
            subject=r.name,
            threshold=1.0,
            value=1.0 if r.passed else 0.0,
            passed=r.passed,
            detail="passed" if r.passed else (r.reason or "failed"),
        )
        for r in section.results
    ]
