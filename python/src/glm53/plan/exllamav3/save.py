"""The ExLlamaV3 plan with its routing statistics applied, and its files (`glm53 plan host --profile exl3-* --out DIR`).

    finish_exl3_plan(plan, model, stats, out_dir) -> SavedExl3Plan     writes only under out_dir, when given

    DIR/plan.json               the Exl3Plan (`--json` prints the same)
    DIR/plan.env                its env keys as KEY=VALUE lines: `glm53 serve --plan-env DIR/plan.env`
    DIR/exl3-split-stats.json   ExLlamaV3's EXL3_MOE_CPU_SPLIT_STATS file (only with routing statistics)

With a routing trace and a split plan, static placement (learned on the trace's first half) is compared with
ExLlamaV3's dynamic placement on the second half; when static wins and the stats file is written, plan.env
turns dynamic placement off (EXL3_MOE_CPU_SWAP=0) and names the file (EXL3_MOE_CPU_SPLIT_STATS). Files are
replaced atomically, as `glm53 plan host --out` does for the vLLM plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from glm53.fsutil import atomic_write_json, atomic_write_text
from glm53.plan.cache.engine_cost import exl3_step_cost
from glm53.plan.cache.recommend import recommend
from glm53.plan.exllamav3.expert_cache import check_trace_matches, choose_cache_setting, predict_cache
from glm53.plan.exllamav3.split import Exl3Plan, compare_placements, counts_by_layer, split_stats
from glm53.plan.files import env_lines, make_out_dir
from glm53.plan.finite import require_finite
from glm53.plan.inputs.model import ModelFacts
from glm53.plan.routing.traces import RoutingCounts, RoutingTrace

SPLIT_STATS_FILENAME = "exl3-split-stats.json"
PLACEMENT_LEARN_FRACTION = 0.5


@dataclass(frozen=True)
class SavedExl3Plan:
    plan: Exl3Plan
    files: tuple[Path, ...]  # plan.json, plan.env and the stats file, in that order, when written


def finish_exl3_plan(
    plan: Exl3Plan,
    model: ModelFacts,
    stats: RoutingTrace | RoutingCounts | None,
    out_dir: Path | None,
    *,
    learn_fraction: float = PLACEMENT_LEARN_FRACTION,
) -> SavedExl3Plan:
    """Add the placement comparison (a trace and a split plan), then write the files when `out_dir` is given."""
    updates: dict[str, object] = {}
    if plan.expert_cache is not None:
        plan = _choose_cache_setting(plan, model, stats)
    elif isinstance(stats, RoutingTrace) and plan.offload.mode == "split":
        updates["placement"] = compare_placements(stats, plan.offload.split_experts, learn_fraction)
        experts = stats.experts
        updates["recommendation"] = recommend(
            stats,
            (experts - plan.offload.split_experts) / experts,
            engines=("exllamav3",),
            learn_steps=round(stats.steps * learn_fraction),
            # priced on this plan's model and host memory (the rig's, the flag's, or the stated assumption)
            exl3_cost=exl3_step_cost(model, host_memory_bandwidth=plan.shape.host_memory_bandwidth, top_k=stats.top_k),
        )
    plan = plan.model_copy(update=updates)
    if out_dir is None:
        return SavedExl3Plan(plan, ())
    make_out_dir(out_dir)
    files: list[Path] = [out_dir / "plan.json", out_dir / "plan.env"]
    if stats is not None:
        stats_path = (out_dir / SPLIT_STATS_FILENAME).resolve()
        atomic_write_json(stats_path, split_stats(model, counts_by_layer(stats)))
        files.append(stats_path)
        env, origins = dict(plan.env), dict(plan.origins)
        if plan.expert_cache is not None and plan.expert_cache.pinned:
            env["EXPERT_CACHE_STATS"] = str(stats_path)
            origins["EXPERT_CACHE_STATS"] = "the --stats counts, per MoE module: they rank the pinned experts"
        if plan.recommendation is not None:
            chosen = plan.recommendation.engine("exllamav3")
            over_stock = chosen.worst_over_stock
            stock = f", {over_stock:+.2%} vs its defaults" if over_stock is not None else ""
            for key, value in chosen.choice.env(str(stats_path)).items():
                env[key] = value
                origins[key] = (
                    f"recommended: {chosen.label} (worst stress scenario: {chosen.measure} "
                    f"{chosen.worst_gain:+.2%} vs plain LRU{stock})"
                )
        plan = plan.model_copy(update={"env": env, "origins": origins, "split_stats_file": str(stats_path)})
    require_finite(plan.model_dump(mode="json"), what="the plan")
    atomic_write_json(files[0], plan.model_dump(mode="json"))
    atomic_write_text(files[1], env_lines(plan.env))
    return SavedExl3Plan(plan, tuple(files))


def _choose_cache_setting(plan: Exl3Plan, model: ModelFacts, stats: RoutingTrace | RoutingCounts | None) -> Exl3Plan:
    """With a routing trace, the cache's setting: the policy (pinned LRU or decayed frequency) that holds up best
    on the trace and its stress scenarios (never a quarter point below plain LRU on any); counts alone cannot be
    replayed."""
    size = plan.expert_cache
    assert size is not None
    if not isinstance(stats, RoutingTrace):
        if stats is None:
            return plan
        origins = {**plan.origins, "EXPERT_CACHE_PINNED": "routing counts cannot be replayed: plain LRU"}
        return plan.model_copy(update={"origins": origins})
    check_trace_matches(stats, model, source="--stats")
    choice = choose_cache_setting(stats, size)
    size = size.model_copy(update={"pinned": round(choice.pinned_fraction * size.slots)})
    why = (
        f"chosen on --stats: {choice.label} (worst stress scenario {choice.worst_gain_over_lru:+.2%} hit rate "
        "vs plain LRU at the same slots)"
    )
    env = {**plan.env, "EXPERT_CACHE_WINDOW": str(size.window), "EXPERT_CACHE_PINNED": str(size.pinned)}
    env["EXPERT_CACHE_POLICY"] = choice.policy
    origins = {
        **plan.origins,
        "EXPERT_CACHE_WINDOW": f"{size.slots} resident slots less the pinned",
        "EXPERT_CACHE_PINNED": why,
        "EXPERT_CACHE_POLICY": why,
    }
    if choice.policy == "frequency":
        assert choice.recent is not None and choice.half_life is not None
        env["EXPERT_CACHE_RECENT"], env["EXPERT_CACHE_HALF_LIFE"] = str(choice.recent), f"{choice.half_life:g}"
        origins["EXPERT_CACHE_RECENT"] = origins["EXPERT_CACHE_HALF_LIFE"] = why
    prediction = plan.cache_prediction
    if prediction is not None:
        # the chosen setting's held-out hit rate, over the trace's stress scenarios at their mean
        rate = sum(choice.hit_rates) / len(choice.hit_rates)
        prediction = predict_cache(
            size,
            model,
            prediction.resident_seconds,
            hit_rate=rate,
            hit_rate_source=f"--stats: {choice.label}, held out, mean of {len(choice.hit_rates)} scenarios",
            link_bytes_per_s=prediction.link_bytes_per_s,
            link_source=prediction.link_source,
        )
    update = {"expert_cache": size, "cache_choice": choice, "cache_prediction": prediction}
    return plan.model_copy(update={**update, "env": env, "origins": origins})


__all__ = ["PLACEMENT_LEARN_FRACTION", "SPLIT_STATS_FILENAME", "SavedExl3Plan", "finish_exl3_plan"]
