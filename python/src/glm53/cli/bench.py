"""`glm53 bench`: measure a running server the recipe's way, gate on it, compare reports.

Each command writes its section of OUT/summary.json (atomically; other sections are kept), prints tables or
`--json`, and exits 1 when a gate fails (after the report is written).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from glm53.cli.options import JsonOpt
from glm53.errors import CheckFailed
from glm53.output import Output

if TYPE_CHECKING:
    from glm53.bench.client import BenchClient, ServerInfo
    from glm53.bench.gates import GateResult
    from glm53.bench.report import Environment

bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmark a running server (throughput, needle recall, coherence, agent turns); compare reports.",
)

BaseUrlOpt = Annotated[
    str,
    typer.Option("--base-url", envvar="GLM53_BASE_URL", help="The server's URL (OpenAI-compatible vLLM)."),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Served model name (default: the first in /v1/models).")
]
OutOpt = Annotated[
    Path, typer.Option("--out", help="Report directory: summary.json (+ plots) are written or updated there.")
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=1.0, help="Seconds without data before a request is given up.")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="GLM53_API_KEY",
        help="Bearer token, when the server wants one.",
        show_default=False,
    ),
]
ServeProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--serve-profile", help="Record this serving profile's resolved settings as the plan in force."
    ),
]
EnvFileOpt = Annotated[
    Path | None,
    typer.Option("--env-file", help="The .env file the server was started with (recorded in the plan)."),
]
ReportOnlyOpt = Annotated[
    bool, typer.Option("--report-only", help="Report failing gates without exiting non-zero.")
]
DEFAULT_OUT = Path("glm53-bench")
DEFAULT_URL = "http://127.0.0.1:8000"


def _connect(
    base_url: str, timeout: float, api_key: str | None, model: str | None
) -> tuple[BenchClient, ServerInfo]:
    from glm53.bench.client import BenchClient
    from glm53.errors import BadInput

    if not math.isfinite(timeout):
        raise BadInput(f"--timeout {timeout}: not a finite number of seconds", hint="e.g. --timeout 1800")
    client = BenchClient(base_url, timeout_s=timeout, api_key=api_key)
    try:
        return client, client.server_info(model)
    except Exception:
        client.close()
        raise


def _environment(info: ServerInfo, profile: str | None, env_file: Path | None, out_dir: Path) -> Environment:
    from glm53.bench.report import collect_environment, ensure_same_server, prepare_out_dir
    from glm53.errors import BadInput
    from glm53.serve.profiles import PROFILE_NAMES

    if profile is not None and profile not in PROFILE_NAMES:
        raise BadInput(
            f"--serve-profile {profile!r} is not a known profile",
            hint=f"use one of: {', '.join(PROFILE_NAMES)}",
        )
    prepare_out_dir(out_dir)
    ensure_same_server(out_dir, info)
    return collect_environment(info, profile=profile, env_file=env_file)


@contextmanager
def _measure(
    base_url: str,
    timeout: float,
    api_key: str | None,
    model: str | None,
    profile: str | None,
    env_file: Path | None,
    out_dir: Path,
) -> Iterator[tuple[BenchClient, ServerInfo, Environment]]:
    """Connect, and yield the client, the server and the environment recorded for the report; the client
    is closed on leaving."""
    client, info = _connect(base_url, timeout, api_key, model)
    with client:
        # First, so that a bad --serve-profile, --env-file or --out fails before anything is measured.
        yield client, info, _environment(info, profile, env_file, out_dir)


def _thresholds(
    fail_under: str | None,
    under_allowed: Mapping[str, str],
    fail_over: str | None,
    over_allowed: Mapping[str, str],
) -> tuple[dict[str, float], dict[str, float]]:
    """--fail-under and --fail-over, parsed against the metrics each may name."""
    from glm53.bench.gates import parse_thresholds

    return (
        parse_thresholds(fail_under, under_allowed, flag="--fail-under"),
        parse_thresholds(fail_over, over_allowed, flag="--fail-over"),
    )


def _finish(
    out: Output,
    section: str,
    payload: dict[str, Any],
    gates: list[GateResult],
    render: Any,
    *,
    enforce: bool = True,
    where: str | None = None,
) -> None:
    """Print the result and the gates; exit 1 (CheckFailed) when a gate failed. `where` names the report
    the values come from (default: the summary just written, payload['summary'])."""
    from glm53.bench.gates import failed
    from glm53.bench.render import gates_table
    from glm53.bench.report import finite_or_none

    # As in summary.json: JSON has no NaN or infinity, so `--json` prints null for such a value.
    payload = finite_or_none({**payload, "gates": [g.model_dump(mode="json") for g in gates]})
    report = where or f"the report in {payload['summary']}"

    def show(console: Console) -> None:
        render(console)
        gates_table(console, gates)
        if "summary" in payload:
            console.print(f"report: {payload['summary']}")

    out.result(payload, show)
    bad = failed(gates)
    if bad and enforce:
        names = ", ".join(f"{g.name} ({g.subject})" for g in bad)
        raise CheckFailed(
            f"{section}: {len(bad)} of {len(gates)} gates failed: {names}",
            hint=f"{report} keeps every value and reason",
        )


@bench_app.command("run")
def run_cmd(
    base_url: BaseUrlOpt = DEFAULT_URL,
    shapes: Annotated[str, typer.Option("--shapes", help="PROMPT:OUTPUT token counts, comma-separated.")] = (
        "8192:2048,131072:2048,260096:2048"
    ),
    runs: Annotated[
        int, typer.Option("--runs", min=1, help="Runs per shape; the best is reported, all kept.")
    ] = 2,
    style: Annotated[
        str, typer.Option("--style", help="Prompt style: prose (tiled text) or random ids.")
    ] = "prose",
    model: ModelOpt = None,
    out_dir: OutOpt = DEFAULT_OUT,
    fail_under: Annotated[
        str | None,
        typer.Option("--fail-under", help="Minimums, e.g. decode=45,prefill=1000 (tok/s, every shape)."),
    ] = None,
    fail_over: Annotated[
        str | None, typer.Option("--fail-over", help="Maximums, e.g. ttft=10 (seconds, every shape).")
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write TTFT and decode PNGs.")] = True,
    timeout: TimeoutOpt = 1800.0,
    api_key: ApiKeyOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: EnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Throughput: TTFT, prefill and decode tok/s per shape, best of N, exact-length token-id prompts.

    Example: glm53 bench run --base-url http://127.0.0.1:8000 --fail-under decode=45
    """
    from glm53.bench.prompts import PROMPT_STYLES, PromptFactory
    from glm53.bench.render import run_tables
    from glm53.bench.report import write_section
    from glm53.bench.runner import (
        RUN_FAIL_OVER,
        RUN_FAIL_UNDER,
        check_fits,
        parse_shapes,
        run_benchmark,
        run_gates,
    )
    from glm53.errors import BadInput

    if style not in PROMPT_STYLES:
        raise BadInput(f"--style {style!r} is not one of {', '.join(PROMPT_STYLES)}")
    parsed = parse_shapes(shapes)
    under, over = _thresholds(fail_under, RUN_FAIL_UNDER, fail_over, RUN_FAIL_OVER)
    out = Output(json_mode=json_out)
    with _measure(base_url, timeout, api_key, model, serve_profile, env_file, out_dir) as (client, info, environment):
        check_fits(parsed, info.max_model_len)
        prompts = PromptFactory(client, info.model)
        out.info(f"benchmarking {info.model} at {info.base_url}: {len(parsed)} shapes x {runs} runs")
        with _progress(out, len(parsed) * runs, "requests") as step:

            def progress(record: Any) -> None:
                verdict = "valid" if record.valid else f"INVALID: {record.invalid_reason}"
                step(
                    f"  {record.shape} run {record.run}: TTFT {_fmt(record.ttft_ms)} ms, "
                    f"decode {_fmt(record.decode_tok_s)} tok/s, {verdict}"
                )

            section = run_benchmark(
                client, prompts, info.model, parsed, runs=runs, style=style, on_run=progress
            )
    gates = run_gates(section, under, over)
    path = write_section(out_dir, environment, run=section, gates={"run": gates})
    written = _plots(out, section, out_dir) if plots else []
    payload = {
        "summary": str(path),
        "plots": [str(p) for p in written],
        "run": section.model_dump(mode="json"),
    }
    _finish(out, "run", payload, gates, lambda console: run_tables(console, section))
    empty = [shape.shape for shape in section.shapes if shape.best.valid_runs == 0]
    if empty:
        raise CheckFailed(f"no valid run for {', '.join(empty)}", hint=f"each run's reason is in {path}")


def _plots(out: Output, section: Any, out_dir: Path) -> list[Path]:
    from glm53.bench.compare import recipe_performance
    from glm53.bench.plots import write_plots
    from glm53.errors import BadInput, Unavailable

    recipe = recipe_performance()
    try:
        return write_plots(
            section,
            out_dir,
            recipe=recipe.profiles[recipe.default_profile],
            recipe_label=f"recipe ({recipe.default_profile})",
        )
    except (Unavailable, BadInput) as exc:
        # The summary is written by now: a plot that cannot be written must not hide its result.
        out.warn(f"{exc.message}; plots skipped")
        return []


@bench_app.command("needle")
def needle_cmd(
    base_url: BaseUrlOpt = DEFAULT_URL,
    sizes: Annotated[str, typer.Option("--sizes", help="Prompt sizes in tokens, comma-separated.")] = (
        "32768,131072,260096"
    ),
    depths: Annotated[str, typer.Option("--depths", help="Needle depths, fractions of the prompt.")] = (
        "0.05,0.25,0.5,0.75,0.95"
    ),
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=8, help="Answer budget per question.")] = 96,
    model: ModelOpt = None,
    out_dir: OutOpt = DEFAULT_OUT,
    fail_under: Annotated[
        str | None,
        typer.Option("--fail-under", help="pass-rate=0.8 accepts some misses (default: all must pass)."),
    ] = None,
    report_only: ReportOnlyOpt = False,
    timeout: TimeoutOpt = 1800.0,
    api_key: ApiKeyOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: EnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Needle recall: an exact JSON record at each depth of each prompt size, asked back verbatim.

    Example: glm53 bench needle --sizes 32768,131072 --depths 0.05,0.5,0.95
    """
    from glm53.bench.gates import parse_thresholds
    from glm53.bench.needle import NEEDLE_FAIL_UNDER, needle_gates, parse_depths, parse_sizes, run_needles
    from glm53.bench.prompts import PromptFactory
    from glm53.bench.render import needle_table
    from glm53.bench.report import write_section

    parsed_sizes, parsed_depths = parse_sizes(sizes), parse_depths(depths)
    under = parse_thresholds(fail_under, NEEDLE_FAIL_UNDER, flag="--fail-under")
    out = Output(json_mode=json_out)
    with (
        _measure(base_url, timeout, api_key, model, serve_profile, env_file, out_dir) as (client, info, environment),
        _progress(out, len(parsed_sizes) * len(parsed_depths), "needles") as step,
    ):
        section = run_needles(
            client,
            PromptFactory(client, info.model),
            info.model,
            parsed_sizes,
            parsed_depths,
            max_tokens=max_tokens,
            max_model_len=info.max_model_len,
            on_result=lambda r: step(
                f"  {r.size_tokens} @ {r.depth:.2f}: {'pass' if r.passed else r.reason}"
            ),
        )
    gates = needle_gates(section, under)
    path = write_section(out_dir, environment, needle=section, gates={"needle": gates})
    payload = {
        "summary": str(path),
        "needle": section.model_dump(mode="json"),
        "pass_rate": section.pass_rate,
    }
    _finish(
        out, "needle", payload, gates, lambda console: needle_table(console, section), enforce=not report_only
    )


@bench_app.command("coherence")
def coherence_cmd(
    base_url: BaseUrlOpt = DEFAULT_URL,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=8, help="Token budget per answer (thinking included).")
    ] = 6144,
    model: ModelOpt = None,
    out_dir: OutOpt = DEFAULT_OUT,
    report_only: ReportOnlyOpt = False,
    timeout: TimeoutOpt = 1800.0,
    api_key: ApiKeyOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: EnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Coherence gates: 17 x 23 = 391, a get_weather call with the city, `def is_prime` with thinking off.

    Example: glm53 bench coherence --base-url http://127.0.0.1:8000
    """
    from glm53.bench.coherence import PROBES, coherence_gates, run_coherence
    from glm53.bench.render import coherence_table
    from glm53.bench.report import write_section

    out = Output(json_mode=json_out)
    with (
        _measure(base_url, timeout, api_key, model, serve_profile, env_file, out_dir) as (client, info, environment),
        _progress(out, len(PROBES), "prompts") as step,
    ):
        section = run_coherence(
            client,
            info.model,
            max_tokens=max_tokens,
            on_result=lambda r: step(f"  {r.name}: {'pass' if r.passed else r.reason}"),
        )
    gates = coherence_gates(section)
    path = write_section(out_dir, environment, coherence=section, gates={"coherence": gates})
    payload = {"summary": str(path), "coherence": section.model_dump(mode="json")}
    _finish(
        out,
        "coherence",
        payload,
        gates,
        lambda console: coherence_table(console, section),
        enforce=not report_only,
    )


@bench_app.command("agent")
def agent_cmd(
    base_url: BaseUrlOpt = DEFAULT_URL,
    tasks: Annotated[
        int, typer.Option("--tasks", min=1, help="Run the first N of the 15 scripted tasks.")
    ] = 15,
    system_tokens: Annotated[
        int, typer.Option("--system-tokens", min=0, help="Size of the shared system prompt, in tokens.")
    ] = 2048,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=2, help="Token budget per turn.")] = 1024,
    model: ModelOpt = None,
    out_dir: OutOpt = DEFAULT_OUT,
    fail_under: Annotated[
        str | None, typer.Option("--fail-under", help="Minimums, e.g. cache-hit=60,decode=30 (%, tok/s).")
    ] = None,
    fail_over: Annotated[
        str | None, typer.Option("--fail-over", help="Maximums, e.g. turn-latency=10 (seconds).")
    ] = None,
    timeout: TimeoutOpt = 1800.0,
    api_key: ApiKeyOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: EnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Agent turns: scripted multi-turn tool use; prefix-cache hit %, tool-call turn latency, decode tok/s.

    Example: glm53 bench agent --fail-under cache-hit=60
    """
    from glm53.bench.agent import AGENT_FAIL_OVER, AGENT_FAIL_UNDER, agent_gates, load_script, run_agent
    from glm53.bench.prompts import PromptFactory
    from glm53.bench.render import agent_tables
    from glm53.bench.report import write_section
    from glm53.errors import BadInput

    script = load_script().first(tasks)
    under, over = _thresholds(fail_under, AGENT_FAIL_UNDER, fail_over, AGENT_FAIL_OVER)
    out = Output(json_mode=json_out)
    with _measure(base_url, timeout, api_key, model, serve_profile, env_file, out_dir) as (client, info, environment):
        if info.max_model_len is not None and system_tokens + max_tokens >= info.max_model_len:
            raise BadInput(
                f"--system-tokens {system_tokens} + --max-tokens {max_tokens} leave no room for the "
                f"conversation: the server's max_model_len is {info.max_model_len}",
                hint="pass smaller --system-tokens or --max-tokens",
            )
        with _progress(out, script.turns, "turns") as step:
            section = run_agent(
                client,
                PromptFactory(client, info.model),
                info.model,
                script=script,
                system_tokens=system_tokens,
                max_tokens=max_tokens,
                on_turn=lambda t: step(
                    f"  {t.task} turn {t.turn}: {_fmt(t.latency_s)} s" + (f", {t.error}" if t.error else "")
                ),
            )
    gates = agent_gates(section, under, over)
    path = write_section(out_dir, environment, agent=section, gates={"agent": gates})
    payload = {"summary": str(path), "agent": section.model_dump(mode="json")}
    _finish(out, "agent", payload, gates, lambda console: agent_tables(console, section))
    if not any(turn.error is None for turn in section.turns):
        first = section.turns[0].error if section.turns else "no turn ran"
        raise CheckFailed(
            f"agent: none of the {len(section.turns)} turns completed (first error: {first})",
            hint=f"each turn's error is in {path}",
        )


@bench_app.command("compare")
def compare_cmd(
    a: Annotated[
        Path, typer.Argument(help="Baseline report (summary.json or its directory).", show_default=False)
    ],
    b: Annotated[
        Path | None,
        typer.Argument(
            help="Candidate report; without it, A is compared with the recipe's published points.",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="Recipe profile to compare with: prefill-256k or agent-256k."),
    ] = None,
    fail_under: Annotated[
        str | None,
        typer.Option(
            "--fail-under",
            help="Minimums on the candidate (B, or the one report), e.g. decode=45,prefill=1000 (tok/s).",
        ),
    ] = None,
    fail_over: Annotated[
        str | None,
        typer.Option("--fail-over", help="Maximums on the candidate, e.g. ttft=10 (seconds, every shape)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Deltas side by side: A vs B, or (one report) the recipe vs this report; optionally a gate.

    Example: glm53 bench compare glm53-bench            # vs the recipe
             glm53 bench compare before/ after/ --fail-under decode=45
    """
    from glm53.bench.compare import (
        COMPARE_FAIL_OVER,
        COMPARE_FAIL_UNDER,
        compare_gates,
        compare_summaries,
        compare_to_recipe,
    )
    from glm53.bench.render import comparison_table
    from glm53.bench.report import load_summary

    under, over = _thresholds(fail_under, COMPARE_FAIL_UNDER, fail_over, COMPARE_FAIL_OVER)
    first = load_summary(a)
    if b is None:
        candidate, candidate_path = first, a
        comparison = compare_to_recipe(first, profile=profile, label=str(a))
    else:
        candidate, candidate_path = load_summary(b), b
        comparison = compare_summaries(first, candidate, a_label=str(a), b_label=str(b))
    out = Output(json_mode=json_out)
    if not under and not over:
        out.result(comparison, lambda console: comparison_table(console, comparison))
        return
    gates = compare_gates(candidate, under, over)
    payload = {**comparison.model_dump(mode="json"), "gated": str(candidate_path)}
    _finish(
        out,
        "compare",
        payload,
        gates,
        lambda console: comparison_table(console, comparison),
        where=f"the report {candidate_path}",
    )


@contextmanager
def _progress(out: Output, total: int, unit: str) -> Iterator[Callable[[str], None]]:
    """Yields step(line): print a finished item's line and advance. On a terminal, a bar with the elapsed
    time (a 260K-token prefill is minutes of silence); plain lines on stderr otherwise."""
    if not out.interactive:
        yield out.info
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (SpinnerColumn(), TextColumn(unit), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=out.err, transient=True) as progress:
        task = progress.add_task(unit, total=total)

        def step(line: str) -> None:
            progress.console.print(line, highlight=False)
            progress.advance(task)

        yield step


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
