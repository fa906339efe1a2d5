# vLLM at the recipe's vendor commit with the GLM-5.3 overlay applied, built from nixpkgs' vLLM recipe
# (which already pins CUTLASS, FlashMLA and flash-attention as separate fetches) for sm_86 only.
# Both commits are published only in short form: the lock holds null until someone fills the full
# commit and hash, and evaluation stops with that instruction instead of building something else.
{
  lib,
  vllm,
  fetchFromGitHub,
  exllamav3-glm53,
  glmLib,
}:
let
  inherit (glmLib) requirePin;
  pins = glmLib.pins;
  engineSrc = fetchFromGitHub {
    owner = "vllm-project";
    repo = "vllm";
    rev = requirePin "engine.vllm.rev" pins.vllm.rev;
    hash = requirePin "engine.vllm.hash" pins.vllm.hash;
  };
  overlaySrc = fetchFromGitHub {
    owner = "spele1100";
    repo = "vllm-glm53";
    rev = requirePin "engine.glm53_overlay.rev" pins.glm53_overlay.rev;
    hash = requirePin "engine.glm53_overlay.hash" pins.glm53_overlay.hash;
  };
in
(vllm.override { gpuTargets = pins.cuda.capabilities; }).overridePythonAttrs (old: {
  version = pins.vllm.version;
  src = engineSrc;
  # The overlay is a tree of files laid over vLLM's package (model, quantization and kernel glue for
  # GLM-5.3 and EXL3); copying it is the whole of "applying" it.
  postPatch = (old.postPatch or "") + ''
    cp -r --no-preserve=mode ${overlaySrc}/vllm/. vllm/
  '';
  dependencies = (old.dependencies or [ ]) ++ [ exllamav3-glm53 ];
  env = (old.env or { }) // {
    SETUPTOOLS_SCM_PRETEND_VERSION = pins.vllm.version;
  };
})
