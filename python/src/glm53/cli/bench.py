"""`glm53 bench`: measure a running server the recipe's way, gate on it, compare reports.

Each command writes its section of OUT/summary.json (atomically; other sections are kept), prints tables or
`--json`, and exits 1 when a gate fails (after the report is written).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from glm53.bench.agent import check_fits as check_agent_fits
from glm53.bench.agent import load_script, require_completed_turns, run_agent, scripted_tokens
from glm53.bench.backends import parse_backends
from glm53.bench.coherence import PROBES, PROMPT_ALLOWANCE, run_coherence
from glm53.bench.compare import compare_reports
from glm53.bench.gates import enforce_gates, parse_thresholds
from glm53.bench.needle import format_depths, format_sizes, parse_depths, parse_sizes, run_needles
from glm53.bench.outcome import AgentOutcome, CoherenceOutcome, GatedComparison, NeedleOutcome, RunOutcome
from glm53.bench.plots import write_report_plots
from glm53.bench.prompts import PromptFactory
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
from glm53.bench.runner import check_fits as check_shapes_fit
from glm53.bench.runner import fitting_shapes, parse_shapes, require_valid_runs, run_benchmark
from glm53.bench.session import check_answer_fits, checkpointer, measuring, resolve_api_key
from glm53.bench.settings import (
    GATE_FIELDS,
    AgentSettings,
    BenchSettings,
    CoherenceSettings,
    CompareSettings,
    NeedleSettings,
    RunSettings,
    format_thresholds,
)
from glm53.bench.target import Target
from glm53.cli.app import App
from glm53.cli.model_options import Flag, flag_name, options_from
from glm53.cli.options import BenchApiKeyFileOpt, BenchApiKeyOpt, FiguresOpt, JsonOpt, ProfileName
from glm53.errors import CheckFailed
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
# How the settings' fields are typed on the command line, where a field is not what is typed: a list as
# comma-separated text, read by the library's parser (whose errors name the flag) and shown as it is typed.
SETTINGS_FLAGS = {
    "shapes": Flag(type=str, parse=parse_shapes, metavar="P:O,..."),
    "sizes": Flag(type=str, parse=parse_sizes, show=format_sizes),
    "depths": Flag(type=str, parse=parse_depths, show=format_depths),
    "plots": Flag("--plots/--no-plots"),
}


def _gate_flags(settings: type[BenchSettings]) -> dict[str, Flag]:
    """--fail-under and --fail-over as KEY=NUMBER text, read against the kind's keys (an absent one: no gate)."""

    def reader(allowed: Mapping[str, str], flag: str) -> Callable[[str], dict[str, float]]:
        return lambda text: parse_thresholds(text, allowed, flag=flag)

    return {
        field: Flag(
            type=str,
            metavar="KEY=N,...",
            parse=reader(allowed, flag_name(field)),
            show=lambda values: format_thresholds(values) or None,
        )
        for field, allowed in (("fail_under", settings.FAIL_UNDER), ("fail_over", settings.FAIL_OVER))
    }


def settings_options(settings: type[BenchSettings], command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The kind's options, from its settings model: its own fields, then its gates; the command gets the model."""
    own = [field for field in settings.model_fields if field not in GATE_FIELDS]
    fields = (*own, *(field for field in GATE_FIELDS if field in settings.model_fields))
    return options_from(
        settings,
        "settings",
        fields=fields,
        flags={**SETTINGS_FLAGS, **_gate_flags(settings)},
        fix=f"see `glm53 bench {command} --help`",
    )


def _access_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options every measuring command ends with, --api-key, --api-key-file and --json: the command gets
    the Target with its key resolved (flag, file or environment) and `out`, the Output in the chosen mode.
    A command that has them already is returned as it is."""
    if getattr(func, "shares_access_options", False):
        return func
    signature = inspect.signature(func, eval_str=True)
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        for name, default, annotation in (
            ("api_key", None, BenchApiKeyOpt),
            ("api_key_file", None, BenchApiKeyFileOpt),
            ("json_out", False, JsonOpt),
        )
    ]

    @functools.wraps(func)
    def command(*args: Any, api_key: str | None, api_key_file: Path | None, json_out: bool, **kwargs: Any) -> Any:
        target: Target = kwargs["target"]
        kwargs["target"] = target.model_copy(update={"api_key": resolve_api_key(api_key, api_key_file)})
        return func(*args, out=Output(json_mode=json_out), **kwargs)

    # Typer reads the signature: the command's own parameters (less `out`), then the shared options. These are
    # the command's parameters from here out, so `inspect.unwrap` stops at this wrapper, not at `func`.
    own = [parameter for name, parameter in signature.parameters.items() if name != "out"]
    command.__signature__ = signature.replace(parameters=[*own, *shared])  # type: ignore[attr-defined]
    command.__annotations__ = {parameter.name: parameter.annotation for parameter in [*own, *shared]}
    del command.__wrapped__  # type: ignore[attr-defined]
    command.shares_access_options = True  # type: ignore[attr-defined]
    return command


def bench_options(
    settings: type[BenchSettings], command: str, *, backends: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A measuring command's options: the Target's (with --backend for the commands that split by backend), the
    kind's settings, then the shared access options; the command gets a Target, the settings model and `out`."""
    target_fields = (*TARGET_FIELDS, "backends") if backends else TARGET_FIELDS
    target = options_from(
        Target, "target", fields=target_fields, flags=TARGET_FLAGS, fix=f"see `glm53 bench {command} --help`"
    )

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        return target(settings_options(settings, command)(_access_options(func)))

    return decorate


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
    settings: BenchSettings,
    out: Output,
    *,
    measure: Callable[[Session, Output, Callable[[Any], None]], Any],
    outcome: Callable[[Any, Path, list[GateResult], Output], BaseModel],
    render: Callable[[Console, Any], None],
) -> tuple[Any, Path]:
    """The steps every measuring command takes: connect and check that a report can be written, measure (the
    section so far written after each request), add the per-backend split, gate (the settings' thresholds),
    write the section, print the outcome, exit 1 on a failed gate (unless the settings only report). Returns
    the section and the summary's path."""

    with measuring(target) as session:
        section = measure(session, out, checkpointer(target.out_dir, session.environment, name, out.warn))
        if session.tracker is not None:
            section = section.model_copy(update={"backends": session.tracker.finish()})
    results = settings.gates(section)
    path = write_section(target.out_dir, session.environment, **{name: section}, gates={name: results})
    _finish(
        out,
        name,
        outcome(section, path, results, out),
        results,
        lambda console: render(console, section),
        enforce=settings.enforced,
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
    """Print the result (the model's dump) and its gates; exit 1 when a gate failed. `where` names the report
    the values come from (default: the summary just written, the result's `summary`)."""

    summary = getattr(result, "summary", None)
    # Valid JSON only: a value that is not a finite number is null, and `non_finite` says which.
    out.result(json_safe(result.model_dump(mode="json")), with_gates(render, gates, summary))
    if enforce:
        enforce_gates(section, gates, report=where or f"the report in {summary}")


@bench_app.command("run")
@bench_options(RunSettings, "run", backends=True)
def run_cmd(
    target: Target,
    settings: RunSettings,
    out: Output,
) -> None:
    """Throughput: TTFT, prefill and decode tok/s per shape, best of N, exact-length token-id prompts.

    Examples:
      glm53 bench run --base-url http://127.0.0.1:8000 --fail-under decode=45
      glm53 bench run --base-url http://lb:8100 --backend http://a:8000 --backend http://b:8000
    """

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        chosen = list(settings.shapes) if settings.shapes is not None else None
        if chosen is None:
            chosen, note = fitting_shapes(session.server.max_model_len)
            if note is not None:
                out.info(note)
        check_shapes_fit(chosen, session.server.max_model_len)
        served = session.server.model
        runs = settings.runs
        out.info(f"benchmarking {served} at {session.server.base_url}: {len(chosen)} shapes x {runs} runs")
        with out.progress("requests", total=len(chosen) * runs) as bar:
            return run_benchmark(
                session.client,
                PromptFactory(session.client, served),
                served,
                chosen,
                runs=runs,
                retries=settings.retries,
                style=settings.style,
                on_run=_attributed(session.tracker, lambda record: bar.step(run_line(record))),
                on_retry=bar.extend,
                on_section=checkpoint,
            )

    def outcome(section: Any, path: Path, gates: list[GateResult], out: Output) -> BaseModel:
        written = write_report_plots(section, target.out_dir, warn=out.warn) if settings.plots else []
        return RunOutcome(summary=str(path), plots=[str(p) for p in written], run=section, gates=gates)

    section, path = _measure(
        "run",
        target,
        settings,
        out,
        measure=measure,
        outcome=outcome,
        render=run_tables,
    )
    require_valid_runs(section, path)


@bench_app.command("needle")
@bench_options(NeedleSettings, "needle")
def needle_cmd(
    target: Target,
    settings: NeedleSettings,
    out: Output,
) -> None:
    """Needle recall: an exact JSON record at each depth of each prompt size, asked back verbatim.

    Examples:
      glm53 bench needle --sizes 32768,131072 --depths 0.05,0.5,0.95
      glm53 bench needle --fail-under pass-rate=0.8 --report-only --json
    """

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        with out.progress("needles", total=len(settings.sizes) * len(settings.depths)) as bar:
            return run_needles(
                session.client,
                PromptFactory(session.client, session.server.model),
                session.server.model,
                settings.sizes,
                settings.depths,
                max_tokens=settings.max_tokens,
                max_model_len=session.server.max_model_len,
                on_result=lambda result: bar.step(needle_line(result)),
                on_section=checkpoint,
            )

    def outcome(section: Any, path: Path, gates: list[GateResult], out: Output) -> BaseModel:
        return NeedleOutcome(summary=str(path), needle=section, pass_rate=section.pass_rate, gates=gates)

    _measure(
        "needle",
        target,
        settings,
        out,
        measure=measure,
        outcome=outcome,
        render=needle_table,
    )


@bench_app.command("coherence")
@bench_options(CoherenceSettings, "coherence")
def coherence_cmd(
    target: Target,
    settings: CoherenceSettings,
    out: Output,
) -> None:
    """Coherence gates: 17 x 23 = 391, a get_weather call with the city, `def is_prime` with thinking off.

    Examples:
      glm53 bench coherence --base-url http://127.0.0.1:8000
      glm53 bench coherence --max-tokens 2048 --report-only --json
    """

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        check_answer_fits(
            settings.max_tokens, session.server.max_model_len, prompt_allowance=PROMPT_ALLOWANCE, flag="--max-tokens"
        )
        with out.progress("prompts", total=len(PROBES)) as bar:
            return run_coherence(
                session.client,
                session.server.model,
                max_tokens=settings.max_tokens,
                on_result=lambda result: bar.step(coherence_line(result)),
                on_section=checkpoint,
            )

    def outcome(section: Any, path: Path, gates: list[GateResult], out: Output) -> BaseModel:
        return CoherenceOutcome(summary=str(path), coherence=section, gates=gates)

    _measure(
        "coherence",
        target,
        settings,
        out,
        measure=measure,
        outcome=outcome,
        render=coherence_table,
    )


@bench_app.command("agent")
@bench_options(AgentSettings, "agent", backends=True)
def agent_cmd(
    target: Target,
    settings: AgentSettings,
    out: Output,
) -> None:
    """Agent turns: scripted multi-turn tool use; prefix-cache hit %, tool-call turn latency, decode tok/s.

    Each conversation sends one stable X-Session-ID header, so a router's sticky policy keeps its turns on
    one backend, and is closed with the router's POST /finish_session after its last turn; --backend
    (repeatable) adds the per-backend split from the backends' own /metrics.

    Examples:
      glm53 bench agent --fail-under cache-hit=60
      glm53 bench agent --base-url http://lb:8100 --backend http://a:8000 --backend http://b:8000
    """

    script = load_script()
    if settings.tasks is not None:
        script = script.first(settings.tasks)

    def measure(session: Session, out: Output, checkpoint: Callable[[Any], None]) -> Any:
        served = session.server.model
        if session.server.max_model_len is not None:
            scripted = scripted_tokens(script, lambda text: len(session.client.tokenize(served, text)))
            check_agent_fits(settings.system_tokens, settings.max_tokens, session.server.max_model_len, scripted)
        with out.progress("turns", total=script.turns) as bar:
            return run_agent(
                session.client,
                PromptFactory(session.client, served),
                served,
                script=script,
                system_tokens=settings.system_tokens,
                max_tokens=settings.max_tokens,
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
        settings,
        out,
        measure=measure,
        outcome=outcome,
        render=agent_tables,
    )
    require_completed_turns(section, path)


@bench_app.command("compare")
@settings_options(CompareSettings, "compare")
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
    *,
    figures: FiguresOpt = None,
    settings: CompareSettings,
    json_out: JsonOpt = False,
) -> None:
    """Deltas side by side: A vs B, or (one report) the recipe vs this report; optionally a gate.

    Examples:
      glm53 bench compare glm53-bench
      glm53 bench compare before/ after/ --fail-under decode=45
      glm53 bench compare glm53-bench --figures prefill-256k --json
    """

    compared = compare_reports(a, b, profile=figures)
    comparison = compared.comparison
    out = Output(json_mode=json_out)
    if not settings.gated:
        # Valid JSON only: a value that is not a finite number is null, and `non_finite` says which.
        out.result(json_safe(comparison.model_dump(mode="json")), lambda console: comparison_table(console, comparison))
        if (empty := comparison.why_empty()) is not None:
            raise CheckFailed(
                empty,
                fix="run `glm53 bench run --shapes` with the other side's shapes (the recipe's: 8192:2048, "
                "131072:2048, 260096:2048), or compare two reports of the same shapes",
            )
        return
    gates = settings.gates(compared.candidate)
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
