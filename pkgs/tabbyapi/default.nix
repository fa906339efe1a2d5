# TabbyAPI, the OpenAI-compatible server of the exllamav3 engine (theroyallab/tabbyAPI; not on PyPI): its
# source tree at the commit repro.lock.json pins (engine.tabbyapi), installed as it is under
# $out/share/tabbyapi, and the Python environment it runs in (passthru.python): its pyproject.toml's
# dependencies from nixpkgs, the lock's PyPI wheels where nixpkgs' are missing or too old, and this flake's
# ExLlamaV3 with its prebuilt extension. Nothing here comes from the vLLM engine's (unpublished) pins.
# glm53 runs it as `$GLM53_TABBYAPI_PYTHON $GLM53_TABBYAPI_DIR/main.py --config FILE` (pkgs/glm53-exl3).
{
  lib,
  stdenvNoCC,
  fetchFromGitHub,
  makeWrapper,
  python3,
  glmLib,
}:
let
  pin = glmLib.pins.tabbyapi;
  inherit (glmLib) requirePin;
  python = python3.withPackages (ps: [
    # pyproject.toml's dependencies (fastapi-slim is fastapi without its optional extras: nixpkgs' fastapi
    # provides the same module; winloop is for Windows only).
    ps.fastapi
    ps.pydantic
    ps.ruamel-yaml
    ps.rich
    ps.uvicorn
    ps.jinja2
    ps.loguru
    ps.sse-starlette
    ps.packaging
    ps.tokenizers
    ps.numpy
    ps.aiofiles
    ps.aiohttp
    ps.async-lru
    ps.huggingface-hub
    ps.psutil
    ps.httptools
    ps.pillow
    ps.requests
    ps.uvloop
    ps.setuptools
    # the inference backend: torch, ExLlamaV3 (exllamav3_ext prebuilt), flash-linear-attention, llguidance
    ps.exllamav3-glm53
  ]);
in
stdenvNoCC.mkDerivation {
  pname = "tabbyapi";
  version = "0-unstable-${pin.date}";

  src = fetchFromGitHub {
    inherit (glmLib.githubRepo "engine.tabbyapi.url" pin.url) owner repo;
    rev = requirePin "engine.tabbyapi.rev" pin.rev;
    hash = requirePin "engine.tabbyapi.hash" pin.hash;
  };

  nativeBuildInputs = [ makeWrapper ];
  dontConfigure = true;
  dontBuild = true;
  # The tree stays exactly upstream's (its shell scripts are not used).
  dontPatchShebangs = true;

  installPhase = ''
    runHook preInstall
    mkdir -p $out/share $out/bin
    cp -r . $out/share/tabbyapi
    # TabbyAPI reads config.yml, templates/ and sampler_overrides/ from its working directory:
    # glm53 gives it one of its own; this entry point is for running it by hand from a prepared directory.
    makeWrapper ${python.interpreter} $out/bin/tabbyapi --add-flags $out/share/tabbyapi/main.py
    runHook postInstall
  '';

  passthru = {
    inherit python;
    # What glm53 is pointed at (GLM53_TABBYAPI_DIR): the folder holding main.py.
    dir = "share/tabbyapi";
  };

  meta = {
    description = "TabbyAPI (${pin.rev}, ${pin.date}): an OpenAI-compatible server for ExLlamaV3";
    homepage = pin.url;
    license = lib.licenses.agpl3Only;
    mainProgram = "tabbyapi";
    platforms = [ "x86_64-linux" ];
  };
}
