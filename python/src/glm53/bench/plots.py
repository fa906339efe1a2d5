"""PNG plots of a run: TTFT and decode speed against context length (matplotlib, Agg, imported lazily)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glm53.bench.runner import RunSection
from glm53.errors import BadInput, Unavailable
from glm53.fsutil import atomic_write_bytes
from glm53.recipe.performance import RecipePoint, recipe_performance

TTFT_PNG = "ttft_vs_context.png"
DECODE_PNG = "decode_vs_context.png"


def _pyplot() -> Any:
    try:
        import matplotlib  # optional: the plots extra
    except ImportError as exc:
        raise Unavailable("matplotlib is not installed", fix="pip install 'glm53[plots]', or pass --no-plots") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: the plots extra, once its backend is chosen

    return plt


def write_plots(
    run: RunSection, out_dir: Path, *, recipe: list[RecipePoint] | None = None, recipe_label: str = "recipe"
) -> list[Path]:
    plt = _pyplot()
    written = []
    panels = (
        (TTFT_PNG, "ttft_ms", 1e-3, "TTFT (s)", "Time to first token vs context"),
        (DECODE_PNG, "decode_tok_s", 1.0, "decode tok/s", "Decode speed vs context"),
    )
    for name, metric, scale, ylabel, title in panels:
        figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
        every_x, every_y, best_x, best_y = [], [], [], []
        for shape in run.shapes:
            for record in shape.runs:
                value = getattr(record, metric)
                if record.valid and value is not None:
                    every_x.append(shape.prompt_tokens)
                    every_y.append(value * scale)
            best = getattr(shape.best, metric)
            if best is not None:
                best_x.append(shape.prompt_tokens)
                best_y.append(best * scale)
        axes.scatter(every_x, every_y, s=14, alpha=0.45, label="every valid run")
        axes.plot(best_x, best_y, marker="o", label="best of N")
        if recipe:
            axes.plot(
                [p.context_len for p in recipe],
                [getattr(p, metric) * scale for p in recipe],
                marker="s",
                linestyle="--",
                label=recipe_label,
            )
        # Contexts span 8K..260K (and tiny shapes in tests): a log axis keeps every point readable.
        axes.set_xscale("log", base=2)
        if metric == "ttft_ms":
            axes.set_yscale("log")
        axes.set_xlabel("prompt tokens")
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend(loc="best", fontsize=8)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        plt.close(figure)
        path = Path(out_dir) / name
        atomic_write_bytes(path, buffer.getvalue())
        written.append(path)
    return written


def write_report_plots(run: RunSection, out_dir: Path, *, warn: Callable[[str], None]) -> list[Path]:
    """The PNGs beside summary.json, against the recipe's default profile. The summary is written by then: a
    plot that cannot be made is a warning, so that it never hides the measured result."""
    recipe = recipe_performance()
    try:
        return write_plots(
            run,
            out_dir,
            recipe=recipe.profiles[recipe.default_profile],
            recipe_label=f"recipe ({recipe.default_profile})",
        )
    except (Unavailable, BadInput) as exc:
        warn(f"{exc.message}; plots skipped")
        return []
