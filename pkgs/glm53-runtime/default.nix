# The serving runtime: one Python environment with glm53, the pinned vLLM and ExLlamaV3, and a
# `glm53-serve` entry point (the app behind `nix run`) that runs the preflight and then execs vLLM.
{
  lib,
  python3,
  writeShellApplication,
  symlinkJoin,
  glmLib,
}:
let
  env = python3.withPackages (ps: [
    ps.glm53
    ps.vllm-glm53
    ps.exllamav3-glm53
  ]);
  serve = writeShellApplication {
    name = "glm53-serve";
    runtimeInputs = [ env ];
    text = ''
      # Nix-built CUDA binaries find the driver here on NixOS; elsewhere the host's libcuda is on the loader path.
      export LD_LIBRARY_PATH="''${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/run/opengl-driver/lib"
      exec glm53 serve --profile "''${GLM53_PROFILE:-${glmLib.lock.runtime.default_profile}}" "$@"
    '';
  };
in
symlinkJoin {
  name = "glm53-runtime-${glmLib.version}";
  paths = [
    env
    serve
  ];
  meta.mainProgram = "glm53-serve";
}
