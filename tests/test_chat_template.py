"""The bounded-thinking chat template, rendered with jinja2 the way transformers renders it for vLLM."""

from __future__ import annotations

import json

import pytest

from glm53.errors import BadInput
from glm53.recipe.profiles import load_profile
from glm53.serve.chat_template import (
    THINKING_BUDGET_TOKENS,
    bounded_template_path,
    reasoning_end_str,
    render,
)

PHRASE = "I have thought about this enough; I will now act on my best plan."


def _recipe_end() -> str:
    return reasoning_end_str(load_profile("agent-256k", environ={}).value("REASONING_CONFIG"))


def test_end_string_is_the_recipes_reasoning_config() -> None:
    assert _recipe_end() == f"\n\n{PHRASE}\n</think>"
    text = bounded_template_path().read_text()
    assert PHRASE in text and '"\\n\\n" ~ budget_phrase ~ "\\n</think>"' in text


def test_generation_prompt_opens_thinking_and_states_the_budget() -> None:
    out = render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "17 x 23?"},
        ]
    )
    assert out == (
        "[gMASK]<sop><|system|>\nThink for at most 4096 tokens, then answer.<|system|>\nBe brief."
        "<|user|>\n17 x 23?<|assistant|><think>"
    )
    assert THINKING_BUDGET_TOKENS == 4096
    assert render([{"role": "user", "content": "x"}], thinking_budget=1024).count("1024 tokens") == 1


def test_thinking_off_closes_the_block_and_drops_the_budget_line() -> None:
    out = render([{"role": "user", "content": "def is_prime"}], enable_thinking=False)
    assert out.endswith("<|user|>\ndef is_prime<|assistant|><think></think>")
    assert "Think for at most" not in out


def test_cut_reasoning_is_closed_with_exactly_the_forced_end_string() -> None:
    # In an agent loop the last assistant turn's reasoning is kept; one cut by the budget ends with the
    # transition phrase and is closed exactly as the server forced it.
    messages = [
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "reasoning_content": f"Look at the loop first.\n\n{PHRASE}",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "read_file", "arguments": {"path": "a.py"}},
                }
            ],
        },
        {"role": "tool", "content": "print(1)"},
    ]
    out = render(
        messages,
        tools=[{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
    )
    assert f"<|assistant|><think>Look at the loop first.{_recipe_end()}<tool_call>read_file" in out
    assert "<arg_key>path</arg_key><arg_value>a.py</arg_value></tool_call>" in out
    assert out.endswith("<|observation|><tool_response>print(1)</tool_response><|assistant|><think>")


def test_reasoning_before_the_last_user_turn_is_dropped_and_natural_ends_kept() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "A", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "B", "reasoning_content": "new thoughts"},
    ]
    out = render(messages, add_generation_prompt=False)
    assert "old thoughts" not in out and "<|assistant|><think></think>A" in out
    assert "<|assistant|><think>new thoughts</think>B" in out


def test_tools_are_listed_as_json() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo",
            "parameters": {"type": "object", "properties": {"city": {}}},
        },
    }
    out = render([{"role": "user", "content": "Paris?"}], tools=[tool])
    listed = out.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(listed) == tool["function"]


def test_reasoning_config_errors_name_the_key() -> None:
    with pytest.raises(BadInput, match="REASONING_CONFIG is not valid JSON"):
        reasoning_end_str("{")
    with pytest.raises(BadInput, match="no reasoning_end_str"):
        reasoning_end_str('{"reasoning_start_str": "<think>"}')
