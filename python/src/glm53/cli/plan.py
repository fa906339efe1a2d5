"""`glm53 plan`: plan the expert pools, KV and CPU sets for this host; `plan simulate`; `plan trace synth`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from glm53.cli.options import ForceOpt, JsonOpt
from glm53.errors import BadInput
from glm53.output import Output

if TYPE_CHECKING:
    from glm53.plan.planner import GpuSpec

plan_app = typer.Typer(
    name="plan",
    help="Plan GPU expert slots, KV, host pools and CPU sets; simulate cache policies on routing traces.",
    invoke_without_command=True,
    no_args_is_help=False,
)
trace_app = typer.Typer(name="trace", help="Routing traces: make synthetic ones.", no_args_is_help=True)
plan_app.add_typer(trace_app)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KIB": 1 << 10,
    "KB": 10**3,
    "M": 1 << 20,
    "MIB": 1 << 20,
    "MB": 10**6,
    "G": 1 << 30,
    "GIB": 1 << 30,
    "GB": 10**9,
    "T": 1 << 40,
    "TIB": 1 << 40,
    "TB": 10**12,
}


def parse_size(text: str, *, flag: str) -> int:
    """'24GiB', '24G' (binary), '24GB' (decimal) or plain bytes."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else ""
    if match is None or unit not in _UNITS:
        raise BadInput(f"{flag}: {text!r} is not a size", hint="write e.g. 24GiB, 24576MiB or 25769803776")
    return int(float(match.group(1)) * _UNITS[unit])


def gpus_from_flags(gpu_memory: str | None, gpus: int | None, gpu: str | None) -> list[GpuSpec] | None:
    from glm53.plan.planner import GpuSpec

    if gpu_memory is not None:
        if gpus is not None or gpu is not None:
            raise BadInput("give either --gpu-memory or --gpus with --gpu, not both")
        sizes = [parse_size(part, flag="--gpu-memory") for part in gpu_memory.split(",") if part.strip()]
        return [GpuSpec(index=i, total_bytes=size) for i, size in enumerate(sizes)]
    if gpu is not None or gpus is not None:
        if gpu is None:
            raise BadInput("--gpus needs --gpu SIZE (memory of each GPU)", hint="e.g. --gpus 2 --gpu 24GiB")
        size = parse_size(gpu, flag="--gpu")
        return [GpuSpec(index=i, total_bytes=size) for i in range(gpus or 1)]
    return None


def _state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local/state")
    return Path(base) / "glm53" / "plan"


@plan_app.callback()
def plan(
    ctx: typer.Context,
    model: Annotated[
        Path | None, typer.Option("--model-dir", "-m", help="Checkpoint directory (default: published facts).")
    ] = None,
    stats: Annotated[
        Path | None, typer.Option("--stats", help="Routing trace (JSONL) or counts (JSON).")
    ] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", help="Memory of each GPU: 24GiB,24GiB.")
    ] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="Number of GPUs (with --gpu).")] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Memory of each of --gpus GPUs, e.g. 24GiB.")
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
        typer.Option(
            "--gpu-memory-utilization", min=0.05, max=1.0, help="GPU_MEMORY_UTILIZATION [recipe: 0.94]."
        ),
    ] = None,
    batched: Annotated[
        int | None,
        typer.Option("--max-num-batched-tokens", min=1, help="MAX_NUM_BATCHED_TOKENS [recipe: 8192]."),
    ] = None,
    seqs: Annotated[
        int | None, typer.Option("--max-num-seqs", min=1, help="MAX_NUM_SEQS [recipe: 1].")
    ] = None,
    workspace: Annotated[
        str | None, typer.Option("--gpu-workspace", help="Override the workspace estimate.")
    ] = None,
    pool_threads: Annotated[
        int | None, typer.Option("--pool-threads", min=0, help="Cap on CPU pool threads.")
    ] = None,
    bandwidth: Annotated[
        Path | None, typer.Option("--bandwidth", help="`glm53 probe --json` output.")
    ] = None,
    learn_fraction: Annotated[
        float, typer.Option("--learn-fraction", help="Trace share to learn from.")
    ] = 0.8,
    host_root: Annotated[
        Path, typer.Option("--host-root", help="Read /proc and /sys under this root.", hidden=True)
    ] = Path("/"),
    env: Annotated[bool, typer.Option("--env", help="Print KEY=VALUE lines for the entrypoint.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write plan.json, plan.env and rankings here.")
    ] = None,
    json_mode: JsonOpt = False,
) -> None:
    """Plan for this host (or the GPUs given).

    Profile values come from the flags, else from --profile, else the recipe's.
    """
    if ctx.invoked_subcommand is not None:
        return
    from glm53.fsutil import atomic_write_json, atomic_write_text
    from glm53.plan.env import env_lines, plan_env, write_rankings
    from glm53.plan.planner import ServingShape, plan_for_host, shape_from_profile
    from glm53.plan.render import render_plan

    output = Output(json_mode=json_mode)
    if env and json_mode:
        raise BadInput("--env and --json both print to stdout: choose one")
    if profile is not None:
        from glm53.serve.profiles import load_profile

        base = shape_from_profile(load_profile(profile))
    else:
        base = ServingShape()
    flags: dict[str, object] = {
        "tensor_parallel_size": tp,
        "max_model_len": max_model_len,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "gpu_memory_utilization": utilization,
        "pool_threads": pool_threads,
    }
    updates = {key: value for key, value in flags.items() if value is not None}
    if kv_cache_memory is not None:  # "derive" sets it to None on purpose: size KV for the context
        updates["kv_cache_memory_bytes"] = (
            None if kv_cache_memory == "derive" else parse_size(kv_cache_memory, flag="--kv-cache-memory")
        )
    if workspace is not None:
        updates["gpu_workspace_bytes"] = parse_size(workspace, flag="--gpu-workspace")
    shape = ServingShape.model_validate({**base.model_dump(), **updates})
    result = plan_for_host(
        shape,
        model_dir=model,
        stats_path=stats,
        gpus=gpus_from_flags(gpu_memory, gpus, gpu),
        bandwidth_path=bandwidth,
        root=host_root,
        learn_fraction=learn_fraction,
    )
    rankings_dir = out if out is not None else (_state_dir() if result.cache.rankings is not None else None)
    rankings = write_rankings(result, rankings_dir) if rankings_dir is not None else None
    if rankings is not None:
        output.info(f"wrote the hot-expert rankings to {rankings}")
    result = result.model_copy(update={"rankings_file": str(rankings) if rankings else None})
    variables = plan_env(result, rankings)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "plan.json", result.model_dump(mode="json"))
        atomic_write_text(out / "plan.env", env_lines(variables))
        output.info(f"wrote {out / 'plan.json'} and {out / 'plan.env'}")
    if env:
        typer.echo(env_lines(variables), nl=False)
        return
    output.result(result, lambda console: render_plan(result, console, variables))


@plan_app.command("simulate")
def simulate(
    traces: Annotated[Path, typer.Option("--traces", help="Routing trace (JSONL).")],
    budgets: Annotated[
        str, typer.Option("--budgets", help="GPU slot budgets as fractions of all experts.")
    ] = "0.08,0.17,0.33",
    learn_fraction: Annotated[
        float, typer.Option("--learn-fraction", help="Trace share to learn from.")
    ] = 0.2,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor parallelism for the cost model.")] = 2,
    bandwidth: Annotated[
        Path | None, typer.Option("--bandwidth", help="`glm53 probe --json` output.")
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Processes (default: every allowed CPU).")
    ] = None,
    plots: Annotated[Path | None, typer.Option("--plots", help="Write miss-ratio curve PNGs here.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the report JSON here.")] = None,
    json_mode: JsonOpt = False,
) -> None:
    """Replay a trace through uniform LRU, the recipe's 20%-pinned LRU, the planned split and Belady's MIN.

    glm53 plan simulate --traces routing.jsonl --plots plots/
    """
    from rich.progress import Progress

    from glm53.fsutil import atomic_write_json
    from glm53.plan.checkpoint_facts import load_architecture
    from glm53.plan.comparison import compare_policies
    from glm53.plan.cost_model import build_cost_model, read_probe_bandwidth
    from glm53.plan.kv_budget import derive_kv
    from glm53.plan.render import render_comparison
    from glm53.plan.traces import read_trace

    output = Output(json_mode=json_mode)
    try:
        fractions = [float(part) for part in budgets.split(",") if part.strip()]
    except ValueError as exc:
        raise BadInput(f"--budgets {budgets!r}: expected fractions like 0.08,0.17,0.33") from exc
    trace = read_trace(traces)
    model = load_architecture()
    cost = None
    if (trace.experts, trace.top_k) == (model.n_routed_experts, model.num_experts_per_tok):
        cost = build_cost_model(
            model,
            derive_kv(model, tp),
            tensor_parallel_size=tp,
            bandwidth=read_probe_bandwidth(bandwidth) if bandwidth else None,
        )
    with Progress(console=output.err, transient=True, disable=not output.interactive) as progress:
        task = progress.add_task("learning", total=None)

        def report(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)

        result = compare_policies(
            trace,
            fractions,
            learn_fraction=learn_fraction,
            cost=cost,
            source=str(traces),
            progress=report,
            workers=workers,
        )
    if out is not None:
        atomic_write_json(out, result.model_dump(mode="json"))
        output.info(f"wrote {out}")
    if plots is not None:
        from glm53.plan.plots import plot_miss_ratio_curves

        written = plot_miss_ratio_curves(trace, plots, learn_fraction=learn_fraction, report=result)
        output.info(f"wrote {len(written)} plots to {plots}")
    output.result(result, lambda console: render_comparison(result, console))


def _layer_list(text: str) -> tuple[int, ...]:
    from glm53.host.topology import parse_cpu_list

    layers = parse_cpu_list(text, what="--layers")
    if not layers:
        raise BadInput("--layers is empty", hint="e.g. --layers 3-44")
    return layers


@trace_app.command("synth")
def synth(
    out: Annotated[Path, typer.Option("--out", help="Trace file to write (JSONL).")],
    steps: Annotated[int, typer.Option("--steps", min=2, help="Decode steps (tokens).")] = 20_000,
    layers: Annotated[str, typer.Option("--layers", help="MoE layer ids, list format.")] = "3-44",
    experts: Annotated[int, typer.Option("--experts", min=1, help="Routed experts per layer.")] = 288,
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="Experts per token and layer.")] = 8,
    locality: Annotated[
        float,
        typer.Option(
            "--locality", min=0.0, max=0.99, help="Chance a slot repeats the previous step's expert."
        ),
    ] = 0.3,
    skew_min: Annotated[
        float, typer.Option("--skew-min", min=0.0, help="Smallest per-layer Zipf skew.")
    ] = 0.4,
    skew_max: Annotated[
        float, typer.Option("--skew-max", min=0.0, help="Largest per-layer Zipf skew.")
    ] = 1.2,
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same trace).")] = 0,
    counts: Annotated[Path | None, typer.Option("--counts", help="Also write the counts file here.")] = None,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Write a synthetic routing trace: per-layer Zipf popularity, temporal locality, top-k routing.

    glm53 plan trace synth --out routing.jsonl --steps 20000 --locality 0.3
    """
    from glm53.plan.traces import SyntheticTraceSpec, synthesize_trace, write_counts, write_trace

    output = Output(json_mode=json_mode)
    for path in (out, counts):
        if path is not None and path.exists() and not force:
            raise BadInput(f"{path} already exists", hint="pass --force to replace it")
    spec = SyntheticTraceSpec(
        layers=_layer_list(layers),
        experts=experts,
        top_k=top_k,
        steps=steps,
        locality=locality,
        skew_min=skew_min,
        skew_max=skew_max,
        seed=seed,
    )
    trace = synthesize_trace(spec)
    write_trace(out, trace)
    if counts is not None:
        write_counts(counts, trace.to_counts())
    summary = {"trace": str(out), "counts": str(counts) if counts else None, **spec.model_dump(mode="json")}
    output.result(
        summary,
        lambda console: console.print(
            f"wrote {out}: {steps:,} steps x {len(spec.layers)} layers x top-{top_k} of {experts}"
        ),
    )


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app)
