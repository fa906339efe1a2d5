"""`glm53 bench`: measure a running server the recipe's way, gate on it, compare reports.

Each command writes its section of OUT/summary.json (atomically; other sections are kept), prints tables or
`--json`, and exits 1 when a gate fails (after the report is written).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from glm53.bench.agent import (
    AGENT_FAIL_OVER,
    AGENT_FAIL_UNDER,
    agent_gates,
    load_script,
    require_completed_turns,
    run_agent,
    scripted_tokens,
)
from glm53.bench.agent import (
    check_fits as check_agent_fits,
)
from glm53.bench.backends import SplitTracker, parse_backends
from glm53.bench.coherence import PROBES, PROMPT_ALLOWANCE, coherence_gates, run_coherence
from glm53.bench.compare import COMPARE_FAIL_OVER, COMPARE_FAIL_UNDER, compare_gates, compare_reports
from glm53.bench.gates import GateResult, enforce_gates, parse_limits, parse_thresholds
from glm53.bench.needle import NEEDLE_FAIL_UNDER, needle_gates, parse_depths, parse_sizes, run_needles
from glm53.bench.plots import write_report_plots
from glm53.bench.prompts import PromptFactory, parse_style
from glm53.bench.render import (
    agent_tables,
    coherence_line,
    coherence_table,
    comparison_table,
    needle_line,
    needle_table,
    run_line,
    run_tables,
    turn_line,
    with_gates,
)
from glm53.bench.report import json_safe, write_section
from glm53.bench.runner import (
    RUN_FAIL_OVER,
    RUN_FAIL_UNDER,
    fitting_shapes,
    parse_shapes,
    require_valid_runs,
    run_benchmark,
    run_gates,
)
from glm53.bench.runner import (
    check_fits as check_shapes_fit,
)
from glm53.bench.session import Target, check_answer_fits, checkpointer, gated_payload, measuring, resolve_api_key
from glm53.cli.options import (
    BackendOpt,
    BaseUrlOpt,
    BenchApiKeyFileOpt,
    BenchApiKeyOpt,
    JsonOpt,
    ReportDirOpt,
    ReportOnlyOpt,
    RequestTimeoutOpt,
    ServedEnvFileOpt,
    ServedModelOpt,
    ServeProfileOpt,
)
from glm53.output import Output

bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmark a running server (throughput, needle recall, coherence, agent turns); compare reports.",
)

DEFAULT_OUT = Path("glm53-bench")
DEFAULT_URL = "http://127.0.0.1:8000"


def _attributed(
    tracker: SplitTracker | None, show: Callable[[Any], None], key: Callable[[Any], str | None] | None = None
) -> Callable[[Any], None]:
    """A per-request callback that first names the backend that served the request (with --backend: from the
    counters its own after-snapshot read), then shows its line."""

    def on(record: Any) -> None:
        if tracker is not None:
            record.backend = tracker.observe(key(record) if key is not None else None)
        show(record)

    return on


def _finish(
    out: Output,
    section: str,
    payload: dict[str, Any],
    gates: list[GateResult],
    render: Callable[[Console], None],
    *,
    enforce: bool = True,
    where: str | None = None,
) -> None:
    """Print the result and its gates; exit 1 when a gate failed. `where` names the report the values come
    from (default: the summary just written, payload['summary'])."""
    payload = gated_payload(payload, gates)
    out.result(payload, with_gates(render, gates, payload.get("summary")))
    if enforce:
        enforce_gates(section, gates, report=where or f"the report in {payload['summary']}")


@bench_app.command("run")
def run_cmd(
    base_url: BaseUrlOpt = DEFAULT_URL,
    shapes: Annotated[
        str | None,
        typer.Option(
            "--shapes",
            help="PROMPT:OUTPUT token counts, comma-separated. Default: the recipe's 8192:2048,131072:2048,"
            "260096:2048, those that fit the server's max_model_len (when none does, one shape of half of it).",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs per shape; the best is reported, all kept.")] = 2,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            help="Extra runs per shape in place of runs rejected for implausible timing (a stream the client "
            "cannot time and the engine's /metrics cannot vouch for); the rejected runs stay in the report.",
        ),
    ] = 2,
    style: Annotated[str, typer.Option("--style", help="Prompt style: prose (tiled text) or random ids.")] = "prose",
    model: ServedModelOpt = None,
    out_dir: ReportDirOpt = DEFAULT_OUT,
    fail_under: Annotated[
        str | None,
        typer.Option("--fail-under", help="Minimums, e.g. decode=45,prefill=1000 (tok/s, every shape)."),
    ] = None,
    fail_over: Annotated[
        str | None, typer.Option("--fail-over", help="Maximums, e.g. ttft=10 (seconds, every shape).")
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write TTFT and decode PNGs.")] = True,
    backends: BackendOpt = None,
    timeout: RequestTimeoutOpt = 1800.0,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: ServedEnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Throughput: TTFT, prefill and decode tok/s per shape, best of N, exact-length token-id prompts.

    Example: glm53 bench run --base-url http://127.0.0.1:8000 --fail-under decode=45
             glm53 bench run --base-url http://router:8100 --backend http://10.0.0.11:8000 --backend http://10.0.0.12:8000
    """
    prompt_style = parse_style(style)
    parsed = parse_shapes(shapes) if shapes is not None else None
    behind = tuple(parse_backends(backends))
    under, over = parse_limits(fail_under, RUN_FAIL_UNDER, fail_over, RUN_FAIL_OVER)
    out = Output(json_mode=json_out)
    target = Target(
        base_url=base_url,
        model=model,
        timeout_s=timeout,
        api_key=resolve_api_key(api_key, api_key_file),
        serve_profile=serve_profile,
        env_file=env_file,
        out_dir=out_dir,
        backends=behind,
    )
    with measuring(target) as session:
        if parsed is None:
            parsed, note = fitting_shapes(session.server.max_model_len)
            if note is not None:
                out.info(note)
        check_shapes_fit(parsed, session.server.max_model_len)
        tracker = session.tracker
        served = session.server.model
        out.info(f"benchmarking {served} at {session.server.base_url}: {len(parsed)} shapes x {runs} runs")
        with out.progress("requests", total=len(parsed) * runs) as bar:
            section = run_benchmark(
                session.client,
                PromptFactory(session.client, served),
                served,
                parsed,
                runs=runs,
                retries=retries,
                style=prompt_style,
                on_run=_attributed(tracker, lambda record: bar.step(run_line(record))),
                on_retry=bar.extend,
                on_section=checkpointer(out_dir, session.environment, "run", out.warn),
            )
        if tracker is not None:
            section = section.model_copy(update={"backends": tracker.finish()})
    gates = run_gates(section, under, over)
    path = write_section(out_dir, session.environment, run=section, gates={"run": gates})
    written = write_report_plots(section, out_dir, warn=out.warn) if plots else []
    payload = {
        "summary": str(path),
        "plots": [str(p) for p in written],
        "run": section.model_dump(mode="json"),
    }
    _finish(out, "run", payload, gates, lambda console: run_tables(console, section))
    require_valid_runs(section, path)


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
    model: ServedModelOpt = None,
    out_dir: ReportDirOpt = DEFAULT_OUT,
    fail_under: Annotated[
        str | None,
        typer.Option("--fail-under", help="pass-rate=0.8 accepts some misses (default: all must pass)."),
    ] = None,
    report_only: ReportOnlyOpt = False,
    timeout: RequestTimeoutOpt = 1800.0,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: ServedEnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Needle recall: an exact JSON record at each depth of each prompt size, asked back verbatim.

    Example: glm53 bench needle --sizes 32768,131072 --depths 0.05,0.5,0.95
    """
    parsed_sizes, parsed_depths = parse_sizes(sizes), parse_depths(depths)
    under = parse_thresholds(fail_under, NEEDLE_FAIL_UNDER, flag="--fail-under")
    out = Output(json_mode=json_out)
    target = Target(
        base_url=base_url,
        model=model,
        timeout_s=timeout,
        api_key=resolve_api_key(api_key, api_key_file),
        serve_profile=serve_profile,
        env_file=env_file,
        out_dir=out_dir,
    )
    with (
        measuring(target) as session,
        out.progress("needles", total=len(parsed_sizes) * len(parsed_depths)) as bar,
    ):
        section = run_needles(
            session.client,
            PromptFactory(session.client, session.server.model),
            session.server.model,
            parsed_sizes,
            parsed_depths,
            max_tokens=max_tokens,
            max_model_len=session.server.max_model_len,
            on_result=lambda result: bar.step(needle_line(result)),
            on_section=checkpointer(out_dir, session.environment, "needle", out.warn),
        )
    gates = needle_gates(section, under)
    path = write_section(out_dir, session.environment, needle=section, gates={"needle": gates})
    payload = {
        "summary": str(path),
        "needle": section.model_dump(mode="json"),
        "pass_rate": section.pass_rate,
    }
    _finish(out, "needle", payload, gates, lambda console: needle_table(console, section), enforce=not report_only)


@bench_app.command("coherence")
def coherence_cmd(
    base_url: BaseUrlOpt = DEFAULT_URL,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=8, help="Token budget per answer (thinking included).")
    ] = 6144,
    model: ServedModelOpt = None,
    out_dir: ReportDirOpt = DEFAULT_OUT,
    report_only: ReportOnlyOpt = False,
    timeout: RequestTimeoutOpt = 1800.0,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: ServedEnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Coherence gates: 17 x 23 = 391, a get_weather call with the city, `def is_prime` with thinking off.

    Example: glm53 bench coherence --base-url http://127.0.0.1:8000
    """
    out = Output(json_mode=json_out)
    target = Target(
        base_url=base_url,
        model=model,
        timeout_s=timeout,
        api_key=resolve_api_key(api_key, api_key_file),
        serve_profile=serve_profile,
        env_file=env_file,
        out_dir=out_dir,
    )
    with measuring(target) as session:
        check_answer_fits(
            max_tokens, session.server.max_model_len, prompt_allowance=PROMPT_ALLOWANCE, flag="--max-tokens"
        )
        with out.progress("prompts", total=len(PROBES)) as bar:
            section = run_coherence(
                session.client,
                session.server.model,
                max_tokens=max_tokens,
                on_result=lambda result: bar.step(coherence_line(result)),
                on_section=checkpointer(out_dir, session.environment, "coherence", out.warn),
            )
    gates = coherence_gates(section)
    path = write_section(out_dir, session.environment, coherence=section, gates={"coherence": gates})
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
    tasks: Annotated[int, typer.Option("--tasks", min=1, help="Run the first N of the 15 scripted tasks.")] = 15,
    system_tokens: Annotated[
        int, typer.Option("--system-tokens", min=0, help="Size of the shared system prompt, in tokens.")
    ] = 2048,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=2, help="Token budget per turn.")] = 1024,
    model: ServedModelOpt = None,
    out_dir: ReportDirOpt = DEFAULT_OUT,
    fail_under: Annotated[
        str | None, typer.Option("--fail-under", help="Minimums, e.g. cache-hit=60,decode=30 (%, tok/s).")
    ] = None,
    fail_over: Annotated[
        str | None, typer.Option("--fail-over", help="Maximums, e.g. turn-latency=10 (seconds).")
    ] = None,
    backends: BackendOpt = None,
    timeout: RequestTimeoutOpt = 1800.0,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    serve_profile: ServeProfileOpt = None,
    env_file: ServedEnvFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Agent turns: scripted multi-turn tool use; prefix-cache hit %, tool-call turn latency, decode tok/s.

    Each conversation sends one stable X-Session-ID header, so a router's consistent_hash keeps its turns on
    one backend; --backend (repeatable) adds the per-backend split from the backends' own /metrics.

    Example: glm53 bench agent --fail-under cache-hit=60
             glm53 bench agent --base-url http://router:8100 --backend http://10.0.0.11:8000 --backend http://10.0.0.12:8000
    """
    script = load_script().first(tasks)
    under, over = parse_limits(fail_under, AGENT_FAIL_UNDER, fail_over, AGENT_FAIL_OVER)
    behind = tuple(parse_backends(backends))
    out = Output(json_mode=json_out)
    target = Target(
        base_url=base_url,
        model=model,
        timeout_s=timeout,
        api_key=resolve_api_key(api_key, api_key_file),
        serve_profile=serve_profile,
        env_file=env_file,
        out_dir=out_dir,
        backends=behind,
    )
    with measuring(target) as session:
        if session.server.max_model_len is not None:
            served = session.server.model
            scripted = scripted_tokens(script, lambda text: len(session.client.tokenize(served, text)))
            check_agent_fits(system_tokens, max_tokens, session.server.max_model_len, scripted)
        tracker = session.tracker
        with out.progress("turns", total=script.turns) as bar:
            section = run_agent(
                session.client,
                PromptFactory(session.client, session.server.model),
                session.server.model,
                script=script,
                system_tokens=system_tokens,
                max_tokens=max_tokens,
                on_turn=_attributed(tracker, lambda turn: bar.step(turn_line(turn)), key=lambda turn: turn.session_id),
                on_section=checkpointer(out_dir, session.environment, "agent", out.warn),
            )
        if tracker is not None:
            section = section.model_copy(update={"backends": tracker.finish()})
    gates = agent_gates(section, under, over)
    path = write_section(out_dir, session.environment, agent=section, gates={"agent": gates})
    payload = {"summary": str(path), "agent": section.model_dump(mode="json")}
    _finish(out, "agent", payload, gates, lambda console: agent_tables(console, section))
    require_completed_turns(section, path)


@bench_app.command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="Baseline report (summary.json or its directory).", show_default=False)],
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
    under, over = parse_limits(fail_under, COMPARE_FAIL_UNDER, fail_over, COMPARE_FAIL_OVER)
    compared = compare_reports(a, b, profile=profile)
    comparison = compared.comparison
    out = Output(json_mode=json_out)
    if not under and not over:
        # Valid JSON only: a value that is not a finite number is null, and `non_finite` says which.
        out.result(json_safe(comparison.model_dump(mode="json")), lambda console: comparison_table(console, comparison))
        return
    gates = compare_gates(compared.candidate, under, over)
    payload = {**comparison.model_dump(mode="json"), "gated": str(compared.candidate_path)}
    _finish(
        out,
        "compare",
        payload,
        gates,
        lambda console: comparison_table(console, comparison),
        where=f"the report {compared.candidate_path}",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
