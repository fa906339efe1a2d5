"""`bench needle`: an exact-JSON record hidden at several depths of long prompts, asked back verbatim.

A depth passes only when the answer holds a JSON object equal to the hidden one; the answer is kept either
way, so a failing report shows what the model said.
"""

from __future__ import annotations

import json
import random
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from glm53.bench.gates import GateResult, minimum_gates
from glm53.bench.prompts import PromptFactory
from glm53.errors import BadInput

# What `bench needle` asks by default (glm53.bench.settings.NeedleSettings): prompt sizes, needle depths and the
# answer budget per question.
DEFAULT_SIZES: tuple[int, ...] = (32_768, 131_072, 260_096)
DEFAULT_DEPTHS: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)
DEFAULT_MAX_TOKENS = 96
_WORDS = ("amber", "cobalt", "fennel", "granite", "harbor", "juniper", "lumen", "meadow", "quartz", "saffron")
# Room for the chat template around the user message; the usage in the answer gives the exact count.
_TEMPLATE_ALLOWANCE = 64
# No served model has a context this long; a larger size is a typo that would fill memory building the haystack.
MAX_SIZE_TOKENS = 10_000_000
MIN_SIZE_TOKENS = 128


class NeedleResult(BaseModel):
    size_tokens: int
    depth: float
    prompt_tokens: int | None = Field(None, description="as the server counted them")
    expected: dict[str, Any]
    answer: str
    passed: bool
    reason: str | None = None
    latency_s: float | None = None


class NeedleSection(BaseModel):
    sizes: list[int]
    depths: list[float]
    max_tokens: int
    results: list[NeedleResult]
    complete: bool = Field(True, description="False in a report written while depths were still to come")

    @property
    def pass_rate(self) -> float:
        return sum(r.passed for r in self.results) / len(self.results) if self.results else 0.0


class JsonPoster(Protocol):
    def post_json(self, path: str, body: dict[str, Any]) -> tuple[int | None, Any, str | None]: ...


def format_sizes(sizes: Sequence[int]) -> str:
    """(32768, 131072) -> '32768,131072' (what parse_sizes reads back)."""
    return ",".join(str(size) for size in sizes)


def format_depths(depths: Sequence[float]) -> str:
    """(0.05, 0.5) -> '0.05,0.5' (what parse_depths reads back)."""
    return ",".join(f"{depth:g}" for depth in depths)


def parse_sizes(spec: str, *, flag: str = "--sizes") -> list[int]:
    example = f"e.g. {flag} {format_sizes(DEFAULT_SIZES)}"
    try:
        sizes = [int(part.replace("_", "")) for part in spec.split(",") if part.strip()]
    except ValueError as exc:
        raise BadInput(f"{flag}: {spec!r} is not a comma-separated list of token counts", fix=example) from exc
    if not sizes or any(not MIN_SIZE_TOKENS <= size <= MAX_SIZE_TOKENS for size in sizes):
        raise BadInput(
            f"{flag}: every size must be between {MIN_SIZE_TOKENS} and {MAX_SIZE_TOKENS:,} tokens", fix=example
        )
    return sizes


def parse_depths(spec: str, *, flag: str = "--depths") -> list[float]:
    example = f"e.g. {flag} {format_depths(DEFAULT_DEPTHS)}"
    try:
        depths = [float(part) for part in spec.split(",") if part.strip()]
    except ValueError as exc:
        raise BadInput(f"{flag}: {spec!r} is not a comma-separated list of numbers", fix=example) from exc
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise BadInput(f"{flag}: depths are fractions between 0 and 1", fix=example)
    return depths


def make_needle(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """(vault id, the JSON record): random per depth so no answer can be carried over."""
    vault = f"{rng.choice(_WORDS)}-{rng.randrange(100, 1000)}"
    record = {"vault": vault, "code": rng.randrange(10_000, 100_000), "shelf": rng.choice(_WORDS)}
    return vault, record


def question_for(vault: str) -> str:
    return (
        f"Somewhere in the text above is a line of the form 'Record for vault <id>: <JSON object>'. "
        f"Reply with the JSON object recorded for vault {vault}, exactly as written, and nothing else."
    )


def extract_json_object(answer: str) -> Any:
    """The first JSON object in `answer` (code fences and surrounding words allowed), or None."""
    decoder = json.JSONDecoder()
    start = answer.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(answer, start)
            return value
        except ValueError:
            start = answer.find("{", start + 1)
    return None


def judge_answer(answer: str, expected: dict[str, Any]) -> tuple[bool, str | None]:
    found = extract_json_object(answer)
    if found is None:
        return False, "no JSON object in the answer"
    if found != expected:
        return False, "the JSON object differs from the hidden record"
    return True, None


def run_needles(
    client: JsonPoster,
    prompts: PromptFactory,
    model: str,
    sizes: Sequence[int],
    depths: Sequence[float],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_model_len: int | None = None,
    seed: int = 0,
    on_result: Callable[[NeedleResult], None] | None = None,
    on_section: Callable[[NeedleSection], None] | None = None,
) -> NeedleSection:
    """Every depth of every size; `on_section` gets the section so far after each (`complete` False)."""
    if max_model_len is not None:
        for size in sizes:
            if size + max_tokens > max_model_len:
                raise BadInput(
                    f"--sizes: {size} tokens plus {max_tokens} answer tokens exceed the server's "
                    f"max_model_len {max_model_len}",
                    fix="pass smaller --sizes",
                )
    rng = random.Random(seed)
    results: list[NeedleResult] = []
    for size in sizes:
        for depth in depths:
            vault, record = make_needle(rng)
            needle = f"Record for vault {vault}: {json.dumps(record)}"
            question = question_for(vault)
            budget = size - len(prompts.tokenizer.tokenize(model, question)) - _TEMPLATE_ALLOWANCE
            haystack, _ = prompts.haystack(max(budget, 0), insert=needle, depth=depth)
            result = _ask(client, model, haystack + question, record, size, depth, max_tokens)
            results.append(result)
            if on_result is not None:
                on_result(result)
            if on_section is not None:
                on_section(
                    NeedleSection(
                        sizes=list(sizes), depths=list(depths), max_tokens=max_tokens, results=results, complete=False
                    )
                )
    return NeedleSection(sizes=list(sizes), depths=list(depths), max_tokens=max_tokens, results=results)


def _ask(
    client: JsonPoster,
    model: str,
    prompt: str,
    record: dict[str, Any],
    size: int,
    depth: float,
    max_tokens: int,
) -> NeedleResult:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_salt": secrets.token_hex(16),
        "chat_template_kwargs": {"enable_thinking": False},
    }
    started = time.perf_counter()
    _, payload, error = client.post_json("/v1/chat/completions", body)
    latency = time.perf_counter() - started
    if error is not None:
        return NeedleResult(
            size_tokens=size,
            depth=depth,
            expected=record,
            answer="",
            passed=False,
            reason=error,
            latency_s=latency,
        )
    try:
        answer, prompt_tokens = chat_answer(payload)
        passed, reason = judge_answer(answer, record)
    except Exception as exc:  # an answer shaped like nothing expected: failed with the reason, never a crash
        answer, prompt_tokens = "", None
        passed, reason = False, f"malformed answer: {type(exc).__name__}: {str(exc)[:200]}"
    return NeedleResult(
        size_tokens=size,
        depth=depth,
        prompt_tokens=prompt_tokens,
        expected=record,
        answer=answer,
        passed=passed,
        reason=reason,
        latency_s=latency,
    )


def chat_answer(payload: Any) -> tuple[str, int | None]:
    """(content of the first choice, prompt tokens from usage) of a non-streamed chat completion."""
    if not isinstance(payload, dict):
        return "", None
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    choices = payload.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    counted = isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and 0 <= prompt_tokens < 2**53
    return (content if isinstance(content, str) else ""), (prompt_tokens if counted else None)


NEEDLE_FAIL_UNDER = {"pass-rate": "share of depths recalled, 0..1; without it, 1: every depth"}


def needle_gates(section: NeedleSection, under: dict[str, float]) -> list[GateResult]:
    """One gate on the share of (size, depth) pairs recalled; each pair's verdict is in the results."""
    threshold = under.get("pass-rate", 1.0)
    return minimum_gates("pass-rate", threshold, [("every size and depth", section.pass_rate)], "")
