"""The exllamav3 engine's Nix side (TabbyAPI + ExLlamaV3): its flake outputs evaluate and none of them is built
from vLLM; TabbyAPI's source and the PyPI wheels come from repro.lock.json; glm53 is told where TabbyAPI is;
a profile's engine is read from its ENGINE line; the module picks the engine's package and refuses a profile
of the other engine.

nixpkgs is not reachable here: the flake's outputs are evaluated against tests/fixtures/nix/stand-in-nixpkgs.nix
(nixpkgs' own lib from NIXPKGS_LIB, the flake's overlay, and a plain derivation for each builder and package),
whose `nix-instantiate` writes the derivation graph the real build would have. The module is evaluated by
nixpkgs' `lib.evalModules` (tests/fixtures/nix/eval-module.nix)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from glm53.recipe.pins import load_repro_lock
from tests.support.nixeval import ROOT, SERVER, needs_nixpkgs_lib, prefixes
from tests.support.nixflake import (
    SYSTEM,
    closure,
    derivations,
    filled_lock,
    flake,
    instantiate,
    named,
    overlaid,
    run,
    stand_in_nixpkgs,
)
from tests.support.systemd_parse import parse_exec

LOCK = load_repro_lock(ROOT / "repro.lock.json")
needs_nix = pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)")
_run = run


@pytest.fixture(scope="module")
def nixpkgs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder a flake can `import` as its nixpkgs input: the stand-in with nixpkgs' lib."""
    return stand_in_nixpkgs(tmp_path_factory.mktemp("nixpkgs"))


class TestFlakeOutputs:
    pytestmark = needs_nixpkgs_lib

    def test_the_exl3_outputs_evaluate_and_nothing_in_them_is_vllm(self, nixpkgs: Path) -> None:
        outputs = flake(nixpkgs)
        expr = (
            f"let o = {outputs}; in {{ inherit (o.apps.{SYSTEM}.serve-exl3) type program; "
            f"server = o.packages.{SYSTEM}.glm53-exl3.outPath; }}"
        )
        app = _run(["nix", "eval", "--json", "--impure", "--expr", expr])
        assert app.returncode == 0, app.stderr
        served = json.loads(app.stdout)
        assert served["type"] == "app" and served["program"] == served["server"] + "/bin/glm53-serve"
        for output in ("tabbyapi", "glm53-exl3", "image-exl3"):
            names = closure(instantiate(f"{outputs}.packages.{SYSTEM}.{output}"))
            assert not [name for name in names if "vllm" in name.lower()], output
            # ExLlamaV3 with the lock's llguidance wheel, never nixpkgs' (1.2; the wheel requires >= 1.7.0).
            assert "python3.13-exllamav3-1.4.6.drv" in names and "llguidance.drv" not in names, output
            assert f"python3.13-llguidance-{LOCK.engine.tabbyapi.python['llguidance'].version}.drv" in names

    def test_the_expert_cache_is_built_ahead_beside_exllamav3(self, nixpkgs: Path) -> None:
        """glm53_expert_cache is compiled in the same derivation's postInstall, by the same script, from the
        store copy of pkgs/exllamav3/expert-cache (the stand-in keeps postInstall among the inputs)."""
        package = f"({flake(nixpkgs)}).packages.{SYSTEM}.exllamav3"
        expr = f"builtins.filter builtins.isString {package}.drvAttrs.inputs"
        result = _run(["nix", "eval", "--json", "--impure", "--expr", expr])
        assert result.returncode == 0, result.stderr
        install = next(text for text in json.loads(result.stdout) if "build_ext.py" in text)
        built = re.search(
            r"EXL3_EXTENSION_NAME=glm53_expert_cache \\\s+\S+ (/nix/store/\S+-build_ext\.py) "
            r"(/nix/store/\S+-expert-cache) ",
            install,
        )
        assert built is not None, install
        assert Path(built.group(1)).read_bytes() == (ROOT / "pkgs/exllamav3/build_ext.py").read_bytes()
        source = ROOT / "pkgs/exllamav3/expert-cache/expert_cache.cu"
        assert (Path(built.group(2)) / "expert_cache.cu").read_bytes() == source.read_bytes()
        checked = (ROOT / "pkgs/exllamav3/default.nix").read_text()
        assert re.search(r'pythonImportsCheck = \[[^]]*"glm53_expert_cache"', checked)

    def test_tabbyapi_is_the_locked_source_and_its_environment(self, nixpkgs: Path) -> None:
        graph = derivations(instantiate(f"{flake(nixpkgs)}.packages.{SYSTEM}.tabbyapi"))
        pin = LOCK.engine.tabbyapi
        source = named(graph, "source")["env"]
        assert (source["owner"], source["repo"]) == ("theroyallab", "tabbyAPI")
        assert (source["rev"], source["outputHashSri"]) == (pin.rev, pin.hash)
        wheel = pin.python["llguidance"]
        fetched = named(graph, wheel.url.rsplit("/", 1)[1])["env"]
        assert (fetched["url"], fetched["outputHashSri"]) == (wheel.url, wheel.sha256)
        tabbyapi = named(graph, f"tabbyapi-0-unstable-{pin.date}")["env"]
        assert "cp -r . $out/share/tabbyapi" in tabbyapi["installPhase"]
        env = named(graph, "python3-3.13-env")
        inputs = {path.split("-", 1)[1] for path in env["inputDrvs"]}
        for package in ("fastapi.drv", "sse-starlette.drv", "uvloop.drv", "python3.13-exllamav3-1.4.6.drv"):
            assert package in inputs

    def test_glm53_is_told_where_tabbyapi_is(self, nixpkgs: Path) -> None:
        outputs = flake(nixpkgs)
        graph = derivations(instantiate(f"{outputs}.packages.{SYSTEM}.glm53-exl3"))
        tabbyapi = next(
            path for path in graph if path.endswith(f"-tabbyapi-0-unstable-{LOCK.engine.tabbyapi.date}.drv")
        )
        tabbyapi_out = graph[tabbyapi]["outputs"]["out"]["path"]
        env = next(path for path in graph if path.endswith("-python3-3.13-env.drv"))
        env_out = graph[env]["outputs"]["out"]["path"]
        wrapper = shlex.split(named(graph, "glm53-exl3-cli-0.1.0")["env"]["postBuild"].replace("\\\n", " "))
        assert wrapper == [
            "wrapProgram",
            "$out/bin/glm53",
            "--set",
            "GLM53_TABBYAPI_DIR",
            f"{tabbyapi_out}/share/tabbyapi",
            "--set",
            "GLM53_TABBYAPI_PYTHON",
            f"{env_out}/bin/python3.13",
            "--prefix",
            "PATH",
            ":",
            f"{env_out}/bin",
            "--suffix",
            "LD_LIBRARY_PATH",
            ":",
            "/run/opengl-driver/lib",
        ]
        assert (
            'exec glm53 serve --profile "${GLM53_PROFILE:-exl3-2x3090}" "$@"'
            in named(graph, "glm53-serve")["env"]["text"]
        )

        image = derivations(instantiate(f"{outputs}.packages.{SYSTEM}.image-exl3"))
        config = json.loads(named(image, "stream-glm53-exl3")["env"]["imageConfig"])
        server = next(path for path in graph if path.endswith("-glm53-exl3-0.1.0.drv"))
        assert config["Entrypoint"] == [
            f"{graph[server]['outputs']['out']['path']}/bin/glm53",
            *("serve", "--profile", "exl3-2x3090", "--model-dir", "/model", "--host", "0.0.0.0", "--listen-all"),
        ]
        assert config["Labels"]["io.glm53.tabbyapi.rev"] == LOCK.engine.tabbyapi.rev

    def test_the_vllm_runtime_is_seen_to_hold_vllm(self, nixpkgs: Path, tmp_path: Path) -> None:
        """The closure query finds vLLM where it is: the vLLM runtime, with its pins filled in a copy of the lock."""
        # nixos-25.11's torch is CUDA 12.8, the vendor build CUDA 13.0.1: from source, evaluation says so.
        cuda_13 = overlaid(nixpkgs, filled_lock(tmp_path / "cuda-13"))
        refused = _run(["nix-instantiate", "--expr", f"{cuda_13}.glm53-runtime"])
        assert refused.returncode != 0
        assert "the vendor vLLM build is CUDA 13.0.1 (engine.cuda.vllm.version)" in refused.stderr
        # With a nixpkgs whose torch matched (a lock that says so), the runtime holds that vLLM.
        pkgs = overlaid(nixpkgs, filled_lock(tmp_path / "cuda-12", **{"engine.cuda.vllm.version": "12.8"}))
        runtime = closure(instantiate(f"{pkgs}.glm53-runtime"))
        assert "python3.13-vllm-0.1.dev20073+g8e685d198.drv" in runtime
        assert not [name for name in closure(instantiate(f"{pkgs}.glm53-exl3")) if "vllm" in name.lower()]


# -- a profile's engine, read by nix/lib.nix -----------------------------------------------------------


def _profiles(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.env").write_text(text)
    return folder


def _lib_eval(profiles: Path, body: str) -> subprocess.CompletedProcess[str]:
    expr = f"let lib = import {ROOT}/nix/lib.nix {{ profilesDir = {profiles}; }}; in {body}"
    return _run(["nix", "eval", "--json", "--impure", "--expr", expr])


@pytest.mark.nix
@needs_nix
def test_a_profiles_engine_is_its_engine_line(tmp_path: Path) -> None:
    profiles = _profiles(
        tmp_path / "profiles",
        {
            "plain": '# no ENGINE: the vLLM engine\n: "${MAX_MODEL_LEN:=262144}"\n',
            "exl3": '# GLM-5.3-Flash with TabbyAPI\n# ENGINE=vllm (a comment)\n: "${ENGINE:=exllamav3}"\n',
            "assigned": "MAX_MODEL_LEN=4096\nENGINE=exllamav3\n",
            "exported": "export ENGINE='vllm'\n",
        },
    )
    result = _lib_eval(
        profiles, '{ engines = map lib.profileEngine lib.profileNames; exl3 = lib.profilesFor "exllamav3"; }'
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "engines": ["exllamav3", "exllamav3", "vllm", "vllm"],  # assigned, exl3, exported, plain
        "exl3": ["assigned", "exl3"],
    }


@pytest.mark.nix
@needs_nix
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (': "${ENGINE:=tensorrt}"\n', "ENGINE=tensorrt is not one of vllm, exllamav3"),
        (': "${ENGINE:=exllamav3}"\nENGINE=vllm\n', "ENGINE is set more than once"),
    ],
)
def test_a_bad_engine_line_names_the_profile(tmp_path: Path, text: str, message: str) -> None:
    profiles = _profiles(tmp_path / "profiles", {"odd": text})
    result = _lib_eval(profiles, 'lib.profileEngine "odd"')
    assert result.returncode != 0
    assert "glm53 profile odd" in result.stderr and message in result.stderr


@pytest.mark.nix
@needs_nix
def test_the_packaged_profiles_engines_are_what_glm53_reads() -> None:
    """Every packaged profile without an ENGINE line is vLLM's; with one, the line's value."""
    result = _run(
        [
            "nix",
            "eval",
            "--json",
            "--impure",
            "--expr",
            f"let lib = import {ROOT}/nix/lib.nix {{}}; in map lib.profileEngine lib.profileNames",
        ]
    )
    assert result.returncode == 0, result.stderr
    profiles = sorted((ROOT / "python/src/glm53/data/profiles").glob("*.env"))
    expected = ["exllamav3" if "ENGINE:=exllamav3" in path.read_text() else "vllm" for path in profiles]
    assert json.loads(result.stdout) == expected


# -- the module's engine option ----------------------------------------------------------------------

MODEL = 'enable = true; modelDir = "/srv/models/glm53"; '


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    """The packaged vLLM profile and the exllamav3 engine's two, as the module reads them (ENGINE lines)."""
    return _profiles(
        tmp_path / "profiles",
        {
            "agent-256k": (ROOT / "python/src/glm53/data/profiles/agent-256k.env").read_text(),
            "exl3-2x3090": '# 2x RTX 3090, layer split, CPU expert offload\n: "${ENGINE:=exllamav3}"\n',
            "exl3-1gpu": '# one GPU\n: "${ENGINE:=exllamav3}"\n',
        },
    )


def _module(config: str, profiles: Path) -> Any:
    result = SERVER.evaluate(config, profiles_dir=profiles, fields=("failedAssertions", "package", "service"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class TestModuleEngine:
    pytestmark = needs_nixpkgs_lib

    def test_exllamav3_runs_glm53_exl3_with_its_default_profile(self, profiles: Path) -> None:
        data = _module(MODEL + 'engine = "exllamav3";', profiles)
        assert data["failedAssertions"] == [] and data["package"] == "glm53-exl3"
        argv = parse_exec(data["service"]["serviceConfig"]["ExecStart"], specifiers={"d": "/run/credentials"})
        assert argv[:4] == [f"{prefixes()['exl3']}/bin/glm53", "serve", "--profile", "exl3-2x3090"]
        other = _module(MODEL + 'engine = "exllamav3"; profile = "exl3-1gpu";', profiles)
        assert other["failedAssertions"] == [] and other["package"] == "glm53-exl3"

    def test_vllm_stays_the_default(self, profiles: Path) -> None:
        data = _module(MODEL + "container = false;", profiles)
        assert data["failedAssertions"] == [] and data["package"] == "glm53-runtime"
        argv = parse_exec(data["service"]["serviceConfig"]["ExecStart"], specifiers={"d": "/run/credentials"})
        assert argv[3] == "agent-256k"

    def test_a_profile_of_the_other_engine_is_refused(self, profiles: Path) -> None:
        data = _module(MODEL + 'engine = "exllamav3"; profile = "agent-256k";', profiles)
        assert data["failedAssertions"] == [
            'services.glm53.profile "agent-256k" runs the vllm engine, but services.glm53.engine is "exllamav3": '
            'set engine = "vllm", or a profile of the exllamav3 engine (exl3-1gpu, exl3-2x3090).'
        ]
        data = _module(MODEL + 'profile = "exl3-1gpu";', profiles)
        assert data["failedAssertions"] == [
            'services.glm53.profile "exl3-1gpu" runs the exllamav3 engine, but services.glm53.engine is "vllm": '
            'set engine = "exllamav3", or a profile of the vllm engine (agent-256k).'
        ]

    def test_an_unknown_engine_is_refused(self, profiles: Path) -> None:
        result = SERVER.evaluate(MODEL + 'engine = "tensorrt";', profiles_dir=profiles, fields=("failedAssertions",))
        assert result.returncode != 0 and "services.glm53.engine" in result.stderr
