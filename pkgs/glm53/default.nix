# The glm53 command-line tool. Its source is python/ alone, filtered so that editing Nix files,
# docs or tests never changes this derivation's hash.
{
  lib,
  buildPythonPackage,
  setuptools,
  pydantic,
  typer,
  rich,
  huggingface-hub,
  safetensors,
  numpy,
  jinja2,
  httpx,
  nvidia-ml-py,
  matplotlib,
  pytestCheckHook,
  glmLib,
}:
buildPythonPackage {
  pname = "glm53";
  inherit (glmLib) version;
  pyproject = true;

  src = lib.cleanSourceWith {
    src = ../../python;
    filter =
      path: type:
      let
        base = baseNameOf path;
      in
      !(lib.hasSuffix ".nix" base || base == "__pycache__" || lib.hasSuffix ".egg-info" base);
  };

  # The lock travels inside the package so an installed glm53 audits against the pins it was built from.
  postPatch = ''
    cp ${../../repro.lock.json} src/glm53/data/repro.lock.json
  '';

  build-system = [ setuptools ];
  dependencies = [
    pydantic
    typer
    rich
    huggingface-hub
    safetensors
    numpy
    jinja2
    httpx
    nvidia-ml-py
    matplotlib
  ];

  pythonImportsCheck = [ "glm53" ];

  meta = {
    description = "Lock, verify, plan, launch and benchmark GLM-5.3-Flash (EXL3) with CPU expert offload";
    license = lib.licenses.asl20;
    mainProgram = "glm53";
    platforms = lib.platforms.linux;
  };
}
