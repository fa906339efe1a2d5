"""`glm53 bench`: measure a running server the recipe's way, gate on it, compare reports.

Each command writes its section of OUT/summary.json (atomically; other sections are kept), prints tables or
`--json`, and exits 1 when a gate fails (after the report is written).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

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
from glm53.bench.backends import parse_backends
from glm53.bench.coherence import PROBES, PROMPT_ALLOWANCE, coherence_gates, run_coherence
from glm53.bench.compare import COMPARE_FAIL_OVER, COMPARE_FAIL_UNDER, compare_gates, compare_reports
from glm53.bench.gates import enforce_gates, parse_limits, parse_thresholds
from glm53.bench.needle import NEEDLE_FAIL_UNDER, needle_gates, parse_depths, parse_sizes, run_needles
from glm53.bench.outcome import AgentOutcome, CoherenceOutcome, GatedComparison, NeedleOutcome, RunOutcome
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
from glm53.bench.session import check_answer_fits, checkpointer, measuring, resolve_api_key
from glm53.bench.target import Target
from glm53.cli.app import App
from glm53.cli.model_options import Flag, options_from
from glm53.cli.options import BenchApiKeyFileOpt, BenchApiKeyOpt, FiguresOpt, JsonOpt, ProfileName, ReportOnlyOpt
from glm53.output import Output

if TYPE_CHECKING:
    from pydantic import BaseModel

    from glm53.bench.backends import SplitTracker
    from glm53.bench.gates import GateResult
    from glm53.bench.session import Session

bench_app = App(
    no_args_is_help=True,
    help="Benchmark a running server (throughput, needle recall, coherence, agent turns); compare reports.",
)


def _backends(urls: list[str]) -> tuple[str, ...]:
    return tuple(parse_backends(urls))


# The options every measuring command takes, from the Target model: one declaration, four commands.
TARGET_FIELDS = ("base_url", "model", "out_dir", "timeout_s", "serve_profile", "env_file")
TARGET_FLAGS = {
    "base_url": Flag(envvar="GLM53_BASE_URL"),
    "out_dir": Flag("--out"),
    "timeout_s": Flag("--timeout"),
    "serve_profile": Flag("--profile", aliases=("-p",), type=ProfileName, metavar="NAME"),
    "backends": Flag("--backend", metavar="URL", parse=_backends),
}


def target_options(command: str, *, backends: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The Target options (with --backend for the commands that split by backend); the command gets a Target."""
    fields = (*TARGET_FIELDS, "backends") if backends else TARGET_FIELDS
    return options_from(Target, "target", fields=fields, flags=TARGET_FLAGS, hint=f"see `glm53 bench {command} --help`")


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


def _measure(
    name: str,
    target: Target,
    api_key: str | None,
    api_key_file: Path | None,
    json_out: bool,
    *,
    measure: Callable[[Session, Output, Callable[[Any], None]], Any],
    gates: Callable[[Any], list[GateResult]],
    outcome: Callable[[Any, Path, list[GateResult], Output], BaseModel],
    render: Callable[[Console, Any], None],
    enforce: bool = True,
) -> tuple[Any, Path]:
    """The steps every measuring command takes: connect and check that a report can be written, measure (the
    section so far written after each request), add the per-backend split, gate, write the section, print the
    outcome, exit 1 on a failed gate. Returns the section and the summary's path."""

    out = Output(json_mode=json_out)
    target = target.model_copy(update={"api_key": resolve_api_key(api_key, api_key_file)})
    with measuring(target) as session:
        section = measure(session, out, checkpointer(target.out_dir, session.environment, name, out.warn))
        if session.tracker is not None:
            section = section.model_copy(update={"backends": session.tracker.finish()})
    results = gates(section)
    path = write_section(target.out_dir, session.environment, **{name: section}, gates={name: results})
    _finish(
        out,
        name,
        outcome(section, path, results, out),
        results,
        lambda console: render(console, section),
        enforce=enforce,
    )
    return section, path


def _finish(
    out: Output,
    section: str,
    result: BaseModel,
    gates: list[GateResult],
    render: Callable[[Console], None],
    *,
    enforce: bool = True,
    where: str | None = None,
) -> None:
    """Print the result and its gates; exit 1 when a gate failed. `where` names the report the values come
    from (default: the summary just written, the result's `summary`)."""

    summary = getattr(result, "summary", None)
    # Valid JSON only: a value that is not a finite number is null, and `non_finite` says which.
    out.result(json_safe(result.model_dump(mode="json")), with_gates(render, gates, summary))
    if enforce:
        enforce_gates(section, gates, report=where or f"the report in {summary}")


@bench_app.command("run")
@target_options("run", backends=True)
def run_cmd(
    target: Target,
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
    style: Annotated[
        Literal["prose", "random"], typer.Option("--style", help="Prompt style: prose (tiled text) or random ids.")
    ] = "prose",
    fail_under: Annotated[
        str | None,
        typer.Option("--fail-under", help="Minimums, e.g. decode=45,prefill=1000 (tok/s, every shape)."),
    ] = None,
    fail_over: Annotated[
        str | None, typer.Option("--fail-over", help="Maximums, e.g. ttft=10 (seconds, every shape).")
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write TTFT and decode PNGs into --out.")] = True,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Throughput: TTFT, prefill and decode tok/s per shape, best of N, exact-length token-id prompts.

    Examples:
      glm53 bench run --base-url http://127.0.0.1:8000 --fail-under decode=45
      glm53 bench run --base-url http://lb:8100 --backend http://a:8000 --backend http://b:8000
    """

    prompt_style = parse_style(style)
    parsed = parse_shapes(shapes) if shapes is not None else None
    under, over = parse_limits(fail_under, RUN_FAIL_UNDER, fail_over, RUN_FAIL_OVER)

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        chosen = parsed
        if chosen is None:
            chosen, note = fitting_shapes(session.server.max_model_len)
            if note is not None:
                out.info(note)
        check_shapes_fit(chosen, session.server.max_model_len)
        served = session.server.model
        out.info(f"benchmarking {served} at {session.server.base_url}: {len(chosen)} shapes x {runs} runs")
        with out.progress("requests", total=len(chosen) * runs) as bar:
            return run_benchmark(
                session.client,
                PromptFactory(session.client, served),
                served,
                chosen,
                runs=runs,
                retries=retries,
                style=prompt_style,
                on_run=_attributed(session.tracker, lambda record: bar.step(run_line(record))),
                on_retry=bar.extend,
                on_section=checkpoint,
            )

    def outcome(section: Any, path: Path, gates: list[GateResult], out: Output) -> BaseModel:
        written = write_report_plots(section, target.out_dir, warn=out.warn) if plots else []
        return RunOutcome(summary=str(path), plots=[str(p) for p in written], run=section, gates=gates)

    section, path = _measure(
        "run",
        target,
        api_key,
        api_key_file,
        json_out,
        measure=measure,
        gates=lambda section: run_gates(section, under, over),
        outcome=outcome,
        render=run_tables,
    )
    require_valid_runs(section, path)


@bench_app.command("needle")
@target_options("needle")
def needle_cmd(
    target: Target,
    sizes: Annotated[str, typer.Option("--sizes", help="Prompt sizes in tokens, comma-separated.")] = (
        "32768,131072,260096"
    ),
    depths: Annotated[str, typer.Option("--depths", help="Needle depths, fractions of the prompt.")] = (
        "0.05,0.25,0.5,0.75,0.95"
    ),
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=8, help="Answer budget per question.")] = 96,
    fail_under: Annotated[
        str | None,
        typer.Option("--fail-under", help="pass-rate=0.8 accepts some misses (default: all must pass)."),
    ] = None,
    report_only: ReportOnlyOpt = False,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Needle recall: an exact JSON record at each depth of each prompt size, asked back verbatim.

    Examples:
      glm53 bench needle --sizes 32768,131072 --depths 0.05,0.5,0.95
      glm53 bench needle --fail-under pass-rate=0.8 --report-only --json
    """

    parsed_sizes, parsed_depths = parse_sizes(sizes), parse_depths(depths)
    under = parse_thresholds(fail_under, NEEDLE_FAIL_UNDER, flag="--fail-under")

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        with out.progress("needles", total=len(parsed_sizes) * len(parsed_depths)) as bar:
            return run_needles(
                session.client,
                PromptFactory(session.client, session.server.model),
                session.server.model,
                parsed_sizes,
                parsed_depths,
                max_tokens=max_tokens,
                max_model_len=session.server.max_model_len,
                on_result=lambda result: bar.step(needle_line(result)),
                on_section=checkpoint,
            )

    def outcome(section: Any, path: Path, gates: list[GateResult], out: Output) -> BaseModel:
        return NeedleOutcome(summary=str(path), needle=section, pass_rate=section.pass_rate, gates=gates)

    _measure(
        "needle",
        target,
        api_key,
        api_key_file,
        json_out,
        measure=measure,
        gates=lambda section: needle_gates(section, under),
        outcome=outcome,
        render=needle_table,
        enforce=not report_only,
    )


@bench_app.command("coherence")
@target_options("coherence")
def coherence_cmd(
    target: Target,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=8, help="Token budget per answer (thinking included).")
    ] = 6144,
    report_only: ReportOnlyOpt = False,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Coherence gates: 17 x 23 = 391, a get_weather call with the city, `def is_prime` with thinking off.

    Examples:
      glm53 bench coherence --base-url http://127.0.0.1:8000
      glm53 bench coherence --max-tokens 2048 --report-only --json
    """

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        check_answer_fits(
            max_tokens, session.server.max_model_len, prompt_allowance=PROMPT_ALLOWANCE, flag="--max-tokens"
        )
        with out.progress("prompts", total=len(PROBES)) as bar:
            return run_coherence(
                session.client,
                session.server.model,
                max_tokens=max_tokens,
                on_result=lambda result: bar.step(coherence_line(result)),
                on_section=checkpoint,
            )

    def outcome(section: Any, path: Path, gates: list[GateResult], out: Output) -> BaseModel:
        return CoherenceOutcome(summary=str(path), coherence=section, gates=gates)

    _measure(
        "coherence",
        target,
        api_key,
        api_key_file,
        json_out,
        measure=measure,
        gates=coherence_gates,
        outcome=outcome,
        render=coherence_table,
        enforce=not report_only,
    )


@bench_app.command("agent")
@target_options("agent", backends=True)
def agent_cmd(
    target: Target,
    tasks: Annotated[int, typer.Option("--tasks", min=1, help="Run the first N of the 15 scripted tasks.")] = 15,
    system_tokens: Annotated[
        int, typer.Option("--system-tokens", min=0, help="Size of the shared system prompt, in tokens.")
    ] = 2048,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=2, help="Token budget per turn.")] = 1024,
    fail_under: Annotated[
        str | None, typer.Option("--fail-under", help="Minimums, e.g. cache-hit=60,decode=30 (%, tok/s).")
    ] = None,
    fail_over: Annotated[
        str | None, typer.Option("--fail-over", help="Maximums, e.g. turn-latency=10 (seconds).")
    ] = None,
    api_key: BenchApiKeyOpt = None,
    api_key_file: BenchApiKeyFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Agent turns: scripted multi-turn tool use; prefix-cache hit %, tool-call turn latency, decode tok/s.

    Each conversation sends one stable X-Session-ID header, so a router's sticky policy keeps its turns on
    one backend, and is closed with the router's POST /finish_session after its last turn; --backend
    (repeatable) adds the per-backend split from the backends' own /metrics.

    Examples:
      glm53 bench agent --fail-under cache-hit=60
      glm53 bench agent --base-url http://lb:8100 --backend http://a:8000 --backend http://b:8000
    """

    script = load_script().first(tasks)
    under, over = parse_limits(fail_under, AGENT_FAIL_UNDER, fail_over, AGENT_FAIL_OVER)

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        served = session.server.model
        if session.server.max_model_len is not None:
            scripted = scripted_tokens(script, lambda text: len(session.client.tokenize(served, text)))
            check_agent_fits(system_tokens, max_tokens, session.server.max_model_len, scripted)
        with out.progress("turns", total=script.turns) as bar:
            return run_agent(
                session.client,
                PromptFactory(session.client, served),
                served,
                script=script,
                system_tokens=system_tokens,
                max_tokens=max_tokens,
                on_turn=_attributed(
                    session.tracker, lambda turn: bar.step(turn_line(turn)), key=lambda turn: turn.session_id
                ),
                on_section=checkpoint,
            )

    def outcome(section: Any, path: Path, gates: list[GateResult], out: Output) -> BaseModel:
        return AgentOutcome(summary=str(path), agent=section, gates=gates)

    section, path = _measure(
        "agent",
        target,
        api_key,
        api_key_file,
        json_out,
        measure=measure,
        gates=lambda section: agent_gates(section, under, over),
        outcome=outcome,
        render=agent_tables,
    )
    require_completed_turns(section, path)


@bench_app.command("compare")
def compare_cmd(
    a: Annotated[
        Path,
        typer.Argument(metavar="A", help="Baseline report (summary.json or its directory).", show_default=False),
    ],
    b: Annotated[
        Path | None,
        typer.Argument(
            metavar="B",
            help="Candidate report; without it, A is compared with the recipe's published points.",
            show_default=False,
        ),
    ] = None,
    figures: FiguresOpt = None,
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

    Examples:
      glm53 bench compare glm53-bench
      glm53 bench compare before/ after/ --fail-under decode=45
      glm53 bench compare glm53-bench --figures prefill-256k --json
    """

    under, over = parse_limits(fail_under, COMPARE_FAIL_UNDER, fail_over, COMPARE_FAIL_OVER)
    compared = compare_reports(a, b, profile=figures)
    comparison = compared.comparison
    out = Output(json_mode=json_out)
    if not under and not over:
        # Valid JSON only: a value that is not a finite number is null, and `non_finite` says which.
        out.result(json_safe(comparison.model_dump(mode="json")), lambda console: comparison_table(console, comparison))
        return
    gates = compare_gates(compared.candidate, under, over)
    gated = GatedComparison(**dict(comparison), gated=str(compared.candidate_path), gates=gates)
    _finish(
        out,
        "compare",
        gated,
        gates,
        lambda console: comparison_table(console, comparison),
        where=f"the report {compared.candidate_path}",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
