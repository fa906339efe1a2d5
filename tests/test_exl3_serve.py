"""The exllamav3 engine (TabbyAPI + ExLlamaV3): its profiles and their engine rules, the config.yml rendered for
TabbyAPI and checked by a TabbyAPI schema in a child process, the dry run on the command line, and a real exec
of a stand-in TabbyAPI tree (main.py reports what it received)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from glm53.errors import BadInput, Unavailable
from glm53.plan.vllm.env import PLANNED_KEYS_EXL3
from glm53.recipe.profiles import CONFIG_SPECS, KEYS, Profile, load_profile, parse_env_text
from glm53.serve.chat_template import bounded_template_path
from glm53.serve.engines.exllamav3.tabby import build_tabby_launch, clean_environment, render_config
from glm53.serve.engines.exllamav3.tabby_check import require_tabby_config, run_check, tabby_config_check
from glm53.serve.launch import LaunchSpec
from tests.support.cli import run_glm53
from tests.support.fake_nvml import FakeNvml
from tests.support.tabby_rig import EXL3_CONFIG, TabbyRig

STAND_IN = Path(__file__).parent / "fixtures" / "tabbyapi"
EXL3_PROFILES = ("exl3-1gpu", "exl3-2x3090")
# Values the planner would give: every empty config key of the profiles gets one.
PLANNED = (
    ("GPU_SPLIT", "21.5,23", "plan (test)"),
    ("AUTOSPLIT_RESERVE", "1024,512", "plan (test)"),
    ("CACHE_SIZE", "262144", "plan (test)"),
    ("CPU_MOE_OFFLOAD_LAYERS", "3", "plan (test)"),
    ("EXL3_MOE_CPU_SPLIT", "200", "plan (test)"),
)


def _real_tabby() -> Path | None:
    """TabbyAPI's source tree at the pinned commit, where this machine has one (never in CI)."""
    named = os.environ.get("GLM53_TABBYAPI_DIR")
    if named and (Path(named) / "common" / "config_models.py").is_file():
        return Path(named)
    return None


REAL_TABBY = _real_tabby()
needs_real_tabby = pytest.mark.skipif(
    REAL_TABBY is None, reason="no TabbyAPI source tree (set GLM53_TABBYAPI_DIR); the stand-in schema runs instead"
)


@pytest.fixture(autouse=True)
def no_tabby_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GLM53_TABBYAPI_DIR", "GLM53_TABBYAPI_PYTHON", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error="Driver Not Loaded"))


def _profile_file(name: str) -> Path:
    return Path(str(resources.files("glm53") / "data" / "profiles" / f"{name}.env"))


def _planned(name: str = "exl3-2x3090", **kwargs: Any) -> Profile:
    return load_profile(name, environ={}, plan=PLANNED, **kwargs)


# ---------------------------------------------------------------- profiles


@pytest.mark.parametrize("name", EXL3_PROFILES)
def test_exl3_profiles_load_on_their_engine(name: str) -> None:
    profile = load_profile(name, environ={})
    assert profile.engine == "exllamav3" and profile.value("ENGINE") == "exllamav3"
    assert profile.value("GPUS") == ("2" if name == "exl3-2x3090" else "1")
    # Only keys the engine reads; no vLLM flag hides in the file.
    assert all("exllamav3" in KEYS[key].engines for key in profile.settings)
    # The JSON-string sentence the recipe injects at the thinking budget.
    assert json.loads(profile.value("REASONING_BUDGET_MESSAGE")).startswith("\n\nI have thought")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
@pytest.mark.parametrize("name", EXL3_PROFILES)
def test_bash_reads_the_exl3_profiles_as_glm53_does(name: str) -> None:
    path = _profile_file(name)
    lines, _ = parse_env_text(path.read_text(), source=path.name)
    script = f"set -eu; source {path}; " + "; ".join(f'printf "%s\\0" "${line.key}"' for line in lines)
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, env={"PATH": "/usr/bin:/bin"}, check=True
    ).stdout.decode()
    assert out.split("\0")[:-1] == [line.value for line in lines]
    assert "REASONING_BUDGET_MESSAGE" in [line.key for line in lines]


def test_a_vllm_key_in_an_exl3_profile_is_refused_naming_key_and_engine(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as by_set:
        load_profile("exl3-2x3090", environ={}, overrides=[("TENSOR_PARALLEL_SIZE", "2")])
    env_file = tmp_path / "site.env"
    with pytest.raises(BadInput) as by_file:
        load_profile("exl3-1gpu", environ={}, env_file=(env_file, "MAX_MODEL_LEN=65536\nTENSOR_PARALLEL_SIZE=2\n"))
    for err in (by_set.value, by_file.value):
        assert "TENSOR_PARALLEL_SIZE" in err.message and "vllm only" in err.message
        assert "runs on exllamav3" in err.message and err.exit_code == 2
    assert by_set.value.message.startswith("--set:")
    assert by_file.value.message.startswith(f"{env_file}:2:")


def test_an_exl3_key_in_a_vllm_profile_is_refused() -> None:
    with pytest.raises(BadInput) as err:
        load_profile("agent-256k", environ={}, overrides=[("CACHE_MODE", "Q4")])
    assert "CACHE_MODE" in err.value.message and "exllamav3 only" in err.value.message
    assert "agent-256k runs on vllm" in err.value.message


def test_the_engine_belongs_to_the_profile(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as by_set:
        load_profile("exl3-2x3090", environ={}, overrides=[("ENGINE", "vllm")])
    assert "ENGINE=vllm differs from profile exl3-2x3090's engine (exllamav3)" in by_set.value.message
    # From an env file too (a recipe .env naming the engine), and the other way round: the error is about
    # ENGINE, not about some key of the profile that the other engine does not read.
    env_file = tmp_path / "other.env"
    with pytest.raises(BadInput) as by_file:
        load_profile("exl3-1gpu", environ={}, env_file=(env_file, "ENGINE=vllm\n"))
    assert by_file.value.message.startswith(f"{env_file}:1: ENGINE=vllm differs")
    with pytest.raises(BadInput) as onto_vllm:
        load_profile("agent-256k", environ={}, env_file=(env_file, "ENGINE=exllamav3\n"))
    assert "ENGINE=exllamav3 differs from profile agent-256k's engine (vllm)" in onto_vllm.value.message
    # Naming the profile's own engine is fine.
    assert load_profile("exl3-1gpu", environ={}, overrides=[("ENGINE", "exllamav3")]).engine == "exllamav3"


def test_another_engines_variables_in_the_environment_are_ignored() -> None:
    environ = {"TENSOR_PARALLEL_SIZE": "2", "ENGINE": "vllm", "MAX_MODEL_LEN": "65536"}
    exl3 = load_profile("exl3-2x3090", environ=environ)
    assert "TENSOR_PARALLEL_SIZE" not in exl3.settings and exl3.engine == "exllamav3"
    assert exl3.settings["MAX_MODEL_LEN"].origin == "env"  # shared keys still apply
    vllm = load_profile("agent-256k", environ={"CACHE_MODE": "Q4", "EXL3_MOE_CPU_SPLIT": "9"})
    assert "CACHE_MODE" not in vllm.settings and "EXL3_MOE_CPU_SPLIT" not in vllm.settings


@pytest.mark.parametrize("value", ["8,6", "8, 6", "2,8", "FP16", "Q4"])
def test_cache_mode_takes_tabbyapis_forms(value: str) -> None:
    assert load_profile("exl3-1gpu", environ={}, overrides=[("CACHE_MODE", value)]).value("CACHE_MODE") == value


@pytest.mark.parametrize("value", ["Q5", "9,9", "8,6,4", "fp16", "1,8"])
def test_cache_mode_refuses_what_tabbyapi_refuses(value: str) -> None:
    with pytest.raises(BadInput) as err:
        load_profile("exl3-1gpu", environ={}, overrides=[("CACHE_MODE", value)])
    assert "CACHE_MODE" in err.value.message and "two bit widths 2-8" in err.value.message


def test_gpu_split_is_a_list_of_numbers() -> None:
    ok = load_profile("exl3-2x3090", environ={}, overrides=[("GPU_SPLIT", "21.5, 23")])
    assert ok.value("GPU_SPLIT") == "21.5, 23"
    assert load_profile("exl3-2x3090", environ={}, overrides=[("GPU_SPLIT", ",".join(["1"] * 64))])
    for bad in ("1,,2", "a", ",".join(["1"] * 65), "-1", "1e3", "21.5;23"):
        with pytest.raises(BadInput) as err:
            load_profile("exl3-2x3090", environ={}, overrides=[("GPU_SPLIT", bad)])
        assert "GPU_SPLIT" in err.value.message and "comma-separated list of numbers" in err.value.message


def test_reasoning_budget_message_must_be_json() -> None:
    with pytest.raises(BadInput) as err:
        load_profile("exl3-1gpu", environ={}, overrides=[("REASONING_BUDGET_MESSAGE", "Stop thinking.")])
    assert "REASONING_BUDGET_MESSAGE" in err.value.message and "valid JSON" in err.value.message
    quoted = load_profile("exl3-1gpu", environ={}, overrides=[("REASONING_BUDGET_MESSAGE", '"Stop."')])
    assert quoted.settings["REASONING_BUDGET_MESSAGE"].origin == "set"


# ---------------------------------------------------------------- rendering


def _typed_ok(spec_kind: str, number_list: bool, value: Any) -> bool:
    if number_list:
        return isinstance(value, list) and all(type(item) is float for item in value)
    return {
        "int": lambda v: type(v) is int,
        "bool": lambda v: type(v) is bool,
        "str": lambda v: type(v) is str,
        "path": lambda v: type(v) is str,
        "json": lambda v: True,
        "float": lambda v: type(v) is float,
    }[spec_kind](value)


def test_every_config_key_renders_at_its_tabbyapi_field_with_its_type() -> None:
    profile = _planned()
    config = render_config(profile, model_dir="/srv/models/glm53", host="127.0.0.1", port=8000, api_key=False)
    model = config.sections["model"]
    assert (model["model_dir"], model["model_name"]) == ("/srv/models", "glm53")
    exl3_specs = [spec for spec in CONFIG_SPECS if "exllamav3" in spec.engines]
    assert {spec.key for spec in exl3_specs} <= set(profile.settings)  # the test covers every key
    for spec in exl3_specs:
        assert spec.config is not None
        section, field = spec.config.split(".")
        value = config.sections[section][field]
        assert _typed_ok(spec.kind, spec.number_list, value), (spec.key, value)
        assert config.origins[spec.config] == profile.settings[spec.key].source
    assert model["gpu_split"] == [21.5, 23.0] and model["autosplit_reserve"] == [1024.0, 512.0]
    assert model["max_seq_len"] == 262144 and model["cache_size"] == 262144 and model["cpu_moe_offload_layers"] == 3
    assert model["reasoning"] is True and model["reasoning_budget_tokens"] == 4096
    assert model["reasoning_budget_message"] == (
        "\n\nI have thought about this enough; I will now act on my best plan.\n"
    )
    template = Path(model["prompt_template"])
    assert template.is_absolute() and template == bounded_template_path() and template.is_file()
    assert model["cache_mode"] == "FP16" and model["tool_format"] == "glm4_5"
    # An environment variable, not a config field: nothing of the split lands in the config.
    assert "EXL3_MOE_CPU_SPLIT" not in json.dumps(config.sections)
    # The text TabbyAPI reads is this JSON (YAML 1.2), nothing more.
    assert json.loads(config.text()) == config.sections


def test_every_rendered_field_has_an_origin() -> None:
    config = render_config(_planned(), model_dir="/m/glm53", host="127.0.0.1", port=8000, api_key=True)
    fields = {f"{section}.{field}" for section, values in config.sections.items() for field in values}
    assert fields == set(config.origins)
    assert all(origin for origin in config.origins.values())
    assert config.origins["model.cache_size"] == "plan (test)"
    assert config.origins["model.max_seq_len"].startswith("exl3-2x3090.env:")


def test_gpu_split_turns_autosplit_off_only_when_set() -> None:
    planned = render_config(_planned(), model_dir="/m/x", host="127.0.0.1", port=1, api_key=False)
    assert planned.sections["model"]["gpu_split_auto"] is False
    assert planned.origins["model.gpu_split_auto"] == "GPU_SPLIT (plan (test))"
    bare = render_config(load_profile("exl3-2x3090", environ={}), model_dir="/m/x", host="::1", port=1, api_key=False)
    assert "gpu_split" not in bare.sections["model"] and "gpu_split_auto" not in bare.sections["model"]
    # Unset keys are TabbyAPI's defaults: absent from the file, not written empty.
    assert "cache_size" not in bare.sections["model"] and "autosplit_reserve" not in bare.sections["model"]


@pytest.mark.parametrize("api_key", [True, False])
def test_auth_is_on_exactly_when_there_is_a_key(api_key: bool) -> None:
    config = render_config(_planned(), model_dir="/m/x", host="127.0.0.1", port=8123, api_key=api_key)
    network = config.sections["network"]
    assert network["disable_auth"] is (not api_key)
    assert (network["host"], network["port"]) == ("127.0.0.1", 8123)


def test_cache_size_below_the_context_or_off_the_page_is_refused() -> None:
    short = _planned(overrides=[("CACHE_SIZE", "131072")])  # MAX_MODEL_LEN 262144
    with pytest.raises(BadInput, match="CACHE_SIZE=131072 is below MAX_MODEL_LEN=262144"):
        render_config(short, model_dir="/m/x", host="127.0.0.1", port=1, api_key=False)
    ragged = _planned(overrides=[("CACHE_SIZE", "262400")])
    assert 262400 % 256 == 0  # a page more: fine
    render_config(ragged, model_dir="/m/x", host="127.0.0.1", port=1, api_key=False)
    odd = _planned(overrides=[("CACHE_SIZE", "262300")])
    with pytest.raises(BadInput, match="not a multiple of 256"):
        render_config(odd, model_dir="/m/x", host="127.0.0.1", port=1, api_key=False)


def test_a_vllm_profile_is_not_rendered_for_tabbyapi() -> None:
    with pytest.raises(BadInput, match="runs on vllm"):
        render_config(load_profile("agent-256k", environ={}), model_dir="/m", host="127.0.0.1", port=1, api_key=False)


def test_inherited_tabby_variables_are_dropped() -> None:
    kept = clean_environment({"TABBY_MODEL_MAX_SEQ_LEN": "1", "TABBY_NETWORK_PORT": "9", "PATH": "/bin", "TAB": "x"})
    assert kept == {"PATH": "/bin", "TAB": "x"}


# ---------------------------------------------------------------- TabbyAPI's schema, in a child process


def _launch(tree: Path, profile: Profile | None = None, *, api_key: bool = True) -> LaunchSpec:
    return build_tabby_launch(
        profile or _planned(),
        model_dir="/srv/models/glm53",
        host="127.0.0.1",
        port=8000,
        listen_all=False,
        plan=None,
        api_key=api_key,
        environ={"GLM53_TABBYAPI_DIR": str(tree), "XDG_RUNTIME_DIR": "/run/user/1000"},
        python=sys.executable,
    )


def _with_config(spec: LaunchSpec, edit: dict[str, dict[str, Any]]) -> LaunchSpec:
    sections = json.loads(spec.files["config.yml"])
    for section, fields in edit.items():
        sections.setdefault(section, {}).update(fields)
    return spec.model_copy(update={"files": {"config.yml": json.dumps(sections)}})


def test_the_stand_in_schema_accepts_the_rendered_config() -> None:
    spec = _launch(STAND_IN)
    assert spec.argv == [
        sys.executable,
        str(STAND_IN / "main.py"),
        "--config",
        "/run/user/1000/glm53-tabby-8000/config.yml",
    ]
    assert run_check(spec) == ([], None, [])  # fastapi-slim is met by fastapi, the full distribution
    check = tabby_config_check(spec)
    assert check.checked and check.reason is None and str(STAND_IN) in (check.vllm_version or "")
    assert str(STAND_IN) in require_tabby_config(spec)


def test_an_unknown_field_is_reported_not_ignored() -> None:
    spec = _with_config(_launch(STAND_IN), {"model": {"max_seq_length": 4096}, "sampler": {"x": 1}})
    unknown, error, _ = run_check(spec)
    assert sorted(unknown) == ["model.max_seq_length", "sampler"] and error is None
    check = tabby_config_check(spec)
    assert not check.checked and check.reason is not None
    assert "unknown fields: " in check.reason and "model.max_seq_length" in check.reason
    with pytest.raises(BadInput) as err:
        require_tabby_config(spec)
    assert "model.max_seq_length" in err.value.message and err.value.exit_code == 2


def test_a_value_of_the_wrong_type_is_refused_in_tabbyapis_words() -> None:
    spec = _with_config(_launch(STAND_IN), {"model": {"max_seq_len": "lots", "cache_mode": "Q5"}})
    unknown, error, _ = run_check(spec)
    assert unknown == [] and error is not None and "max_seq_len" in error and "cache_mode" in error
    check = tabby_config_check(spec)
    assert not check.checked and (check.reason or "").startswith("TabbyAPI refuses the config:")
    with pytest.raises(BadInput, match="TabbyAPI refuses the config"):
        require_tabby_config(spec)


def test_a_tree_without_the_schema_is_unavailable(tmp_path: Path) -> None:
    check = tabby_config_check(_launch(tmp_path))
    assert not check.checked and "cannot load TabbyAPI's config schema" in (check.reason or "")
    unset = _launch(STAND_IN).model_copy(update={"argv": [sys.executable, "$GLM53_TABBYAPI_DIR/main.py"]})
    assert "GLM53_TABBYAPI_DIR" in (tabby_config_check(unset).reason or "")


def _tree_declaring(tmp_path: Path, dependencies: list[str], cu12: list[str]) -> Path:
    tree = tmp_path / "tabby"
    shutil.copytree(STAND_IN, tree, ignore=shutil.ignore_patterns("__pycache__"))
    text = (tree / "pyproject.toml").read_text()
    extra = "".join(f'    "{d}",\n' for d in dependencies)
    text = text.replace("dependencies = [\n", "dependencies = [\n" + extra)
    if cu12:
        text += "\n[project.optional-dependencies]\ncu12 = [\n" + "".join(f'    "{d}",\n' for d in cu12) + "]\n"
    (tree / "pyproject.toml").write_text(text)
    return tree


def test_what_tabbyapi_imports_is_checked_in_its_python_before_the_exec(tmp_path: Path) -> None:
    """TabbyAPI's own pyproject.toml, read in the Python that will run it: the three packages the real file
    declares and this environment lacks, a version floor it does not meet, and the CUDA extra by name (a
    Windows-only entry is not wanted on Linux)."""
    tree = _tree_declaring(
        tmp_path,
        ["aiofiles", "ruamel.yaml", "async_lru", "uvicorn >= 999"],
        [
            "exllamav3 @ https://example.invalid/exllamav3-1.4.2-linux_x86_64.whl ; platform_system == 'Linux'",
            "triton-windows ; platform_system == 'Windows'",
        ],
    )
    spec = _launch(tree)
    unknown, error, missing = run_check(spec)
    assert unknown == [] and error is None
    by_name = {row["name"]: row for row in missing}
    assert set(by_name) == {"aiofiles", "ruamel.yaml", "async_lru", "uvicorn", "exllamav3"}
    assert by_name["uvicorn"]["spec"] == "uvicorn>=999" and by_name["uvicorn"]["why"].endswith("installed")
    assert by_name["exllamav3"]["spec"] == "exllamav3"  # by name: glm53 pins its own build, not TabbyAPI's URL
    with pytest.raises(Unavailable) as err:
        require_tabby_config(spec)
    assert err.value.exit_code == 3
    assert "lacks what TabbyAPI imports: aiofiles (not installed)" in err.value.message
    assert err.value.fix == (
        f"install into TabbyAPI's Python: {sys.executable} -m pip install 'aiofiles' 'ruamel.yaml' 'async_lru' "
        "'uvicorn>=999' 'exllamav3'"
    )
    check = tabby_config_check(spec)
    assert not check.checked and "ruamel.yaml (not installed)" in (check.reason or "")


def test_a_tabbyapi_python_that_cannot_import_glm53s_runner_is_stopped_before_the_exec(tmp_path: Path) -> None:
    """With EXPERT_CACHE=1 (or --capture-routing) TabbyAPI's Python runs `-m glm53.serve.engines...` before main.py.
    A real venv that reads this environment's packages (a .pth, as `glm53 repro install-engine` makes) but not
    glm53's own finder: the check names glm53 and the fix; the .pth install-engine writes for glm53's source
    makes the same launch pass."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = venv / "lib" / version / "site-packages"
    paths = sorted({p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()})
    (site / "base.pth").write_text("".join(f"{p}\n" for p in paths))  # a plain path: its own .pth are not run
    spec = _launch(STAND_IN)
    runner = "glm53.serve.engines.exllamav3.expert_cache"
    main, config = spec.argv[1], spec.argv[-1]
    spec = spec.model_copy(update={"argv": [str(python), "-m", runner, "--report", "r.json", main, "--config", config]})
    probe = subprocess.run([python, "-c", "import glm53"], capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        pytest.skip("this environment's site-packages holds glm53 itself (not an editable install)")
    with pytest.raises(Unavailable) as err:
        require_tabby_config(spec)
    assert err.value.exit_code == 3
    assert f"glm53 (glm53's runner {runner} does not import: ModuleNotFoundError" in err.value.message
    assert "`glm53 repro install-engine` puts glm53's source on its engine's path" in str(err.value.fix)
    assert "pip install" not in str(err.value.fix)  # glm53 is not a package TabbyAPI's Python installs
    (site / "glm53-source.pth").write_text(f"{Path(__file__).resolve().parents[1] / 'python' / 'src'}\n")
    assert "every dependency it declares" in require_tabby_config(spec)


@pytest.mark.parametrize(
    "text",
    [
        '[project]\ndependencies = ["uvicorn >= ", "loguru"]\n',  # a requirement no installer reads
        '[project]\ndependencies = "uvicorn"\n',  # not a list
        "[project\ndependencies = []\n",  # not TOML
        "",  # no [project]
    ],
)
def test_a_malformed_pyproject_is_named_not_a_crash(tmp_path: Path, text: str) -> None:
    tree = tmp_path / "tabby"
    shutil.copytree(STAND_IN, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "pyproject.toml").write_text(text)
    with pytest.raises(Unavailable) as err:
        require_tabby_config(_launch(tree))
    assert "lacks what TabbyAPI imports: pyproject.toml (" in err.value.message
    assert (tree / "pyproject.toml").read_text() == text


def test_a_tree_without_its_pyproject_is_not_tabbyapi(tmp_path: Path) -> None:
    tree = tmp_path / "tabby"
    shutil.copytree(STAND_IN, tree, ignore=shutil.ignore_patterns("__pycache__", "pyproject.toml"))
    with pytest.raises(Unavailable) as err:
        require_tabby_config(_launch(tree))
    assert "pyproject.toml (FileNotFoundError" in err.value.message
    assert err.value.fix is not None and "GLM53_TABBYAPI_DIR must be TabbyAPI's source tree" in err.value.fix


def _schema_fields(tree: Path) -> dict[str, list[str]]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from common.config_models import TabbyConfigModel as T; "
        "d = T(); print(json.dumps({s: sorted(type(getattr(d, s)).model_fields) for s in T.model_fields "
        "if hasattr(type(getattr(d, s)), 'model_fields')}))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tree)], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


@needs_real_tabby
def test_tabbyapi_at_the_pinned_commit_accepts_every_rendered_field() -> None:
    assert REAL_TABBY is not None
    for profile in (_planned(), _planned("exl3-1gpu", overrides=[("CACHE_SIZE", "131072")])):
        for api_key in (True, False):
            spec = _launch(REAL_TABBY, profile, api_key=api_key)
            unknown, error, _ = run_check(spec)
            assert (unknown, error) == ([], None)
    assert tabby_config_check(_with_config(_launch(REAL_TABBY), {"model": {"max_seq_length": 1}})).reason


@needs_real_tabby
def test_the_real_pyproject_is_read_and_the_stand_in_declares_its_list() -> None:
    """On TabbyAPI's own file: what this environment lacks of it is reported (the three the stand-in leaves out,
    and the CUDA extra by name), and the stand-in's list is the real one without those three."""
    assert REAL_TABBY is not None
    _, _, missing = run_check(_launch(REAL_TABBY))
    lacking = {row["name"] for row in missing}
    assert {"aiofiles", "async_lru", "ruamel.yaml", "exllamav3"} <= lacking
    assert not lacking & {"uvicorn", "fastapi-slim", "pydantic", "loguru", "sse-starlette"}

    def declared(tree: Path) -> set[str]:
        return set(tomllib.loads((tree / "pyproject.toml").read_text())["project"]["dependencies"])

    assert declared(REAL_TABBY) - {"aiofiles", "async_lru", "ruamel.yaml"} == declared(STAND_IN)


@needs_real_tabby
def test_the_stand_in_names_only_tabbyapis_own_fields() -> None:
    # Keeps the committed stand-in honest: each of its sections and fields exists in TabbyAPI's schema.
    assert REAL_TABBY is not None
    real, stand_in = _schema_fields(REAL_TABBY), _schema_fields(STAND_IN)
    missing = [f"{s}.{f}" for s, fields in stand_in.items() for f in fields if f not in real.get(s, [])]
    assert missing == []


# ---------------------------------------------------------------- the dry run on the command line


def test_dry_run_for_the_recipe_rig(monkeypatch: pytest.MonkeyPatch, no_gpu: None) -> None:
    monkeypatch.setenv("GLM53_TABBYAPI_DIR", str(STAND_IN))
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    result = run_glm53("serve", "--profile", "exl3-2x3090", "--rig", "recipe-2x3090", "--dry-run", "--json")
    assert result.code == 0, result.stderr
    shown = result.json()
    assert shown["plan"]["source"] == "rig" and "recipe-2x3090" in shown["plan"]["detail"]
    values = shown["values"]
    for key in ("GPU_SPLIT", "CACHE_SIZE", "EXL3_MOE_CPU_SPLIT"):
        assert values[key]["origin"] == "plan"
        assert values[key]["source"].startswith("plan (rig recipe-2x3090)"), values[key]
    launch = shown["launch"]
    run_dir = "/run/user/4242/glm53-tabby-8000"
    assert launch["cwd"] == run_dir and launch["engine"] == "exllamav3"
    assert launch["argv"] == [sys.executable, f"{STAND_IN}/main.py", "--config", f"{run_dir}/config.yml"]
    config = json.loads(launch["files"]["config.yml"])
    assert config["model"]["gpu_split"] == [float(x) for x in values["GPU_SPLIT"]["value"].split(",")]
    assert len(config["model"]["gpu_split"]) == 2 and config["model"]["gpu_split_auto"] is False
    assert config["model"]["cache_size"] == int(values["CACHE_SIZE"]["value"]) >= 262144
    assert launch["env"]["EXL3_MOE_CPU_SPLIT"] == values["EXL3_MOE_CPU_SPLIT"]["value"]
    assert launch["origins"]["EXL3_MOE_CPU_SPLIT"].startswith("plan (rig recipe-2x3090)")
    assert launch["origins"]["config model.gpu_split"].startswith("plan (rig recipe-2x3090)")
    # Checked by the (stand-in) schema of the tree the start would run.
    assert shown["flag_check"]["checked"] is True

    human = run_glm53("serve", "--profile", "exl3-2x3090", "--rig", "recipe-2x3090", "--dry-run")
    assert human.code == 0, human.stderr
    assert f"# {run_dir}/config.yml" in human.stdout and "host plan: planned for rig recipe-2x3090" in human.stdout


def test_dry_run_without_a_gpu_names_the_keys_a_start_would_plan(no_gpu: None) -> None:
    result = run_glm53("serve", "--profile", "exl3-1gpu", "--dry-run", "--json")
    assert result.code == 0, result.stderr
    shown = result.json()
    assert shown["plan"]["source"] == "impossible" and shown["plan"]["keys"] == list(PLANNED_KEYS_EXL3)
    assert "GLM53_TABBYAPI_DIR" in shown["flag_check"]["reason"]
    assert shown["launch"]["argv"][1] == "$GLM53_TABBYAPI_DIR/main.py"
    assert "gpu_split" not in json.loads(shown["launch"]["files"]["config.yml"])["model"]


def test_bad_rigs_are_bad_usage(tmp_path: Path, no_gpu: None) -> None:
    unknown = run_glm53("serve", "--profile", "exl3-2x3090", "--rig", "nope", "--dry-run", "--json")
    assert unknown.code == 2 and "no rig named 'nope'" in unknown.stderr
    assert "one-3090" in unknown.stderr and "recipe-2x3090" in unknown.stderr
    for profile in ("agent-256k", "cpu-tiny"):  # cpu-tiny needs no plan: --rig must not be ignored silently
        vllm = run_glm53("serve", "--profile", profile, "--rig", "recipe-2x3090", "--dry-run", "--json")
        assert vllm.code == 2 and f"--rig plans exllamav3 profiles; {profile} runs on vllm" in vllm.stderr
    plan = tmp_path / "plan.env"
    plan.write_text("GPU_SPLIT=20\n")
    both = run_glm53("serve", "--profile", "exl3-1gpu", "--rig", "one-3090", "--plan-env", str(plan), "--dry-run")
    assert both.code == 2 and "--rig and --plan-env" in both.stderr
    # A start serves this machine: another machine's plan must not be exec'd here.
    model = tmp_path / "model"
    model.mkdir()
    start = run_glm53("serve", "--profile", "exl3-1gpu", "--rig", "one-3090", "--model-dir", str(model))
    assert start.code == 2 and "plans another machine" in start.stderr


# ---------------------------------------------------------------- a real exec of a stand-in TabbyAPI

STAND_IN_MAIN = textwrap.dedent("""
    # A stand-in for TabbyAPI's main.py: reports what it was started with, then exits with code 7.
    import json, os, stat, sys
    config = sys.argv[sys.argv.index("--config") + 1]
    run = os.getcwd()
    tokens = os.path.join(run, "api_tokens.yml")
    report = {
        "pid": os.getpid(),
        "argv": sys.argv,
        "cwd": run,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("EXL3_", "TABBY_", "HF_HUB_OFFLINE"))},
        "config": json.load(open(config)),
        "config_mode": stat.S_IMODE(os.stat(config).st_mode),
        "dir_mode": stat.S_IMODE(os.stat(run).st_mode),
        "tokens": json.load(open(tokens)) if os.path.exists(tokens) else None,
        "tokens_mode": stat.S_IMODE(os.stat(tokens).st_mode) if os.path.exists(tokens) else None,
    }
    with open(os.environ["STAND_IN_REPORT"], "w") as out:
        json.dump(report, out)
    sys.exit(7)
""")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            '{"model_type": "llama", "quantization_config": {"quant_method": "exl3"}}',
            "config.json describes model_type 'llama' quantized by 'exl3'",
        ),
        ('{"model_type": "glm5_next"}', "config.json describes model_type 'glm5_next' quantized by None"),
        (None, "has no config.json"),
    ],
)
def test_an_exl3_profile_refuses_a_checkpoint_of_another_family(
    tmp_path: Path, config: str | None, message: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    if config is not None:
        (model / "config.json").write_text(config)
    result = run_glm53("serve", "--profile", "exl3-1gpu", "--model-dir", str(model), "--dry-run")
    assert result.code == 2 and message in result.stderr, result.stderr
    (model / "config.json").write_text(EXL3_CONFIG)
    assert run_glm53("serve", "--profile", "exl3-1gpu", "--model-dir", str(model), "--dry-run").code == 0


def test_a_start_execs_tabbyapi_in_its_private_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig = TabbyRig(tmp_path, STAND_IN_MAIN)
    done = rig.start("--exec")
    assert done.returncode == 7, done.stderr  # glm53's exit code is TabbyAPI's: it was replaced
    seen = rig.seen()
    assert seen["pid"] == int(done.stdout.splitlines()[0])  # the same process
    assert "glm53 start:" not in done.stderr  # no stage lines: nothing of glm53 is left to print them
    assert seen["cwd"] == str(rig.run_dir)
    assert seen["argv"] == [str(rig.tabby / "main.py"), "--config", str(rig.run_dir / "config.yml")]
    # The inherited TABBY_ variable is gone; the profile's and the plan's engine variables are there.
    assert not any(key.startswith("TABBY_") for key in seen["env"])
    assert seen["env"]["EXL3_MOE_CPU_SPLIT"] == "180" and seen["env"]["EXL3_MOE_CPU_THREADS"] == "2"
    assert seen["env"]["HF_HUB_OFFLINE"] == "1" and seen["env"]["EXL3_MOE_CPU_SWAP"] == "1"
    # Private files in a private folder.
    assert (seen["dir_mode"], seen["config_mode"], seen["tokens_mode"]) == (0o700, 0o600, 0o600)
    # The config is the dry run's, to the byte.
    monkeypatch.setenv("GLM53_TABBYAPI_DIR", str(rig.tabby))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(rig.xdg))
    dry = run_glm53(*rig.args(), "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    launch = dry.json()["launch"]
    assert seen["config"] == json.loads(launch["files"]["config.yml"])
    assert (rig.run_dir / "config.yml").read_text() == launch["files"]["config.yml"]
    assert launch["argv"] == [sys.executable, *seen["argv"]]
    assert seen["config"]["model"]["gpu_split"] == [20.0] and seen["config"]["model"]["max_seq_len"] == 131072
    assert seen["config"]["model"]["model_dir"] == str(rig.model.parent)
    assert seen["config"]["network"]["disable_auth"] is False
    # The key file holds the key and a random admin key, and neither is printed.
    tokens = seen["tokens"]
    assert set(tokens) == {"api_key", "admin_key"} and tokens["api_key"] == "sk-test-4f1c"
    assert len(tokens["admin_key"]) == 64 and int(tokens["admin_key"], 16) >= 0
    for text in (done.stdout, done.stderr, dry.stdout, dry.stderr):
        assert tokens["admin_key"] not in text and "sk-test-4f1c" not in text

    # Started again without a key: auth off, and the old key file gone.
    again = rig.start(key=False)
    assert again.returncode == 7, again.stderr
    seen = rig.seen()
    assert seen["tokens"] is None and not (rig.run_dir / "api_tokens.yml").exists()
    assert seen["config"]["network"]["disable_auth"] is True
    # A third start gets a fresh admin key.
    assert rig.start().returncode == 7 and rig.seen()["tokens"]["admin_key"] != tokens["admin_key"]


def test_relative_tabbyapi_paths_still_name_the_tree_after_the_chdir(tmp_path: Path) -> None:
    rig = TabbyRig(tmp_path, STAND_IN_MAIN)
    python = Path(sys.executable)
    done = rig.start(
        cwd=tmp_path,
        GLM53_TABBYAPI_DIR="tabby",
        GLM53_TABBYAPI_PYTHON=python.name,
        PATH=f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    assert done.returncode == 7, done.stderr
    seen = rig.seen()
    assert seen["argv"][0] == str(rig.tabby / "main.py") and seen["cwd"] == str(rig.run_dir)


def test_a_run_dir_that_is_a_link_is_refused(tmp_path: Path) -> None:
    rig = TabbyRig(tmp_path, STAND_IN_MAIN)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    rig.run_dir.symlink_to(elsewhere)
    done = rig.start()
    assert done.returncode == 3, done.stderr
    assert f"{rig.run_dir} is not a directory of this user" in done.stderr
    assert not rig.report.exists() and list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_run_dir_under_another_users_folder_is_refused(tmp_path: Path) -> None:
    rig = TabbyRig(tmp_path, STAND_IN_MAIN)
    os.chown(rig.xdg, 65534, 65534)
    rig.xdg.chmod(0o777)
    done = rig.start()
    assert done.returncode == 3, done.stderr
    assert f"{rig.xdg} belongs to another user" in done.stderr and not rig.report.exists()
    assert not (rig.run_dir / "config.yml").exists()


def test_a_missing_tabbyapi_tree_stops_before_anything_is_written(tmp_path: Path) -> None:
    rig = TabbyRig(tmp_path, STAND_IN_MAIN)
    done = rig.start(GLM53_TABBYAPI_DIR=str(tmp_path / "nowhere"))
    assert done.returncode == 3 and not rig.report.exists()
    assert "cannot load TabbyAPI's config schema" in done.stderr
    assert not rig.run_dir.exists()
    assert stat.S_IMODE(rig.xdg.stat().st_mode) == 0o700


def test_the_config_check_runs_in_the_environment_tabbyapi_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TabbyAPI is exec'd with the inherited environment, so its Python may find its packages through PYTHONPATH;
    the check before the start must see the same packages."""
    tree = tmp_path / "tabby"
    shutil.copytree(STAND_IN, tree, ignore=shutil.ignore_patterns("__pycache__"))
    schema = tree / "common" / "config_models.py"
    schema.write_text(schema.read_text() + "\nimport tabby_only_dependency  # noqa: E402, F401\n")
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "tabby_only_dependency.py").write_text("")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(Unavailable, match="No module named 'tabby_only_dependency'"):
        run_check(_launch(tree))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "deps"))
    assert run_check(_launch(tree)) == ([], None, [])


def test_what_tabbyapis_entry_point_imports_is_imported_before_the_exec(tmp_path: Path) -> None:
    """Beyond the declared distributions, the check imports what main.py imports, inside its functions too (the
    server's modules): a module nothing declares, or one that is there but broken, is exit 3 naming it. Of
    uvloop or winloop (the branches of one `if`), one importing is enough."""
    ready = _launch(STAND_IN)
    assert run_check(ready)[2] == []  # winloop is absent here, uvloop is not
    tree = tmp_path / "tabby"
    shutil.copytree(STAND_IN, tree, ignore=shutil.ignore_patterns("__pycache__"))
    main = tree / "main.py"
    main.write_text(
        main.read_text().replace("    import uvicorn\n", "    import uvicorn\n    import glm53_absent_server\n")
    )
    with pytest.raises(Unavailable) as err:
        require_tabby_config(_launch(tree))
    assert err.value.exit_code == 3
    assert "module glm53_absent_server not found (main.py imports glm53_absent_server)" in err.value.message
    assert err.value.fix == f"install into TabbyAPI's Python: {sys.executable} -m pip install 'glm53_absent_server'"
    main.write_text(STAND_IN.joinpath("main.py").read_text().replace("import uvicorn\n", "import common.broken\n"))
    (tree / "common" / "broken.py").write_text("raise RuntimeError('half-installed')\n")
    missing = run_check(_launch(tree))[2]
    assert [row["why"] for row in missing] == ["importing common.broken failed: RuntimeError: half-installed"]
