"""Profiles: packaged defaults read like bash reads them, layered overrides with origins, typos named."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.recipe.profiles import (
    KEYS,
    PROFILE_NAMES,
    RECIPE_KEYS,
    load_profile,
    parse_env_text,
    parse_set_options,
)

RECIPE = json.loads((Path(__file__).parent / "fixtures" / "serve" / "recipe-launch.json").read_text())


def _profile_file(name: str) -> Path:
    return Path(str(resources.files("glm53") / "data" / "profiles" / f"{name}.env"))


def test_the_recipes_76_keys_are_all_known() -> None:
    assert sorted(RECIPE_KEYS) == sorted(RECIPE["env_keys"])
    assert len(RECIPE_KEYS) == 76


def test_agent_profile_lists_every_recipe_key() -> None:
    lines, _ = parse_env_text(_profile_file("agent-256k").read_text(), source="agent-256k.env")
    keys = [line.key for line in lines]
    assert keys[:76] == RECIPE["env_keys"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
@pytest.mark.parametrize("name", ["agent-256k", "cpu-tiny", "prefill-256k"])
def test_bash_reads_the_profile_files_as_glm53_does(name: str) -> None:
    # The files are the entrypoint's shell fragments: sourcing them must give the same values.
    path = _profile_file(name)
    lines, _ = parse_env_text(path.read_text(), source=path.name)
    script = f"set -eu; source {path}; " + "; ".join(f'printf "%s\\0" "${line.key}"' for line in lines)
    out = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout.decode()
    assert out.split("\0")[:-1] == [line.value for line in lines]


def test_environment_overrides_and_set_wins_with_origins_recorded(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "site.env"
    env_file.write_text(
        '# a recipe-style .env\nMAX_MODEL_LEN=131072\nexport MAX_NUM_SEQS=2\n: "${OMP_NUM_THREADS:=8}"\n'
    )
    profile = load_profile(
        "agent-256k",
        environ={"MAX_NUM_SEQS": "3", "UNRELATED_VAR": "x"},
        env_file=(env_file, env_file.read_text()),
        overrides=parse_set_options(["KV_CACHE_MEMORY_BYTES=1000"]),
    )
    s = profile.settings
    assert (s["MAX_MODEL_LEN"].value, s["MAX_MODEL_LEN"].origin) == (
        "131072",
        "env-file",
    )
    assert s["MAX_MODEL_LEN"].source == f"{env_file}:2"
    assert (s["MAX_NUM_SEQS"].value, s["MAX_NUM_SEQS"].origin) == ("3", "env")
    assert (s["KV_CACHE_MEMORY_BYTES"].value, s["KV_CACHE_MEMORY_BYTES"].origin) == (
        "1000",
        "set",
    )
    assert (s["OMP_NUM_THREADS"].value, s["OMP_NUM_THREADS"].origin) == (
        "8",
        "env-file",
    )
    assert s["SERVED_MODEL_NAME"].origin == "profile" and s["SERVED_MODEL_NAME"].source.startswith("agent-256k.env:")
    assert "UNRELATED_VAR" not in s


def test_prefill_profile_extends_agent_with_its_two_changes() -> None:
    agent = load_profile("agent-256k", environ={})
    prefill = load_profile("prefill-256k", environ={})
    changed = {k for k in KEYS if agent.value(k) != prefill.value(k)}
    assert changed == {"PREFIX_CACHING", "MAX_NUM_BATCHED_TOKENS"}
    assert prefill.value("PREFIX_CACHING") == "0"
    assert int(prefill.value("MAX_NUM_BATCHED_TOKENS")) > int(agent.value("MAX_NUM_BATCHED_TOKENS"))
    assert prefill.settings["PREFIX_CACHING"].source.startswith("prefill-256k.env:")


def test_unknown_key_in_set_lists_close_matches() -> None:
    with pytest.raises(BadInput) as err:
        load_profile("agent-256k", environ={}, overrides=[("MAX_MODEL_LENGTH", "1")])
    assert "MAX_MODEL_LENGTH" in err.value.message
    assert err.value.fix is not None and "MAX_MODEL_LEN" in err.value.fix
    assert err.value.exit_code == 2


def test_unknown_key_in_env_file_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    text = "SERVED_MODEL_NAME=a\nEXL3_PINED_FRAC=0.3\n"
    with pytest.raises(BadInput) as err:
        load_profile("agent-256k", environ={}, env_file=(path, text))
    assert f"{path}:2" in err.value.message and "EXL3_PINNED_FRAC" in (err.value.fix or "")


def test_profile_typo_lists_profiles() -> None:
    with pytest.raises(BadInput) as err:
        load_profile("agent-265k", environ={})
    assert "agent-256k" in (err.value.fix or "")


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("MAX_MODEL_LEN", "lots", "integer"),
        ("GPU_MEMORY_UTILIZATION", "high", "number"),
        ("PREFIX_CACHING", "maybe", "1 or 0"),
        ("REASONING_CONFIG", "{not json", "JSON"),
    ],
)
def test_values_are_checked_against_their_kind(key: str, value: str, expect: str) -> None:
    with pytest.raises(BadInput) as err:
        load_profile("agent-256k", environ={key: value})
    assert key in err.value.message and expect in err.value.message


def test_bad_set_syntax_and_bad_lines() -> None:
    with pytest.raises(BadInput, match="KEY=VALUE"):
        parse_set_options(["MAX_MODEL_LEN"])
    with pytest.raises(BadInput, match="expansions"):
        parse_env_text(': "${A:=$HOME}"', source="f")
    with pytest.raises(BadInput, match="cannot read this line"):
        parse_env_text("just words", source="f")


def test_every_profile_loads_and_values_pass_their_kind() -> None:
    for name in PROFILE_NAMES:
        profile = load_profile(name, environ={})
        assert profile.settings
        assert profile.description


def test_docs_describe_every_key_and_profile() -> None:
    docs = (Path(__file__).parents[1] / "docs" / "serve.md").read_text()
    missing = [key for key in KEYS if f"`{key}`" not in docs]
    assert missing == []
    assert all(f"`{name}`" in docs for name in PROFILE_NAMES)
