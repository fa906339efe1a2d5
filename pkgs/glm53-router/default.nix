# glm53 with vllm-router in one Python environment: `glm53 router` starts the router as
# `python -m glm53.router.launcher` and checks its flags with that Python, so both must be importable there.
# No CUDA and no vLLM: a router host needs neither.
{
  python3,
  symlinkJoin,
  glmLib,
}:
let
  env = python3.withPackages (ps: [
    ps.glm53
    ps.vllm-router
  ]);
in
symlinkJoin {
  name = "glm53-router-${glmLib.version}";
  paths = [ env ];
  meta = {
    description = "glm53 with vllm-router ${glmLib.pins.router.python.vllm-router.version} (services.glm53.router)";
    mainProgram = "glm53";
    platforms = [ "x86_64-linux" ];
  };
}
