"""Every output of flake.nix evaluated against the stand-in nixpkgs (tests/support/nixflake.py), and what each
must hold: the CLI, the router and the checks without CUDA; ExLlamaV3 built against a whole CUDA tree for GPUs
beyond the recipe's; vLLM from source keeping nixpkgs' pynvml fix; the vLLM engine as the vendor image by
digest with the overlay and ExLlamaV3 on top; `nix fmt` and `nix run .#default` doing what they say.

nixpkgs is not reachable here (Nix 2.8, offline): nothing is built but the small scripts the tests run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glm53.recipe.pins import load_repro_lock
from tests.support.nixeval import ROOT, needs_nixpkgs_lib
from tests.support.nixflake import (
    SYSTEM,
    closure,
    derivations,
    evaluate,
    filled_lock,
    flake,
    instantiate,
    named,
    output_path,
    overlaid,
    stand_in_nixpkgs,
)

pytestmark = needs_nixpkgs_lib
LOCK = load_repro_lock(ROOT / "repro.lock.json")
# What nixpkgs' CUDA is made of: the names the CUDA instance's unfree predicate accepts (nix/nixpkgs.nix).
CUDA_NAMES = ("cuda", "libcu", "libnv", "cudnn", "nccl", "cutensor")


@pytest.fixture(scope="module")
def nixpkgs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in_nixpkgs(tmp_path_factory.mktemp("nixpkgs"))


@pytest.fixture(scope="module")
def outputs(nixpkgs: Path) -> str:
    return flake(nixpkgs)


def _cuda(names: list[str]) -> list[str]:
    return [name for name in names if name.startswith(CUDA_NAMES)]


def test_every_output_evaluates(outputs: str) -> None:
    """What `nix flake check --no-build` and `nix flake show` evaluate, with this flake's own lock."""
    names = evaluate(
        f'let o = {outputs}; s = "{SYSTEM}"; in {{ packages = builtins.attrNames o.packages.${{s}}; '
        "apps = builtins.attrNames o.apps.${s}; checks = builtins.attrNames o.checks.${s}; "
        "modules = builtins.attrNames o.nixosModules; overlays = builtins.attrNames o.overlays; }"
    )
    assert names["packages"] == sorted(
        [
            *("default", "exllamav3", "glm53", "glm53-exl3", "glm53-router", "glm53-runtime", "image"),
            *("image-exl3", "tabbyapi", "vllm", "vllm-router"),
        ]
    )
    assert names["apps"] == ["default", "glm53", "serve-exl3"] and names["checks"] == [
        *("glm53", "glm53-router", "settings-render")
    ]
    assert names["modules"] == ["default", "router"] and names["overlays"] == ["default"]
    drvs = [f"packages.{SYSTEM}.{name}" for name in names["packages"]]
    drvs += [f"checks.{SYSTEM}.{name}" for name in names["checks"]]
    drvs += [f"devShells.{SYSTEM}.default", f"formatter.{SYSTEM}"]
    for attribute in drvs:
        assert instantiate(f"{outputs}.{attribute}").endswith(".drv"), attribute
    for app in names["apps"]:
        program = evaluate(f"{outputs}.apps.{SYSTEM}.{app}.program")
        assert program.startswith("/nix/store/") and "/bin/" in program, app
    sys.stderr.write(f"\n[flake] evaluated: {', '.join(drvs)}, apps {', '.join(names['apps'])}\n")


def test_the_cli_router_checks_and_dev_shell_are_built_without_cuda(outputs: str) -> None:
    """One CUDA nixpkgs for everything built glm53 against CUDA torch (safetensors tests with torch)."""
    cli = closure(instantiate(f"{outputs}.packages.{SYSTEM}.glm53"))
    sys.stderr.write("\n[flake] closure of .#glm53 as evaluated: " + " ".join(cli) + "\n")
    assert "torch-2.9.1.drv" in cli  # safetensors' check input: the CPU build
    for attribute in (
        f"packages.{SYSTEM}.glm53",
        f"packages.{SYSTEM}.glm53-router",
        f"packages.{SYSTEM}.image",
        f"checks.{SYSTEM}.glm53",
        f"checks.{SYSTEM}.glm53-router",
        f"checks.{SYSTEM}.settings-render",
        f"devShells.{SYSTEM}.default",
        f"formatter.{SYSTEM}",
    ):
        assert _cuda(closure(instantiate(f"{outputs}.{attribute}"))) == [], attribute
    # The engine is where CUDA is: ExLlamaV3 with nixpkgs' CUDA torch.
    exl3 = closure(instantiate(f"{outputs}.packages.{SYSTEM}.exllamav3"))
    assert {"cuda_nvcc.drv", "cuda_cudart.drv", "libcublas.drv"} <= set(_cuda(exl3))


def test_exllamav3_compiles_with_one_cuda_tree_for_the_locks_capabilities(outputs: str) -> None:
    graph = derivations(instantiate(f"{outputs}.packages.{SYSTEM}.exllamav3"))
    cuda_home = named(graph, "cuda-home-12.8")
    inputs = {path.split("-", 1)[1] for path in cuda_home["inputDrvs"]}
    # nvcc with the headers and libraries the extension includes and links (-lcudart from CUDA_HOME/lib64).
    assert {"cuda_nvcc.drv", "cuda_cudart.drv", "cuda_cccl.drv", "libcublas.drv", "libcusparse.drv"} <= inputs
    assert "ln -s lib $out/lib64" in cuda_home["env"]["postBuild"]
    # The stand-in keeps the build's script among the inputs: postInstall is what builds the extension.
    (install,) = [
        entry for entry in graph.values() if "exllamav3_ext" in " ".join(entry["env"].get("inputs", "").split())
    ]
    script = install["env"]["inputs"]
    assert f"export CUDA_HOME={output_path(graph, 'cuda-home-12.8')}" in script
    # sm_80 kernels, and sm_86's with their PTX, which the driver compiles for newer GPUs (sm_89, sm_90, ...).
    assert 'export TORCH_CUDA_ARCH_LIST="8.0;8.6+PTX"' in script
    assert LOCK.engine.cuda.exllamav3.capabilities == ["8.0", "8.6+PTX"]


def test_the_vllm_engine_is_the_vendor_image_by_digest_with_the_overlay_and_exllamav3(
    nixpkgs: Path, outputs: str, tmp_path: Path
) -> None:
    # Unresolved, the image evaluates and its build names what to fill and what fills it.
    stub = derivations(instantiate(f"{outputs}.packages.{SYSTEM}.image"))
    (entry,) = stub.values()
    assert entry["env"]["name"] == "glm53-image"
    message = entry["args"][1]
    assert "engine.vllm.image.hash, engine.glm53_overlay.rev, engine.glm53_overlay.hash not pinned yet" in message
    assert "glm53 repro show lists them and what fills each" in message
    # What `glm53 repro resolve` builds to learn the hash: the same pull, with a placeholder.
    (probe,) = derivations(instantiate(f"{outputs}.packages.{SYSTEM}.image.probe")).values()
    assert probe["env"]["imageDigest"] == LOCK.engine.vllm.image.digest  # type: ignore[union-attr]
    assert probe["env"]["outputHashSri"] == "sha256-" + "A" * 43 + "="  # lib.fakeHash

    # Filled (in a copy of the lock), the image is the vendor image pulled by its amd64 digest, ...
    lock = filled_lock(tmp_path)
    pkgs = overlaid(nixpkgs, lock)
    glm_lib = f"import {ROOT}/nix/lib.nix {{ lockFile = {lock}; }}"
    expr = f"{pkgs}.callPackage {ROOT}/nix/vendor-image.nix {{ glmLib = {glm_lib}; }}"
    graph = derivations(instantiate(expr))
    image = LOCK.engine.vllm.image
    assert image is not None
    pulled = named(graph, "docker-image-vllm-vllm-openai-qwen38-flash-next.tar")["env"]
    assert (pulled["imageName"], pulled["imageDigest"]) == (image.name, image.digest)
    assert pulled["outputHashSri"] == "sha256-" + "B" * 43 + "="
    assert image.digest == "sha256:0aea30240f3e3d9ffae8526643950e170eb5fa07fc427016a9dd90892afa2aa3"
    # ... with the overlay copied over the image's vLLM, ExLlamaV3's wheel unpacked and its extension compiled
    # against the image's torch for the recipe's sm_86, and glm53 (no CUDA of nixpkgs) as the entrypoint.
    built = named(graph, "docker-image-glm53.tar.gz")["env"]
    script = built["runAsRoot"]
    overlay = output_path(graph, "source")
    assert f'cp -r --no-preserve=mode {overlay}/vllm/. "$package/"' in script
    wheel = output_path(graph, "exllamav3-1.4.6-py3-none-any.whl")
    assert f"zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' {wheel}" in script
    assert 'export TORCH_CUDA_ARCH_LIST="8.6"' in script and "export CUDA_HOME=/usr/local/cuda" in script
    assert "python3 -c 'import torch, exllamav3_ext'" in script
    config = json.loads(built["imageConfig"])
    assert config["Entrypoint"] == [
        *("/opt/glm53/bin/glm53", "serve", "--model-dir", "/model", "--host", "0.0.0.0", "--listen-all")
    ]
    assert config["Labels"]["org.opencontainers.image.base.digest"] == image.digest
    assert _cuda(closure(instantiate(expr))) == []


def test_vllm_from_source_keeps_nixpkgs_pynvml_fix(nixpkgs: Path, tmp_path: Path) -> None:
    """nixpkgs' recipe swaps vLLM's vendored pynvml for nixpkgs' (which finds the driver on NixOS); replacing
    its postPatch must keep that, or vLLM sees no GPU."""
    lock = filled_lock(tmp_path, **{"engine.cuda.vllm.version": "12.8"})  # a nixpkgs whose torch would match
    graph = derivations(instantiate(f"{overlaid(nixpkgs, lock, cuda=True)}.python3Packages.vllm-glm53"))
    vllm = named(graph, "python3.13-vllm-0.1.dev20073+g8e685d198")
    post_patch = vllm["env"]["postPatch"]
    replacement = next(path for path in vllm["inputSrcs"] if path.endswith("-pynvml.py"))
    assert f"cp {replacement} vllm/third_party/pynvml.py" in post_patch
    assert "nvidia-ml-py.drv" in {path.split("-", 1)[1] for path in vllm["inputDrvs"]}

    # The replacement, in a tree laid out as vLLM's, is nixpkgs' pynvml under the vendored name.
    tree = tmp_path / "tree"
    (tree / "vllm" / "third_party").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("")
    (tree / "vllm" / "third_party" / "__init__.py").write_text("")
    (tree / "vllm" / "third_party" / "pynvml.py").write_text(Path(replacement).read_text())
    nixpkgs_pynvml = tmp_path / "site"
    nixpkgs_pynvml.mkdir()
    (nixpkgs_pynvml / "pynvml.py").write_text(
        "LIBRARY = '/run/opengl-driver/lib/libnvidia-ml.so.1'\ndef nvmlInit(): pass\n"
    )
    probe = (
        "import pynvml, vllm.third_party.pynvml as vendored\n"
        "from vllm.third_party.pynvml import nvmlInit\n"
        "assert vendored is pynvml and nvmlInit is pynvml.nvmlInit\n"
        "print(vendored.LIBRARY)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": f"{tree}:{nixpkgs_pynvml}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/run/opengl-driver/lib/libnvidia-ml.so.1"


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _shell_application(path: Path, text: str) -> Path:
    """A writeShellApplication's script as it runs: its `text` under the header the builder puts first."""
    return _executable(path, "#!/usr/bin/env bash\nset -o errexit -o nounset -o pipefail\n" + text)


def test_nix_fmt_formats_the_tree_instead_of_reading_stdin(outputs: str, tmp_path: Path) -> None:
    """Newer Nix runs the formatter with no argument; nixfmt alone then waits on standard input."""
    graph = derivations(instantiate(f"{outputs}.formatter.{SYSTEM}"))
    text = named(graph, "glm53-nixfmt")["env"]["text"]
    bin_dir = tmp_path / "bin"
    record = tmp_path / "args"
    _executable(bin_dir / "nixfmt", f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    tree = tmp_path / "repo"
    for name in ("flake.nix", "nix/module.nix", "pkgs/a/default.nix", ".git/x.nix", "README.md"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("{ }\n")
    script = _shell_application(tmp_path / "fmt", text)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    for args in ([], ["."], ["--check"]):
        # stdin left open: a formatter that read it would hang until the timeout.
        done = subprocess.run(
            [str(script), *args], cwd=tree, env=env, stdin=subprocess.PIPE, capture_output=True, text=True, timeout=20
        )
        assert done.returncode == 0, done.stderr
        options = ["--check"] if args == ["--check"] else []
        files = ["./flake.nix", "./nix/module.nix", "./pkgs/a/default.nix"]
        assert record.read_text().split() == [*options, *files]
    done = subprocess.run([str(script), "nix/module.nix"], cwd=tree, env=env, stdin=subprocess.PIPE, timeout=20)
    assert done.returncode == 0 and record.read_text().split() == ["nix/module.nix"]


def test_nix_run_default_runs_the_image_with_the_gpus_as_cdi_devices(nixpkgs: Path, tmp_path: Path) -> None:
    image = (
        '{ imageName = "glm53"; imageTag = "0.1.0"; outPath = "/nix/store/00000000000000000000000000000000-image"; }'
    )
    expr = (
        f"{overlaid(nixpkgs, ROOT / 'repro.lock.json')}.callPackage {ROOT}/nix/container-app.nix "
        f"{{ glmLib = import {ROOT}/nix/lib.nix {{ }}; image = {image}; }}"
    )
    text = named(derivations(instantiate(expr)), "glm53-container")["env"]["text"]
    bin_dir = tmp_path / "bin"
    record = tmp_path / "calls"
    _executable(bin_dir / "podman", f'#!/bin/sh\nprintf "%s\\n" "$@" >> {record}\necho --- >> {record}\n')
    script = _shell_application(tmp_path / "glm53-container", text)
    model = tmp_path / "glm53 model"
    model.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(
        [str(script), "--model-dir", str(model), "--set", "MAX_MODEL_LEN=131072"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 0, done.stderr
    load, run_argv, _ = record.read_text().split("---\n")
    assert load.split() == ["load", "-i", "/nix/store/00000000000000000000000000000000-image"]
    argv = run_argv.splitlines()
    assert argv[:3] == ["run", "--rm", "--device"] and argv[3] == "nvidia.com/gpu=all"
    assert argv[argv.index("-p") + 1] == "127.0.0.1:8000:8000"
    assert argv[argv.index("-v") + 1] == f"{model}:/model:ro"
    assert argv[-3:] == ["glm53:0.1.0", "--set", "MAX_MODEL_LEN=131072"]
    missing = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=20)
    assert missing.returncode == 2 and "--model-dir DIR" in missing.stderr
