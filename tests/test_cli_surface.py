"""The command line's surface rules (glm53/cli/options.py), held by walking every command: an example in each
leaf's help that names real options, help that wraps only where the width ends a line, no `<bool>`, usage lines
that name their arguments, one meaning per flag, `--force` wherever a file is replaced; and options that come
from the library's models, so that a model's default is what `--help` shows."""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from glm53.cli.app import App
from glm53.cli.main import app
from glm53.cli.model_options import Flag, options_from
from glm53.cli.reference import WIDTH, command_paths, help_text
from glm53.recipe.profiles import PROFILE_NAMES

ROOT = typer.main.get_command(app)


def _command(path: tuple[str, ...]) -> Any:
    command = ROOT
    for name in path:
        command = command.get_command(command.context_class(command), name)
    return command


def _leaves() -> Iterator[tuple[tuple[str, ...], Any]]:
    for path in command_paths(ROOT):
        command = _command(path)
        if not hasattr(command, "list_commands"):
            yield path, command


LEAVES = dict(_leaves())
HELP = {path: help_text(app, path) for path in command_paths(ROOT)}


def _option_names(command: Any) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"--help"}


def _examples(text: str) -> list[str]:
    """The command lines of the help's `Examples:` section (or `Example:`)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() in ("Examples:", "Example:")]
    found: list[str] = []
    for start in starts:
        for line in lines[start + 1 :]:
            if not line.strip():
                break
            # one line per example: a line that does not start a command is an example wrapped by the width
            assert line.strip().startswith("glm53 "), f"not a command line (too long to fit?): {line!r}"
            found.append(line.strip())
    return found


def test_the_walk_finds_every_command() -> None:
    assert len(LEAVES) >= 29
    assert ("plan", "host") in LEAVES and ("plan", "trace", "synth") in LEAVES


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_every_leaf_has_examples_that_name_real_options(path: tuple[str, ...]) -> None:
    examples = _examples(HELP[path])
    assert examples, f"glm53 {' '.join(path)} --help has no Examples: section"
    known = _option_names(LEAVES[path])
    for example in examples:
        words = shlex.split(example)
        assert tuple(words[1 : 1 + len(path)]) == path, example
        for word in words[1 + len(path) :]:
            if word.startswith("-") and word != "-":
                assert word.split("=", 1)[0] in known, f"{example}: no option {word}"


@pytest.mark.parametrize("path", sorted(HELP), ids=lambda path: " ".join(path) or "glm53")
def test_help_breaks_lines_only_where_the_width_ends_them(path: tuple[str, ...]) -> None:
    """Outside the option panels, a prose line is followed by more of its paragraph only when the next word
    would not have fitted: no line ends early because the docstring did (the old mid-sentence breaks)."""
    text = HELP[path]
    assert "<bool>" not in text
    description = text.split("╭", 1)[0].splitlines()
    for line in text.splitlines():
        assert len(line) <= WIDTH, line
    for this, following in itertools.pairwise(description):
        if not this.strip() or not following.strip() or following.startswith("   ") or this.rstrip().endswith(":"):
            continue
        if this.strip().startswith(("glm53 ", "Usage:")):
            continue
        first_word = following.split()[0]
        assert len(this.rstrip()) + 1 + len(first_word) > WIDTH - 2, f"early line break:\n{this}\n{following}"


@pytest.mark.parametrize("path", sorted(HELP), ids=lambda path: " ".join(path) or "glm53")
def test_usage_lines_name_their_arguments(path: tuple[str, ...]) -> None:
    usage = next(line for line in HELP[path].splitlines() if "Usage:" in line)
    assert "{" not in usage, usage
    for param in _command(path).params:
        if param.param_type_name == "argument":
            name = param.metavar or param.name.upper()
            assert name.isupper() and name in usage, usage


def test_a_flag_means_one_thing_everywhere() -> None:
    retired = {"--root", "--output", "-o", "-m", "--serve-profile", "--from-hub", "--repo", "--traces"}
    for path, command in LEAVES.items():
        names = _option_names(command)
        assert not names & retired, (path, names & retired)
        for param in command.params:
            if "--model-dir" in param.opts:
                assert param.param_type_name == "option" and param.opts == ["--model-dir"], path
            if "--profile" in param.opts:
                # a serving profile everywhere: the packaged ones are its choices
                choices = tuple(param.type_descriptor.choices or ())
                assert param.opts == ["--profile", "-p"] and choices == PROFILE_NAMES, path
            if "--host-root" in param.opts:
                assert param.default == Path("/"), path
            if "--plots" in param.opts:  # whether to draw; where is --plots-dir
                assert param.is_flag, path
            if "--lock" in param.opts:  # repro.lock.json, and nothing else
                assert param.opts == ["--lock"] and "repro.lock.json" in (param.help or ""), path
            if "--checkpoint-lock" in param.opts:  # a checkpoint's lock, under `model`
                assert path[0] == "model" and "checkpoint" in (param.help or "").lower(), path


# Commands whose --out is a directory added to, not a file replaced: a bench report gains a section at a time.
ADDS_TO_A_REPORT = {("bench", "run"), ("bench", "needle"), ("bench", "coherence"), ("bench", "agent")}


def test_every_command_that_replaces_a_file_takes_force() -> None:
    for path, command in LEAVES.items():
        names = _option_names(command)
        if "--out" in names and path not in ADDS_TO_A_REPORT:
            assert "--force" in names, path


def test_plan_is_a_group_that_does_not_run() -> None:
    plan = _command(("plan",))
    assert hasattr(plan, "list_commands") and not plan.invoke_without_command
    assert [param.name for param in plan.params] == [], "options on the group would be silently ignored"
    result = CliRunner().invoke(app, ["plan", "--rig", "recipe-2x3090"])
    assert result.exit_code == 2


# --- options from the models ---------------------------------------------------------------------------------


class Knobs(BaseModel):
    steps: int = Field(300, ge=2, description="Steps to take.")
    share: float = Field(0.25, gt=0, le=1, description="Share of the work.")
    mode: Literal["fast", "exact"] = Field("fast", description="How to go.")
    label: str | None = Field(None, description="A name for the run.")


def _help_of(command: Any) -> str:
    small = App()
    small.command("go")(command)
    small.command("other")(lambda: None)  # a second command keeps `go` a subcommand
    env = {"COLUMNS": "200", "NO_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}
    return _flat(CliRunner().invoke(small, ["go", "--help"], env=env).output)


def _flat(text: str) -> str:
    """Help text as one line of words: what it says, however the panels wrap it."""
    return " ".join(text.replace("│", " ").split())


def _go(knobs: Knobs) -> None:
    print(knobs.model_dump_json())


def test_options_take_default_help_bounds_and_choices_from_the_model() -> None:
    shown = _help_of(options_from(Knobs, "knobs")(_go))
    assert "Steps to take." in shown and "[default: 300]" in shown and "x>=2" in shown
    assert "<fast|exact>" in shown and "x<=1" in shown

    class Changed(Knobs):
        steps: int = Field(500, ge=2, description="Steps to take.")

    assert "[default: 500]" in _help_of(options_from(Changed, "knobs")(_go))


def test_a_value_the_model_refuses_names_its_flag() -> None:
    small = App()
    small.command("go")(options_from(Knobs, "knobs", flags={"share": Flag("--fraction")}, fix="see --help")(_go))
    small.command("other")(lambda: None)
    ok = CliRunner().invoke(small, ["go", "--fraction", "0.5", "--mode", "exact"])
    assert ok.exit_code == 0 and '"share":0.5' in ok.output and '"mode":"exact"' in ok.output
    refused = CliRunner().invoke(small, ["go", "--fraction", "0"])
    assert refused.exception is not None and "--fraction 0.0" in str(getattr(refused.exception, "message", ""))


def test_a_changed_default_in_the_library_models_shows_in_their_commands_help() -> None:
    """fleet plan, plan host and trace synth rebuilt from a model whose default changed, with no CLI edit."""
    from glm53.cli import fleet, plan
    from glm53.plan.inputs.shape import ServingShape
    from glm53.plan.routing.spec import SyntheticTraceSpec
    from glm53.router.capacity import PlanInputs

    class FleetInputs(PlanInputs):
        cache_hit: float = Field(0.5, ge=0, le=1, description="Share of prompt tokens found in the prefix cache.")

    class Shape(ServingShape):
        max_model_len: int = Field(default=131_072, gt=0, description="MAX_MODEL_LEN: the longest context.")

    class Spec(SyntheticTraceSpec):
        layers: tuple[int, ...] = Field(default=(3, 4, 5), description="MoE layer ids, list format.")

    fleet_help = _help_of(
        options_from(FleetInputs, "inputs", flags={"profile": Flag("--figures")})(fleet.plan_cmd.__wrapped__)
    )
    assert "[default: 0.5]" in fleet_help and "[default: 0.729]" not in fleet_help
    host_help = _help_of(
        options_from(
            Shape,
            "shape",
            fields=plan.SHAPE_FIELDS,
            flags=plan.SHAPE_FLAGS,
            given_only="the --profile's value, else {default}",
        )(plan.host_cmd.__wrapped__)
    )
    assert "else 131072" in host_help and "else 262144" not in host_help
    synth_help = _help_of(
        options_from(Spec, "spec", fields=plan.SYNTH_FIELDS, flags=plan.SYNTH_FLAGS)(plan.synth.__wrapped__)
    )
    assert "[default: 3-5]" in synth_help
    # and the commands as registered show the models' own defaults
    assert "[default: 0.729]" in _flat(HELP[("fleet", "plan")]) and "else 262144" in _flat(HELP[("plan", "host")])
    assert "[default: 3-44]" in _flat(HELP[("plan", "trace", "synth")])
    assert "[default: http://127.0.0.1:8000]" in _flat(HELP[("bench", "run")])


def test_a_changed_default_in_the_bench_settings_shows_in_the_bench_commands_help() -> None:
    """bench run, needle, coherence and agent rebuilt from settings models whose defaults changed, with no CLI
    edit; the gate options list each kind's own keys."""
    import inspect

    from glm53.bench import settings
    from glm53.cli import bench

    class Run(settings.RunSettings):
        runs: int = Field(5, ge=1, description="Runs per shape; the best is reported, all kept.")
        style: Literal["prose", "random"] = Field("random", description="Prompt style.")

    class Needle(settings.NeedleSettings):
        sizes: tuple[int, ...] = Field((1024, 2048), description="Prompt sizes in tokens, comma-separated.")
        max_tokens: int = Field(128, ge=8, description="Answer budget per question.")

    class Coherence(settings.CoherenceSettings):
        max_tokens: int = Field(4096, ge=8, description="Token budget per answer (thinking included).")

    class Agent(settings.AgentSettings):
        system_tokens: int = Field(512, ge=0, description="Size of the shared system prompt, in tokens.")

    def rebuilt(model: type[settings.BenchSettings], command: Any, name: str) -> str:
        return _help_of(bench.bench_options(model, name)(inspect.unwrap(command)))

    run_help = rebuilt(Run, bench.run_cmd, "run")
    assert "[default: 5]" in run_help and "[default: random]" in run_help and "[default: prose]" not in run_help
    needle_help = rebuilt(Needle, bench.needle_cmd, "needle")
    assert "[default: 1024,2048]" in needle_help and "[default: 128]" in needle_help
    assert "[default: 4096]" in rebuilt(Coherence, bench.coherence_cmd, "coherence")
    assert "[default: 512]" in rebuilt(Agent, bench.agent_cmd, "agent")
    # and the commands as registered show the models' own defaults, and the keys each kind gates
    shown = {name: _flat(HELP[("bench", name)]) for name in ("run", "needle", "coherence", "agent", "compare")}
    assert f"[default: {settings.RunSettings().runs}]" in shown["run"]
    assert "[default: 32768,131072,260096]" in shown["needle"] and "[default: 96]" in shown["needle"]
    assert f"[default: {settings.CoherenceSettings().max_tokens}]" in shown["coherence"]
    assert f"[default: {settings.AgentSettings().system_tokens}]" in shown["agent"]
    assert "decode (best decode tok/s of every shape)" in shown["run"] and "ttft (" in shown["compare"]
    assert "cache-hit (" in shown["agent"] and "pass-rate (" in shown["needle"] and "--fail-over" not in shown["needle"]
    assert "--report-only" in shown["needle"] and "--report-only" not in shown["run"]


def test_a_bench_value_the_settings_refuse_names_its_flag() -> None:
    from tests.support.cli import run_glm53

    for args, message in (
        (("run", "--fail-under", "speed=3"), "--fail-under: 'speed=3' is not KEY=NUMBER with a known KEY"),
        (("agent", "--fail-over", "ttft=3"), "--fail-over: 'ttft=3' is not KEY=NUMBER with a known KEY"),
        (("needle", "--depths", "0.5,2"), "--depths: depths are fractions between 0 and 1"),
        (("run", "--style", "poetry"), "--style"),
        (("agent", "--system-tokens", "-1"), "--system-tokens"),
    ):
        result = run_glm53("bench", *args, "--base-url", "http://127.0.0.1:9")
        assert result.code == 2 and message in result.stderr, (args, result.stderr)


def test_plan_host_shows_the_recipe_profiles_values_as_its_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """ServingShape's defaults are the default profile's values: a changed profile changes plan host's help."""
    from glm53.cli import plan
    from glm53.plan.inputs import shape
    from glm53.recipe.profiles import DEFAULT_PROFILE, load_profile

    def host_help() -> str:
        return _help_of(
            options_from(
                shape.ServingShape,
                "shape",
                fields=plan.SHAPE_FIELDS,
                flags=plan.SHAPE_FLAGS,
                given_only="the --profile's value, else {default}",
            )(plan.host_cmd.__wrapped__)
        )

    recipe = load_profile(DEFAULT_PROFILE)
    assert f"else {recipe.value('MAX_MODEL_LEN')}" in host_help()
    changed = load_profile(DEFAULT_PROFILE, overrides=[("MAX_MODEL_LEN", "65536"), ("TENSOR_PARALLEL_SIZE", "4")])
    monkeypatch.setattr(shape, "recipe_profile", lambda: changed)
    shown = host_help()
    assert "the longest context, in tokens. Default: the --profile's value, else 65536." in shown
    assert "GPUs the model is split over. Default: the --profile's value, else 4." in shown


def test_the_version_is_the_package_metadata_s() -> None:
    from importlib import metadata

    from tests.support.cli import run_glm53

    result = run_glm53("--version")
    assert result.code == 0 and result.stdout.strip() == f"glm53 {metadata.version('glm53')}"
