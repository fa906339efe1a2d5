# One nixpkgs instance for every output: CUDA on (its licences accepted by name, nothing else unfree),
# capabilities left at nixpkgs' defaults so torch and CUDA come from the public binary caches;
# only vLLM and ExLlamaV3 are narrowed to the recipe's sm_86 (see pkgs/).
{
  nixpkgs,
  system,
  overlay,
}:
import nixpkgs {
  inherit system;
  overlays = [ overlay ];
  config = {
    cudaSupport = true;
    allowUnfreePredicate =
      pkg:
      let
        name = nixpkgs.lib.getName pkg;
      in
      nixpkgs.lib.hasPrefix "cuda" name
      || nixpkgs.lib.hasPrefix "libcu" name
      || nixpkgs.lib.hasPrefix "libnv" name
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
