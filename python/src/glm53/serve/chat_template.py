"""The bounded-thinking chat template shipped as package data, and a renderer for it (jinja2, sandboxed).

The recipe serves GLM-5.3-Flash with `--reasoning-config` whose `reasoning_end_str` is the text the server
forces when the 4,096-token thinking budget runs out. The template closes a cut reasoning text in a later
turn with exactly that string, so the model sees its own history as it was produced.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from glm53.errors import BadInput

TEMPLATE_NAME = "chat-template-bounded.jinja"
THINKING_BUDGET_TOKENS = 4096


def bounded_template_path() -> Path:
    """Where the installed package keeps the template (a real file: vLLM's --chat-template takes a path)."""
    return Path(str(resources.files("glm53") / "data" / TEMPLATE_NAME))


def bounded_template_text() -> str:
    return (resources.files("glm53") / "data" / TEMPLATE_NAME).read_text(encoding="utf-8")


def reasoning_end_str(reasoning_config: str, *, what: str = "REASONING_CONFIG") -> str:
    """The `reasoning_end_str` of a `--reasoning-config` JSON value."""
    try:
        value = json.loads(reasoning_config)
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"{what} is not valid JSON: {exc}",
            fix='expected {"reasoning_start_str": "<think>", "reasoning_end_str": "...</think>"}',
        ) from exc
    end = value.get("reasoning_end_str") if isinstance(value, dict) else None
    if not isinstance(end, str) or not end:
        raise BadInput(f"{what} has no reasoning_end_str", fix="add the string the server forces at the budget")
    return end


def render(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    template: str | None = None,
    **kwargs: Any,
) -> str:
    """Render a conversation as transformers does for vLLM (sandboxed jinja2, `tojson` without escaping)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # heavy: ~0.1 s to import, for rendering only

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    compiled = env.from_string(template if template is not None else bounded_template_text())
    return compiled.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
