"""Turns the events of one OpenAI-style stream (completions or chat) into a timed, checked outcome.

The accumulator never raises: a malformed payload (bad JSON, nesting too deep, a number out of range, a field
of the wrong type), an event out of order, an error event, more token events than were asked for or a missing
`[DONE]` becomes the outcome's `error`, the first one seen, so one broken request cannot take a report down.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from glm53.errors import BadInput
from glm53.fsutil import parse_json

_DONE = b"[DONE]"
# Token counts in a usage object: non-negative integers below 2**53 (what a JSON number holds exactly). A float,
# a string, a boolean or 1e999 is a malformed usage, never a count.
_MAX_COUNT = 2**53


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None


class ToolCall(BaseModel):
    name: str
    arguments: str = ""
    call_id: str | None = None


class StreamOutcome(BaseModel):
    """What one streamed request produced; times are seconds from the request's start."""

    http_status: int | None = None
    error: str | None = Field(None, description="transport or protocol failure; None when the stream was clean")
    ttft_s: float | None = Field(None, description="request start -> first event carrying tokens")
    end_s: float | None = Field(None, description="request start -> end of the stream")
    token_events: int = 0
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reasons: list[str | None] = Field(default_factory=list)
    usage: Usage | None = None
    done: bool = False
    token_times_s: list[float] = Field(
        default_factory=list, repr=False, description="arrival time of every event carrying tokens"
    )


class StreamAccumulator:
    """Feed decoded SSE payloads with the time they arrived; read `outcome()` at the end.

    `max_token_events`: more events carrying tokens than this is a server that does not stop (each event
    carries one token at least, so a stream may not hold more events than the tokens asked for)."""

    def __init__(self, *, max_token_events: int | None = None) -> None:
        self._max_token_events = max_token_events
        self._token_times: list[float] = []
        self._error: str | None = None
        self._ttft: float | None = None
        self._token_events = 0
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tools: dict[int, dict[str, str]] = {}
        self._finish: dict[int, str | None] = {}
        self._usage: Usage | None = None
        self._done = False
        self._final_usage_seen = False

    def feed(self, payloads: Iterable[bytes], elapsed_s: float) -> None:
        for payload in payloads:
            if self._error is not None:
                return
            try:
                self._feed_one(payload.strip(), elapsed_s)
            except Exception as exc:
                # A field of an unexpected type somewhere deep in an event (TypeError, AttributeError), a number
                # out of range (OverflowError), nesting too deep (RecursionError): invalid, never a crash.
                self.fail(f"malformed event: {type(exc).__name__}: {str(exc)[:200]}")

    def fail(self, reason: str) -> None:
        if self._error is None:
            self._error = reason

    @property
    def failed(self) -> bool:
        return self._error is not None

    def outcome(self, *, end_s: float, http_status: int | None) -> StreamOutcome:
        if self._error is None and not self._done:
            self._error = "stream ended before [DONE] (the server closed the connection mid-stream)"
        indices = sorted(self._finish) if self._finish else []
        tool_calls = [
            ToolCall(name=call.get("name", ""), arguments=call.get("arguments", ""), call_id=call.get("id"))
            for _, call in sorted(self._tools.items())
        ]
        return StreamOutcome(
            http_status=http_status,
            error=self._error,
            ttft_s=self._ttft,
            end_s=end_s,
            token_events=self._token_events,
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            tool_calls=tool_calls,
            finish_reasons=[self._finish[i] for i in indices],
            usage=self._usage,
            done=self._done,
            token_times_s=self._token_times,
        )

    def _feed_one(self, payload: bytes, elapsed_s: float) -> None:
        if self._done:
            self.fail("event received after [DONE] (out of order)")
            return
        if payload == _DONE:
            self._done = True
            return
        try:
            event = parse_json(payload, what="event")
        except BadInput as exc:
            preview = payload[:80].decode("utf-8", "replace")
            self.fail(f"malformed event (not JSON): {exc.message[:160]}; it starts {preview!r}")
            return
        if not isinstance(event, dict):
            self.fail(f"malformed event (not an object): {type(event).__name__}")
            return
        if event.get("error"):
            self.fail(f"server error in stream: {_error_message(event['error'])}")
            return
        choices = event.get("choices") or []
        if not isinstance(choices, list):
            self.fail("malformed event: 'choices' is not a list")
            return
        if choices and self._final_usage_seen:
            self.fail("choice event received after the final usage event (out of order)")
            return
        carries_tokens = False
        for choice in choices:
            if not isinstance(choice, dict):
                self.fail("malformed event: a choice is not an object")
                return
            index = choice.get("index", 0)
            if not isinstance(index, int):
                self.fail("malformed event: choice index is not an integer")
                return
            if self._finish.get(index) is not None:
                self.fail(f"event for choice {index} after its finish reason (out of order)")
                return
            carries_tokens = self._take_choice(index, choice) or carries_tokens
        if carries_tokens:
            self._token_events += 1
            self._token_times.append(elapsed_s)
            if self._ttft is None:
                self._ttft = elapsed_s
            if self._max_token_events is not None and self._token_events > self._max_token_events:
                self.fail(
                    f"more than {self._max_token_events} events carrying tokens: the server did not stop at max_tokens"
                )
                return
        usage = event.get("usage")
        if usage:
            self._take_usage(usage, final=not choices)

    def _take_choice(self, index: int, choice: dict[str, Any]) -> bool:
        carries = False
        if "text" in choice:
            # Completions: vLLM sends a choice only for new tokens; its text may be empty while a
            # multi-byte character is still incomplete, yet the token arrived.
            self._text.append(str(choice.get("text") or ""))
            carries = True
        delta = choice.get("delta")
        if isinstance(delta, dict):
            carries = self._take_delta(delta) or carries
        if choice.get("token_ids"):
            carries = True
        self._finish[index] = choice.get("finish_reason")
        return carries

    def _take_delta(self, delta: dict[str, Any]) -> bool:
        carries = False
        content = delta.get("content")
        if content:
            self._text.append(str(content))
            carries = True
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            self._reasoning.append(str(reasoning))
            carries = True
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            carries = True
            slot = self._tools.setdefault(int(call.get("index", 0) or 0), {})
            if call.get("id"):
                slot["id"] = str(call["id"])
            function = call.get("function") or {}
            if function.get("name"):
                slot["name"] = slot.get("name", "") + str(function["name"])
            if function.get("arguments"):
                slot["arguments"] = slot.get("arguments", "") + str(function["arguments"])
        return carries

    def _take_usage(self, usage: Any, *, final: bool) -> None:
        if not isinstance(usage, dict):
            self.fail("malformed event: 'usage' is not an object")
            return
        if final and not self._finish:
            self.fail("usage arrived before any token or finish reason (out of order)")
            return
        if final and any(reason is None for reason in self._finish.values()):
            self.fail("final usage arrived before every choice finished (out of order)")
            return
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        if prompt is None or completion is None or (cached is not None and _count(cached) is None):
            self.fail(f"malformed usage: {_preview(usage)}")
            return
        self._usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=_count(cached))
        self._final_usage_seen = self._final_usage_seen or final


def prefill_rate(outcome: StreamOutcome) -> float | None:
    """prompt tokens / TTFT."""
    if outcome.usage is None or not outcome.ttft_s:
        return None
    return outcome.usage.prompt_tokens / outcome.ttft_s


def decode_rate(outcome: StreamOutcome) -> float | None:
    """(completion tokens - 1) / (end - first token time): the first token belongs to prefill."""
    usage, first, end = outcome.usage, outcome.ttft_s, outcome.end_s
    if usage is None or first is None or end is None or end <= first or usage.completion_tokens < 2:
        return None
    return (usage.completion_tokens - 1) / (end - first)


def _count(value: Any) -> int | None:
    """A token count, or None when `value` is not one (bool, float, string, negative, 1e999, 10**20)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_COUNT:
        return value
    return None


def _preview(value: Any) -> str:
    try:
        return json.dumps(value)[:120]
    except (ValueError, TypeError, RecursionError):
        return repr(value)[:120]


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    return str(error)[:300]
