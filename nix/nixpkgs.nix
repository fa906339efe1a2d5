# Two nixpkgs instances from one input. `pkgs` has CUDA off: glm53's CLI, the router, the vLLM engine's image
# (its CUDA is the vendor image's), the checks and the dev shell. With CUDA on everywhere, nixpkgs' safetensors
# (a dependency of the CLI) runs its tests with torch, which is then CUDA torch, so `nix build .#glm53`, `nix
# develop` and a router host would wait on a CUDA build. `pkgsCuda` has CUDA on (its licences accepted by name,
# nothing else unfree) for what needs it: the exllamav3 engine (torch, ExLlamaV3's kernels) and the from-source
# vLLM. Capabilities stay at nixpkgs' defaults there, so torch and CUDA come from the binary caches; only vLLM
# and ExLlamaV3 are narrowed to the lock's engine.cuda capabilities (see pkgs/).
{
  nixpkgs,
  system,
  overlay,
}:
let
  inherit (nixpkgs) lib;
  common = {
    inherit system;
    overlays = [ overlay ];
  };
in
{
  pkgs = import nixpkgs common;
  pkgsCuda = import nixpkgs (
    common
    // {
      config = {
        cudaSupport = true;
        allowUnfreePredicate =
          pkg:
          let
            name = lib.getName pkg;
          in
          lib.hasPrefix "cuda" name
          || lib.hasPrefix "libcu" name
          || lib.hasPrefix "libnv" name
          || builtins.elem name [
            "cudnn"
            "nvidia-x11"
            "nccl"
            "cusparselt"
            "libcusparse_lt"
            "cutensor"
          ];
      };
    }
  );
}
