# ExLlamaV3 at the recipe's pin (v1.4.6 = 499890c), from the PyPI wheel whose hash the lock records.
# The wheel ships CUDA sources that it would JIT-compile on first import; here the extension
# `exllamav3_ext` is compiled at build time (only for the pinned capabilities), so serving never compiles.
{
  lib,
  buildPythonPackage,
  fetchurl,
  torch,
  ninja,
  setuptools,
  safetensors,
  tokenizers,
  numpy,
  pydantic,
  rich,
  cudaPackages,
  which,
  glmLib,
}:
let
  pin = glmLib.pins.exllamav3;
  archList = lib.concatStringsSep ";" glmLib.pins.cuda.capabilities;
in
buildPythonPackage {
  pname = "exllamav3";
  inherit (pin) version;
  format = "wheel";

  src = fetchurl {
    inherit (pin.wheel) url hash;
  };

  nativeBuildInputs = [
    ninja
    which
    cudaPackages.cuda_nvcc
  ];
  buildInputs = with cudaPackages; [
    cuda_cudart
    cuda_cccl
    libcublas
    libcusparse
    libcusolver
    libcurand
  ];
  dependencies = [
    torch
    safetensors
    tokenizers
    numpy
    pydantic
    rich
  ];

  # Built after the wheel is installed: compile the bundled sources into a real extension module
  # beside the package, which exllamav3/ext.py prefers over its JIT path.
  postInstall = ''
    export CUDA_HOME=${cudaPackages.cuda_nvcc}
    export TORCH_CUDA_ARCH_LIST="${archList}"
    export MAX_JOBS=$NIX_BUILD_CORES
    site=$out/${torch.pythonModule.sitePackages}
    ${torch.pythonModule.interpreter} ${./build_ext.py} "$site/exllamav3/exllamav3_ext" "$site"
  '';

  pythonImportsCheck = [ ];

  meta = {
    description = "ExLlamaV3 ${pin.version} (${pin.rev}) with its CUDA extension prebuilt";
    homepage = pin.url;
    license = lib.licenses.mit;
    platforms = [ "x86_64-linux" ];
  };
}
