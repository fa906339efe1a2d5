"""`glm53 plan`: plan the expert pools, KV and CPU sets for this host; `plan simulate`; `plan trace synth`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from glm53.cli.options import OUT_POLICY, ForceOpt, JsonOpt, ModelDirOpt, RigOpt
from glm53.errors import BadInput
from glm53.fsutil import atomic_write_json
from glm53.host.rig import load_rig
from glm53.output import Output
from glm53.plan.checkpoint_facts import model_facts
from glm53.plan.comparison import compare_policies, parse_budgets, trace_cost_model
from glm53.plan.env import check_out_dir, env_lines, save_plan
from glm53.plan.exl3 import plan_exl3_for_host
from glm53.plan.exl3_save import PLACEMENT_LEARN_FRACTION, finish_exl3_plan
from glm53.plan.finite import require_finite
from glm53.plan.planner import plan_for_host
from glm53.plan.plots import plot_miss_ratio_curves
from glm53.plan.render import render_comparison, render_exl3_plan, render_plan, render_synthetic_trace
from glm53.plan.rig import target_from_options
from glm53.plan.shape import serving_shape
from glm53.plan.sizes import gpus_from_sizes
from glm53.plan.traces import (
    SyntheticTraceSpec,
    parse_layers,
    parse_shifts,
    read_routing_stats,
    read_trace,
    synthesize_trace,
    write_counts,
    write_trace,
)
from glm53.recipe.profiles import load_profile

plan_app = typer.Typer(
    name="plan",
    help="Plan GPU expert slots, KV, host pools and CPU sets; simulate cache policies on routing traces.",
    invoke_without_command=True,
    no_args_is_help=False,
)
trace_app = typer.Typer(name="trace", help="Routing traces: make synthetic ones.", no_args_is_help=True)
plan_app.add_typer(trace_app)


@plan_app.callback()
def plan(
    ctx: typer.Context,
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
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="Serving profile to read the values below from (e.g. agent-256k)."),
    ] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="TENSOR_PARALLEL_SIZE [recipe: 2].")] = None,
    max_model_len: Annotated[
        int | None, typer.Option("--max-model-len", min=1, help="MAX_MODEL_LEN [recipe: 262144].")
    ] = None,
    kv_cache_memory: Annotated[
        str | None,
        typer.Option(
            "--kv-cache-memory",
            help="KV_CACHE_MEMORY_BYTES per GPU; 'derive' sizes it for the context [recipe: 3328599040].",
        ),
    ] = None,
    utilization: Annotated[
        float | None,
        typer.Option("--gpu-memory-utilization", min=0.05, max=1.0, help="GPU_MEMORY_UTILIZATION [recipe: 0.94]."),
    ] = None,
    batched: Annotated[
        int | None,
        typer.Option("--max-num-batched-tokens", min=1, help="MAX_NUM_BATCHED_TOKENS [recipe: 8192]."),
    ] = None,
    seqs: Annotated[int | None, typer.Option("--max-num-seqs", min=1, help="MAX_NUM_SEQS [recipe: 1].")] = None,
    workspace: Annotated[str | None, typer.Option("--gpu-workspace", help="Override the workspace estimate.")] = None,
    pool_threads: Annotated[int | None, typer.Option("--pool-threads", min=0, help="Cap on CPU pool threads.")] = None,
    bandwidth: Annotated[Path | None, typer.Option("--bandwidth", help="`glm53 probe --json` output.")] = None,
    learn_fraction: Annotated[
        float | None,
        typer.Option(
            "--learn-fraction",
            help="Trace share to learn from [vLLM plan: 0.8; exllamav3: 0.5, static vs dynamic placement].",
            show_default=False,
        ),
    ] = None,
    host_root: Annotated[
        Path, typer.Option("--host-root", help="Read /proc and /sys under this root.", hidden=True)
    ] = Path("/"),
    env: Annotated[bool, typer.Option("--env", help="Print KEY=VALUE lines for the entrypoint.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write plan.json, plan.env and rankings here." + OUT_POLICY)
    ] = None,
    json_mode: JsonOpt = False,
) -> None:
    """Plan for this host, or for a rig it is not (--rig, --ram, --cpus, --gpu-memory).

    Model facts come from --model-dir, else the published ones. Profile values come from the flags, else from
    --profile, else the recipe's. An exllamav3 profile (exl3-*) gets the ExLlamaV3 plan: the layer split over
    the GPUs, the routed experts on the CPU (split or whole-layer offload), the host RAM and the predicted
    decode rate; with a routing trace, static against dynamic expert placement.

    Examples:
      glm53 plan --rig recipe-2x3090
      glm53 plan --gpu-memory 24GiB,24GiB --ram 128GiB --cpus 32cx2t/8
      glm53 plan --profile exl3-2x3090 --rig recipe-2x3090
      glm53 plan --profile exl3-1gpu --rig one-3090 --stats routing.jsonl --out plan/
    """
    if ctx.invoked_subcommand is not None:
        return
    if profile is not None and _engine(profile) == "exllamav3":
        vllm_only = {
            "--tp": tp,
            "--kv-cache-memory": kv_cache_memory,
            "--gpu-memory-utilization": utilization,
            "--max-num-batched-tokens": batched,
            "--gpu-workspace": workspace,
            "--bandwidth": bandwidth,
            "--ram": ram,
            "--cpus": cpus,
        }
        given = [flag for flag, value in vllm_only.items() if value is not None]
        if given:
            raise BadInput(
                f"{', '.join(given)}: vLLM plan options; profile {profile} runs on exllamav3",
                hint="see `glm53 plan --help`; the ExLlamaV3 plan takes --rig, --gpu-memory, --max-model-len, "
                "--max-num-seqs, --pool-threads, --stats, --out",
            )
        _plan_exl3(
            profile,
            model_dir=model_dir,
            rig=rig,
            stats=stats,
            gpus=(gpu_memory, gpus, gpu),
            overrides={"max_model_len": max_model_len, "max_num_seqs": seqs, "pool_threads": pool_threads},
            learn_fraction=learn_fraction,
            host_root=host_root,
            env=env,
            out=out,
            json_mode=json_mode,
        )
        return

    output = Output(json_mode=json_mode)
    if env and json_mode:
        raise BadInput("--env and --json both print to stdout: choose one")
    if out is not None:
        check_out_dir(out)
    target = target_from_options(rig, ram, cpus)
    shape = serving_shape(
        profile,
        tensor_parallel_size=tp,
        max_model_len=max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=utilization,
        pool_threads=pool_threads,
        kv_cache_memory=kv_cache_memory,
        gpu_workspace=workspace,
    )
    saved = save_plan(
        plan_for_host(
            shape,
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


def _engine(profile: str) -> str:
    return load_profile(profile).engine


def _plan_exl3(
    profile: str,
    *,
    model_dir: Path | None,
    rig: str | None,
    stats: Path | None,
    gpus: tuple[str | None, int | None, str | None],
    overrides: dict[str, int | None],
    learn_fraction: float | None,
    host_root: Path,
    env: bool,
    out: Path | None,
    json_mode: bool,
) -> None:
    """`glm53 plan --profile exl3-*`: the ExLlamaV3 planner, its tables and files."""
    output = Output(json_mode=json_mode)
    if env and json_mode:
        raise BadInput("--env and --json both print to stdout: choose one")
    if out is not None:
        check_out_dir(out)
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
    traces: Annotated[Path, typer.Option("--traces", help="Routing trace (JSONL or .npz).")],
    budgets: Annotated[
        str, typer.Option("--budgets", help="GPU slot budgets as fractions of all experts.")
    ] = "0.08,0.17,0.33",
    learn_fraction: Annotated[float, typer.Option("--learn-fraction", help="Trace share to learn from.")] = 0.2,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor parallelism for the cost model.")] = 2,
    bandwidth: Annotated[Path | None, typer.Option("--bandwidth", help="`glm53 probe --json` output.")] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Processes (default: every allowed CPU).")
    ] = None,
    plots: Annotated[Path | None, typer.Option("--plots", help="Write miss-ratio curve PNGs here.")] = None,
    drift: Annotated[
        str,
        typer.Option(
            "--drift",
            help="Drift scenarios AT:STRENGTH[,...] replayed besides the trace: popularity shifted from AT (share "
            "of the steps) on, STRENGTH of each layer's experts re-permuted; 'none' for none.",
        ),
    ] = "0.5:1,0.15:1,0.5:0.5",
    drift_seed: Annotated[int, typer.Option("--drift-seed", min=0, help="Seed of the drift permutations.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Write the report JSON here." + OUT_POLICY)] = None,
    json_mode: JsonOpt = False,
) -> None:
    """Replay a trace through uniform LRU, the recipe's 20%-pinned LRU, the planned split and Belady's MIN.

    glm53 plan simulate --traces routing.jsonl --plots plots/
    """
    output = Output(json_mode=json_mode)
    fractions = parse_budgets(budgets)
    scenarios = parse_shifts(drift, flag="--drift")
    if out is not None and out.is_dir():
        raise BadInput(f"--out {out} is a directory", hint="give the report file's path, e.g. --out report.json")
    if plots is not None:
        check_out_dir(plots, what="--plots")
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
    require_finite(result.model_dump(mode="json"), what="the simulation report")
    if out is not None:
        atomic_write_json(out, result.model_dump(mode="json"))
        output.info(f"wrote {out}")
    if plots is not None:
        written = plot_miss_ratio_curves(trace, plots, learn_fraction=learn_fraction, report=result)
        output.info(f"wrote {len(written)} plots to {plots}")
    output.result(result, lambda console: render_comparison(result, console))


@trace_app.command("synth")
def synth(
    out: Annotated[
        Path, typer.Option("--out", help="Trace file to write (JSONL; binary numpy if it ends in .npz)." + OUT_POLICY)
    ],
    steps: Annotated[int, typer.Option("--steps", min=2, help="Decode steps (tokens).")] = 20_000,
    layers: Annotated[str, typer.Option("--layers", help="MoE layer ids, list format.")] = "3-44",
    experts: Annotated[int, typer.Option("--experts", min=1, help="Routed experts per layer.")] = 288,
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="Experts per token and layer.")] = 8,
    locality: Annotated[
        float,
        typer.Option("--locality", min=0.0, max=0.99, help="Chance a slot repeats the previous step's expert."),
    ] = 0.3,
    skew_min: Annotated[float, typer.Option("--skew-min", min=0.0, help="Smallest per-layer Zipf skew.")] = 0.4,
    skew_max: Annotated[float, typer.Option("--skew-max", min=0.0, help="Largest per-layer Zipf skew.")] = 1.2,
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same trace).")] = 0,
    shift: Annotated[
        str,
        typer.Option(
            "--shift",
            help="Popularity shifts AT:STRENGTH[,...]: from AT (share of the steps) on, a STRENGTH share of "
            "each layer's experts swap popularity (1 = fully re-permuted).",
        ),
    ] = "none",
    counts: Annotated[Path | None, typer.Option("--counts", help="Also write the counts file here.")] = None,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Write a synthetic routing trace: per-layer Zipf popularity, temporal locality, top-k routing.

    glm53 plan trace synth --out routing.jsonl --steps 20000 --locality 0.3
    """
    output = Output(json_mode=json_mode)
    for path, flag in ((out, "--out"), (counts, "--counts")):
        if path is not None and path.is_dir():
            raise BadInput(f"{flag} {path} is a directory", hint=f"give {flag} the path of the file to write")
        if path is not None and path.exists() and not force:
            raise BadInput(f"{path} already exists", hint="pass --force to replace it")
    given = {
        "layers": parse_layers(layers),
        "experts": experts,
        "top_k": top_k,
        "steps": steps,
        "locality": locality,
        "skew_min": skew_min,
        "skew_max": skew_max,
        "seed": seed,
        "shifts": parse_shifts(shift),
    }
    try:
        spec = SyntheticTraceSpec.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        flag = "--" + field.replace("_", "-")
        raise BadInput(
            f"{flag} {given.get(field)!r}: {error['msg']}", hint="see `glm53 plan trace synth --help`"
        ) from exc
    trace = synthesize_trace(spec)
    write_trace(out, trace)
    if counts is not None:
        write_counts(counts, trace.to_counts())
    summary = {"trace": str(out), "counts": str(counts) if counts else None, **spec.model_dump(mode="json")}
    output.result(summary, lambda console: render_synthetic_trace(out, spec, console))


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app)
