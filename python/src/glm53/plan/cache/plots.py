"""PNG plots of the learned miss-ratio curves (matplotlib, Agg backend, imported only here)."""

from __future__ import annotations

from pathlib import Path

from glm53.errors import Unavailable
from glm53.plan.cache.compare import ComparisonReport
from glm53.plan.cache.slots import learn_from_trace
from glm53.plan.routing.traces import RoutingTrace

# The files plot_miss_ratio_curves writes (the second only with a report).
CURVES_PNG = "miss-ratio-curves.png"
POLICIES_PNG = "policies.png"


def plot_miss_ratio_curves(
    trace: RoutingTrace,
    directory: Path,
    *,
    learn_fraction: float = 0.2,
    report: ComparisonReport | None = None,
) -> list[Path]:
    """Two PNGs: each layer's miss ratio vs slots (LRU only, best pinned+LRU split) and the budget chart."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    try:
        import matplotlib  # optional: the plots extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional: the plots extra, once its backend is chosen
    except ImportError as exc:
        raise Unavailable("plots need matplotlib", fix="pip install 'glm53[plots]'") from exc
    directory.mkdir(parents=True, exist_ok=True)
    learn, _ = trace.split(learn_fraction)
    _, curves = learn_from_trace(learn)
    capacity = np.arange(trace.experts + 1)
    written: list[Path] = []

    figure, (lru_axis, best_axis) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = plt.get_cmap("viridis")(np.linspace(0, 1, len(curves)))
    for layer, curve, color in zip(trace.layers, curves, colors, strict=True):
        lru_axis.plot(
            capacity,
            1 - curve.lru_only() / curve.accesses,
            color=color,
            lw=0.8,
            label=str(layer) if layer in (trace.layers[0], trace.layers[-1]) else None,
        )
        best_axis.plot(capacity, 1 - curve.best / curve.accesses, color=color, lw=0.8)
    lru_axis.set_title("LRU only")
    best_axis.set_title("best pinned + LRU split")
    for axis in (lru_axis, best_axis):
        axis.set_xlabel("GPU expert slots in the layer")
        axis.grid(alpha=0.3)
    lru_axis.set_ylabel("miss ratio (learned part)")
    lru_axis.legend(title="layer", fontsize=8)
    figure.suptitle(f"Per-layer miss-ratio curves, {learn.steps:,} steps")
    figure.tight_layout()
    path = directory / CURVES_PNG
    figure.savefig(path, dpi=120)
    plt.close(figure)
    written.append(path)

    if report is not None:
        figure, axis = plt.subplots(figsize=(7, 4.5))
        width = 0.2
        x = np.arange(len(report.budgets))
        for offset, policy in enumerate("abcd"):
            rates = [budget.result(policy).hit_rate for budget in report.budgets]
            label = report.budgets[0].result(policy).label
            axis.bar(x + (offset - 1.5) * width, rates, width, label=f"({policy}) {label}")
        axis.set_xticks(x, [f"{b.fraction:.0%}" for b in report.budgets])
        axis.set_xlabel("GPU slot budget (share of all experts)")
        axis.set_ylabel("held-out hit rate")
        axis.legend(fontsize=8)
        axis.grid(axis="y", alpha=0.3)
        figure.tight_layout()
        path = directory / POLICIES_PNG
        figure.savefig(path, dpi=120)
        plt.close(figure)
        written.append(path)
    return written


__all__ = ["plot_miss_ratio_curves"]
