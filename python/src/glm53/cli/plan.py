"""`glm53 plan`: `plan host` plans the expert pools, KV and CPU sets for a host; `plan simulate`; `plan trace synth`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from glm53.cli.app import App
from glm53.cli.model_options import Flag, flag_name, flags_of, options_from
from glm53.cli.options import (
    OUT_POLICY,
    ForceOpt,
    HostRootOpt,
    JsonOpt,
    ModelDirOpt,
    OptionalProfileOpt,
    RigOpt,
    refuse_to_replace,
)
from glm53.errors import BadInput, CheckFailed
from glm53.fsutil import atomic_write_json, read_json
from glm53.host.rig import load_rig
from glm53.host.topology import format_cpu_list
from glm53.output import Output
from glm53.plan.cache.compare import add_engine_policies, compare_policies, parse_budgets, trace_cost_model
from glm53.plan.cache.plots import CURVES_PNG, POLICIES_PNG, plot_miss_ratio_curves
from glm53.plan.cache.render import render_comparison
from glm53.plan.exllamav3.expert_cache import (
    RECIPE_PINNED_FRACTION,
    ExpertCachePlan,
    check_cache_report,
    check_pinned_fraction,
    check_trace_matches,
    choose_cache_setting,
    size_cache,
)
from glm53.plan.exllamav3.render import render_cache_check, render_exl3_plan, render_expert_cache
from glm53.plan.exllamav3.save import PLACEMENT_LEARN_FRACTION, SPLIT_STATS_FILENAME, finish_exl3_plan
from glm53.plan.exllamav3.split import plan_exl3_for_host
from glm53.plan.files import check_out_dir, env_lines
from glm53.plan.finite import require_finite
from glm53.plan.inputs.gpus import gpus_from_sizes
from glm53.plan.inputs.machine import target_from_options
from glm53.plan.inputs.model import model_facts
from glm53.plan.inputs.shape import ServingShape, serving_shape
from glm53.plan.inputs.sizes import parse_size
from glm53.plan.routing.public import IMPORT_FORMATS, import_trace
from glm53.plan.routing.render import render_synthetic_trace
from glm53.plan.routing.shapes import SHAPES, make_shape
from glm53.plan.routing.spec import SynthesizedTrace, SyntheticTraceSpec, format_shifts
from glm53.plan.routing.traces import (
    parse_layers,
    parse_shifts,
    read_routing_stats,
    read_trace,
    synthesize_trace,
    write_counts,
    write_trace,
)
from glm53.plan.vllm.env import RANKINGS_FILENAME, save_plan
from glm53.plan.vllm.planner import plan_for_host
from glm53.plan.vllm.render import render_plan
from glm53.recipe.profiles import load_profile
from glm53.serve.engines import engine_of
from glm53.serve.engines.exllamav3.expert_cache import read_rankings

plan_app = App(
    name="plan",
    help="Plan GPU expert slots, KV, host pools and CPU sets; simulate cache policies on routing traces.",
    no_args_is_help=True,
)
trace_app = App(name="trace", help="Routing traces: make synthetic ones, import real captures.", no_args_is_help=True)

# --out of the commands that write a trace.
TraceOutOpt = Annotated[
    Path,
    typer.Option(
        "--out", help="Trace file to write (JSONL; binary numpy if it ends in .npz)." + OUT_POLICY, show_default=False
    ),
]

plan_app.add_typer(trace_app)


def _kv_cache_memory(text: str) -> int | None:
    return None if text == "derive" else parse_size(text, flag="--kv-cache-memory", positive=True)


def _gpu_workspace(text: str) -> int:
    return parse_size(text, flag="--gpu-workspace")


# The serving shape's options, in the order --help lists them; each default is ServingShape's (the recipe's).
SHAPE_FIELDS = (
    "tensor_parallel_size",
    "max_model_len",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "gpu_workspace_bytes",
    "pool_threads",
)
SHAPE_FLAGS = {
    "tensor_parallel_size": Flag("--tp"),
    "kv_cache_memory_bytes": Flag("--kv-cache-memory", type=str, parse=_kv_cache_memory, metavar="SIZE|derive"),
    "gpu_workspace_bytes": Flag(
        "--gpu-workspace", type=str, parse=_gpu_workspace, metavar="SIZE", default_text="the estimate"
    ),
    "pool_threads": Flag(default_text="no cap"),
}
SHAPE_FLAG_NAMES = {field: flag_name(field, SHAPE_FLAGS) for field in SHAPE_FIELDS}
# What an exllamav3 profile's plan takes of the shape; the rest are vLLM's.


@plan_app.command("host")
@options_from(
    ServingShape,
    "shape",
    fields=SHAPE_FIELDS,
    flags=SHAPE_FLAGS,
    given_only="the --profile's value, else {default}",
)
def host_cmd(
    model_dir: ModelDirOpt = None,
    stats: Annotated[Path | None, typer.Option("--stats", help="Routing trace (JSONL) or counts (JSON).")] = None,
    gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", help="Memory of each GPU: 24GiB,24GiB.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="Number of GPUs (with --gpu).")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Memory of each of --gpus GPUs, e.g. 24GiB.")] = None,
    rig: RigOpt = None,
    ram: Annotated[
        str | None, typer.Option("--ram", help="The target's RAM (MemTotal), e.g. 128GiB, instead of this machine's.")
    ] = None,
    cpus: Annotated[
        str | None,
        typer.Option(
            "--cpus",
            help="The target's CPUs, instead of this machine's: CORESc, optionally SOCKETSx before, xTHREADSt "
            "and /CORES_PER_L3 after, e.g. 32cx2t/8 (32 cores, 2 threads each, 8 cores per L3).",
        ),
    ] = None,
    profile: OptionalProfileOpt = None,
    shape: dict[str, Any] | None = None,
    bandwidth: Annotated[Path | None, typer.Option("--bandwidth", help="`glm53 probe --json` output.")] = None,
    learn_fraction: Annotated[
        float | None,
        typer.Option(
            "--learn-fraction",
            help="Trace share to learn from [vLLM plan: 0.8; exllamav3: 0.5, static vs dynamic placement].",
            show_default=False,
        ),
    ] = None,
    host_root: HostRootOpt = Path("/"),
    env: Annotated[bool, typer.Option("--env", help="Print KEY=VALUE lines for the entrypoint.")] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory to write plan.json, plan.env and the rankings into." + OUT_POLICY),
    ] = None,
    expert_cache: Annotated[
        bool,
        typer.Option(
            "--expert-cache",
            help="exl3-* profiles: serve the routed experts through glm53's GPU expert cache (EXPERT_CACHE=1); "
            "sizes its slots per layer, and with --stats pins the hottest share.",
        ),
    ] = False,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Plan for this host, or for a rig it is not (--rig, --ram, --cpus, --gpu-memory).

    Model facts come from --model-dir, else the published ones. Serving values come from the flags, else from
    --profile, else the recipe's. An exllamav3 profile (exl3-*) gets the ExLlamaV3 plan: the layer split over
    the GPUs, the routed experts on the CPU (split or whole-layer offload), the host RAM and the predicted
    decode rate; with a routing trace, static against dynamic expert placement.

    Examples:
      glm53 plan host --rig recipe-2x3090
      glm53 plan host --gpu-memory 24GiB,24GiB --ram 128GiB --cpus 32cx2t/8
      glm53 plan host --profile exl3-2x3090 --rig recipe-2x3090
      glm53 plan host --profile exl3-1gpu --rig one-3090 --stats routing.jsonl --out plan/
      glm53 plan host --profile exl3-2x3090 --expert-cache --stats routing.npz --out plan/
    """
    given = shape or {}
    if env and json_mode:
        raise BadInput("--env and --json both print to stdout: choose one")
    only = engine_of(load_profile(profile).engine).plan_shape_fields if profile is not None else None
    if expert_cache and only is None:
        raise BadInput(
            "--expert-cache plans the GPU expert cache of the exllamav3 engine"
            + (f"; profile {profile} runs on vllm" if profile is not None else ""),
            fix="add --profile exl3-1gpu or --profile exl3-2x3090",
        )
    if profile is not None and only is not None:  # the split planner: a shape of its own, no host resources
        vllm_only = [SHAPE_FLAG_NAMES[field] for field in SHAPE_FIELDS if field in given and field not in only]
        vllm_only += [
            flag for flag, value in (("--bandwidth", bandwidth), ("--ram", ram), ("--cpus", cpus)) if value is not None
        ]
        if vllm_only:
            raise BadInput(
                f"{', '.join(vllm_only)}: vLLM plan options; profile {profile} runs on exllamav3",
                fix="see `glm53 plan host --help`; the ExLlamaV3 plan takes --rig, --gpu-memory, --max-model-len, "
                "--max-num-seqs, --pool-threads, --stats, --out",
            )
        _plan_exl3(
            profile,
            model_dir=model_dir,
            rig=rig,
            stats=stats,
            gpus=(gpu_memory, gpus, gpu),
            overrides={**{field: given.get(field) for field in only}, "expert_cache": expert_cache or None},
            learn_fraction=learn_fraction,
            host_root=host_root,
            env=env,
            out=out,
            force=force,
            json_mode=json_mode,
        )
        return

    output = Output(json_mode=json_mode)
    if out is not None:
        check_out_dir(out)
        refuse_to_replace(_plan_files(out, RANKINGS_FILENAME if stats is not None else None), force=force)
    target = target_from_options(rig, ram, cpus)
    source = f"profile {profile}" if profile is not None else "the recipe's values"
    with flags_of(SHAPE_FLAG_NAMES, given=list(given), source=source, fix="see `glm53 plan host --help`"):
        serving = serving_shape(profile, given)
    saved = save_plan(
        plan_for_host(
            serving,
            model_dir=model_dir,
            stats_path=stats,
            gpus=gpus_from_sizes(gpu_memory, gpus, gpu),
            bandwidth_path=bandwidth,
            root=host_root,
            learn_fraction=0.8 if learn_fraction is None else learn_fraction,
            target=target,
        ),
        out,
    )
    if saved.plan.target != "this host":
        output.info(f"planned for {saved.plan.target}")
    if saved.rankings is not None:
        output.info(f"wrote the hot-expert rankings to {saved.rankings}")
    if saved.plan_files:
        output.info(f"wrote {' and '.join(str(path) for path in saved.plan_files)}")
    if env:
        typer.echo(env_lines(saved.env), nl=False)
        return
    output.result(saved.plan, lambda console: render_plan(saved.plan, console, saved.env))


def _plan_files(out: Path, extra: str | None) -> list[Path]:
    """The files a plan writes into --out: plan.json, plan.env and, from a routing trace, one more."""
    return [out / "plan.json", out / "plan.env", *([out / extra] if extra else [])]


def _plan_exl3(
    profile: str,
    *,
    model_dir: Path | None,
    rig: str | None,
    stats: Path | None,
    gpus: tuple[str | None, int | None, str | None],
    overrides: dict[str, int | bool | None],
    learn_fraction: float | None,
    host_root: Path,
    env: bool,
    out: Path | None,
    force: bool,
    json_mode: bool,
) -> None:
    """`glm53 plan host --profile exl3-*`: the ExLlamaV3 planner, its tables and files."""

    output = Output(json_mode=json_mode)
    if out is not None:
        check_out_dir(out)
        refuse_to_replace(_plan_files(out, SPLIT_STATS_FILENAME if stats is not None else None), force=force)
    described = load_rig(rig) if rig is not None else None
    given_gpus = gpus_from_sizes(*gpus)
    routing = read_routing_stats(stats) if stats is not None else None
    model = model_facts(model_dir)
    plan = plan_exl3_for_host(
        load_profile(profile),
        model_dir=model_dir,
        root=host_root,
        rig=described,
        stats=routing,
        gpus=given_gpus,
        shape_overrides=overrides,
        model=model,
    )
    fraction = PLACEMENT_LEARN_FRACTION if learn_fraction is None else learn_fraction
    saved = finish_exl3_plan(plan, model, routing, out, learn_fraction=fraction)
    if saved.files:
        output.info(f"wrote {', '.join(str(path) for path in saved.files)}")
    if saved.plan.placement is not None:
        output.info(f"placement: {saved.plan.placement.verdict}")
    if env:
        typer.echo(env_lines(saved.plan.env), nl=False)
        return
    output.result(saved.plan, lambda console: render_exl3_plan(saved.plan, console))


@plan_app.command("simulate")
def simulate(
    traces: Annotated[Path, typer.Argument(metavar="TRACE", help="Routing trace (JSONL or .npz).", show_default=False)],
    budgets: Annotated[
        str, typer.Option("--budgets", help="GPU slot budgets as fractions of all experts.")
    ] = "0.08,0.17,0.33",
    learn_fraction: Annotated[float, typer.Option("--learn-fraction", help="Trace share to learn from.")] = 0.2,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor parallelism for the cost model.")] = 2,
    bandwidth: Annotated[Path | None, typer.Option("--bandwidth", help="`glm53 probe --json` output.")] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Processes (default: every allowed CPU).")
    ] = None,
    plots_dir: Annotated[
        Path | None, typer.Option("--plots-dir", help="Directory to write the miss-ratio curve PNGs into.")
    ] = None,
    drift: Annotated[
        str,
        typer.Option(
            "--drift",
            help="Drift scenarios AT:STRENGTH[,...] replayed besides the trace: popularity shifted from AT (share "
            "of the steps) on, STRENGTH of each layer's experts re-permuted; 'none' for none.",
        ),
    ] = "0.5:1,0.15:1,0.5:0.5",
    drift_seed: Annotated[int, typer.Option("--drift-seed", min=0, help="Seed of the drift permutations.")] = 0,
    engines: Annotated[
        bool,
        typer.Option(
            "--engines/--no-engines",
            help="Also replay the engines' own policies (defaults and recommended settings), priced as each "
            "engine pays misses.",
        ),
    ] = True,
    out: Annotated[Path | None, typer.Option("--out", help="Write the report JSON here." + OUT_POLICY)] = None,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Replay a trace through uniform LRU, the recipe's 20%-pinned LRU, the planned split and Belady's MIN,
    then through each engine's own policies: the recipe's engine, ExLlamaV3's dynamic and static split, and a
    proposed decayed-frequency cache, each at its recommended setting.

    Examples:
      glm53 plan simulate routing.jsonl --plots-dir plots/
      glm53 plan simulate routing.jsonl --drift none --out report.json --json
    """

    output = Output(json_mode=json_mode)
    fractions = parse_budgets(budgets)
    scenarios = parse_shifts(drift, flag="--drift")
    if out is not None and out.is_dir():
        raise BadInput(f"--out {out} is a directory", fix="give the report file's path, e.g. --out report.json")
    if out is not None:
        refuse_to_replace([out], force=force)
    if plots_dir is not None:
        check_out_dir(plots_dir, what="--plots-dir")
        refuse_to_replace([plots_dir / CURVES_PNG, plots_dir / POLICIES_PNG], force=force)
    trace = read_trace(traces)
    cost = trace_cost_model(trace, tensor_parallel_size=tp, bandwidth_path=bandwidth)
    with output.progress("learning") as bar:
        result = compare_policies(
            trace,
            fractions,
            learn_fraction=learn_fraction,
            cost=cost,
            source=str(traces),
            progress=bar.update,
            workers=workers,
            drift=scenarios,
            drift_seed=drift_seed,
        )
    if engines:
        with output.progress("engine policies") as bar:
            bar.update("engine policies", 0, 1)
            result = add_engine_policies(result, trace, seed=drift_seed)
    require_finite(result.model_dump(mode="json"), what="the simulation report")
    if out is not None:
        atomic_write_json(out, result.model_dump(mode="json"))
        output.info(f"wrote {out}")
    if plots_dir is not None:
        written = plot_miss_ratio_curves(trace, plots_dir, learn_fraction=learn_fraction, report=result)
        output.info(f"wrote {len(written)} plots to {plots_dir}")
    output.result(result, lambda console: render_comparison(result, console))


def _pinned_fraction(text: str) -> float | None:
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise BadInput(
            f"--pinned-fraction {text!r} is not a number", fix="give a share from 0 to 1, or 'auto'"
        ) from None
    return check_pinned_fraction(value)


@plan_app.command("expert-cache")
def expert_cache_cmd(
    trace_path: Annotated[
        Path | None,
        typer.Argument(metavar="[TRACE]", help="Routing capture to choose the policy from.", show_default=False),
    ] = None,
    cache_memory: Annotated[
        str,
        typer.Option(
            "--cache-memory",
            help="What the expert cache may take of each GPU, after weights, KV and activations: e.g. 14GiB.",
            show_default=False,
        ),
    ] = "",
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs the MoE layers are split over.")] = 2,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", min=1, help="Sequences decoded at once.")] = 1,
    pinned_fraction: Annotated[
        str,
        typer.Option(
            "--pinned-fraction",
            help="Share of the resident slots pinned to the hottest experts, 0 to 1; 'auto' chooses it from TRACE "
            "(without one: the recipe's 0.2).",
        ),
    ] = "auto",
    model_dir: ModelDirOpt = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the stress scenarios.")] = 0,
    json_mode: JsonOpt = False,
) -> None:
    """Size the GPU expert cache (pkgs/exllamav3/expert-cache) per MoE layer and choose its policy.

    The slots are what fits --cache-memory on the GPU holding the most MoE layers, beside one step's staging;
    with a TRACE the policy (LRU with a pinned share, or decayed frequency at a half-life of 64, 256 or 1,024
    steps) is the one that holds up best on it and on stress scenarios derived from it, never more than a
    quarter point below plain LRU.

    Examples:
      glm53 plan expert-cache --cache-memory 14GiB
      glm53 plan expert-cache routing.npz --cache-memory 14GiB --gpus 2 --json
    """
    output = Output(json_mode=json_mode)
    if not cache_memory:
        raise BadInput("--cache-memory is required", fix="give what the cache may take of each GPU, e.g. 14GiB")
    budget = parse_size(cache_memory, flag="--cache-memory")
    fraction = _pinned_fraction(pinned_fraction)
    facts = model_facts(model_dir)
    trace = None
    if trace_path is not None:
        trace = read_trace(trace_path)
        check_trace_matches(trace, facts, source=str(trace_path))
    size = size_cache(
        facts,
        budget,
        gpus=gpus,
        pinned_fraction=RECIPE_PINNED_FRACTION if fraction is None else fraction,
        sequences=max_num_seqs,
    )
    choice = None
    if trace is not None and fraction is None:
        with output.progress("replaying the cache's policies") as bar:
            bar.update("replaying the cache's policies", 0, 1)
            choice = choose_cache_setting(trace, size, seed=seed)
        size = size.model_copy(update={"pinned": round(choice.pinned_fraction * size.slots)})
    plan = ExpertCachePlan(
        model=facts.name,
        size=size,
        choice=choice,
        source=None if trace_path is None else str(trace_path),
    )
    output.result(plan, lambda console: render_expert_cache(plan, console))


@plan_app.command("expert-cache-check")
def expert_cache_check_cmd(
    report_path: Annotated[
        Path, typer.Argument(metavar="REPORT", help="The engine's expert-cache.json (in its run directory).")
    ],
    capture: Annotated[
        Path,
        typer.Argument(
            metavar="CAPTURE", help="routing.npz the same serve recorded (glm53 serve --capture-routing DIR)."
        ),
    ],
    stats: Annotated[
        Path | None, typer.Option("--stats", help="The EXPERT_CACHE_STATS counts the pinned experts came from.")
    ] = None,
    json_mode: JsonOpt = False,
) -> None:
    """Check the engine's cache against glm53's simulator: every layer's hits equal on the routing it served.

    Replays the capture's decode steps through the cache's policy with the report's window and pinned slots and
    sets each layer's simulated hits beside the engine's. Exit 1 when any layer differs, looked up fewer
    selections than the capture holds, or overflowed.

    Examples:
      glm53 plan expert-cache-check RUN_DIR/expert-cache.json capture/routing.npz
      glm53 plan expert-cache-check RUN/expert-cache.json r.npz --stats counts.json
    """
    output = Output(json_mode=json_mode)
    report = read_json(report_path, what="the expert-cache report")
    if not isinstance(report, dict):
        raise BadInput(f"{report_path} is not an expert-cache report (a JSON object)")
    trace = read_trace(capture)
    rankings = read_rankings(stats) if stats is not None else None
    check = check_cache_report(report, trace, rankings)
    output.result(check, lambda console: render_cache_check(check, console))
    if not check.equal:
        raise CheckFailed("the engine's cache and the simulator differ", fix="see the rows above")


SYNTH_FIELDS = ("steps", "layers", "experts", "top_k", "locality", "skew_min", "skew_max", "seed", "shifts")
SYNTH_FLAGS = {
    "layers": Flag(type=str, parse=parse_layers, show=format_cpu_list),
    "shifts": Flag("--shift", type=str, parse=parse_shifts, show=format_shifts),
}


@trace_app.command("synth")
@options_from(
    SyntheticTraceSpec, "spec", fields=SYNTH_FIELDS, flags=SYNTH_FLAGS, fix="see `glm53 plan trace synth --help`"
)
def synth(
    out: TraceOutOpt,
    spec: SyntheticTraceSpec,
    counts: Annotated[Path | None, typer.Option("--counts", help="Also write the counts file here.")] = None,
    shape: Annotated[
        str | None,
        typer.Option(
            "--shape",
            help="A named trace shape (" + ", ".join(SHAPES) + "); it sets locality, skew and drift itself.",
        ),
    ] = None,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Write a synthetic routing trace: per-layer Zipf popularity, temporal locality, top-k routing.

    Examples:
      glm53 plan trace synth --out routing.jsonl --steps 20000 --locality 0.3
      glm53 plan trace synth --out drift.npz --shift 0.5:1 --seed 7
      glm53 plan trace synth --out bursty.npz --shape bursty --seed 3
    """

    output = Output(json_mode=json_mode)
    for path, flag in ((out, "--out"), (counts, "--counts")):
        if path is not None and path.is_dir():
            raise BadInput(f"{flag} {path} is a directory", fix=f"give {flag} the path of the file to write")
    refuse_to_replace([out, *([counts] if counts is not None else [])], force=force)
    if shape is not None:
        if shape not in SHAPES:
            raise BadInput(f"--shape {shape!r} is not a trace shape", fix="one of: " + ", ".join(SHAPES))
        trace = make_shape(
            shape, seed=spec.seed, steps=spec.steps, layers=spec.layers, experts=spec.experts, top_k=spec.top_k
        )
    else:
        trace = synthesize_trace(spec)
    write_trace(out, trace)
    if counts is not None:
        write_counts(counts, trace.to_counts())
    summary = SynthesizedTrace(**spec.model_dump(), trace=str(out), counts=str(counts) if counts else None, shape=shape)
    output.result(summary, lambda console: render_synthetic_trace(out, spec, console))


@trace_app.command("import")
def import_capture(
    source: Annotated[
        Path, typer.Argument(metavar="CAPTURE", help="A routing capture (JSONL): expert-records or vllm-moe-log.")
    ],
    out: TraceOutOpt,
    source_format: Annotated[str, typer.Option("--format", help="auto, expert-records or vllm-moe-log.")] = "auto",
    experts: Annotated[
        int | None,
        typer.Option(
            "--experts", min=1, max=32767, help="Routed experts per layer (default: the capture's, else inferred)."
        ),
    ] = None,
    drop_incomplete: Annotated[
        bool, typer.Option("--drop-incomplete", help="Leave out tokens that lack a record for some layer.")
    ] = False,
    skip_steps: Annotated[
        int, typer.Option("--skip-steps", min=0, help="Leave out the first steps (a warm-up or profiling run).")
    ] = 0,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Import a real MoE model's routing capture into a glm53 routing trace (docs/plan.md, "Real routing").

    Examples:
      glm53 plan trace import mixtral-gsm8k.jsonl --out mixtral.jsonl --drop-incomplete
      glm53 plan trace import olmoe.jsonl --out olmoe.npz --skip-steps 2048
    """
    output = Output(json_mode=json_mode)
    if source_format not in ("auto", *IMPORT_FORMATS):
        raise BadInput(f"--format {source_format!r}", fix="auto, " + ", ".join(IMPORT_FORMATS))
    if out.is_dir():
        raise BadInput(f"--out {out} is a directory", fix="give --out the path of the file to write")
    refuse_to_replace([out], force=force)
    imported = import_trace(
        source,
        source_format=source_format,  # type: ignore[arg-type]
        experts=experts,
        drop_incomplete=drop_incomplete,
        skip_steps=skip_steps,
    )
    write_trace(out, imported.trace)
    summary = {"trace": str(out), "source": str(source), **imported.summary()}

    def render(console: Console) -> None:
        console.print(
            f"{source} ({imported.source_format}): {imported.records:,} records, {imported.sequences} "
            f"sequence(s) -> {imported.steps:,} steps x {len(imported.layers)} layers, top-{imported.top_k} of "
            f"{imported.experts} experts ({imported.experts_source})"
            + (f"; {imported.dropped_steps} incomplete steps left out" if imported.dropped_steps else "")
            + (f"; the first {imported.skipped_steps:,} skipped" if imported.skipped_steps else "")
            + f"; wrote {out}",
            highlight=False,
        )

    output.result(summary, render)


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app)
