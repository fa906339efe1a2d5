# The vendor image the recipe runs, pulled by its linux/amd64 digest (the manifest of the index digest the
# recipe names). `hash` is repro.lock.json's engine.vllm.image.hash; `glm53 repro resolve` fills it by building
# this with a placeholder (packages.image.probe) and reading the hash Nix reports.
{
  dockerTools,
  glmLib,
  hash ? glmLib.requirePin "engine.vllm.image.hash" glmLib.pins.vllm.image.hash,
}:
let
  pin = glmLib.pins.vllm.image;
in
dockerTools.pullImage {
  imageName = pin.name;
  imageDigest = pin.digest;
  inherit hash;
  finalImageName = pin.name;
  finalImageTag = pin.tag;
  os = "linux";
  arch = "amd64";
}
