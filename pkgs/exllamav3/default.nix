# ExLlamaV3 at the recipe's pin (v1.4.6 = 499890c), from the PyPI wheel whose hash the lock records.
# The wheel ships CUDA sources that it would JIT-compile on first import; here the extension
# `exllamav3_ext` is compiled at build time (only for the pinned capabilities), so serving never compiles.
{
  lib,
  buildPythonPackage,
  callPackage,
  fetchurl,
  which,
  # build
  ninja,
  setuptools,
  symlinkJoin,
  # dependencies (the wheel's Requires-Dist)
  torch,
  tokenizers,
  numpy,
  rich,
  typing-extensions,
  safetensors,
  pillow,
  pyyaml,
  marisa-trie,
  pydantic,
  llguidance, # >= 1.7.0: the wheel repro.lock.json pins (engine.tabbyapi.python), passed by nix/overlay.nix
  einops,
  transformers,
  glmLib,
  # TORCH_CUDA_ARCH_LIST entries: the lock's (sm_80 kernels, sm_86 kernels with their PTX, which the driver
  # compiles for any newer GPU). `.override { cudaCapabilities = [ "8.9" ]; }` builds for one GPU only.
  cudaCapabilities ? glmLib.pins.cuda.exllamav3.capabilities,
}:
let
  pin = glmLib.pins.exllamav3;
  cudaPin = glmLib.pins.cuda.exllamav3;
  archList = lib.concatStringsSep ";" cudaCapabilities;
  # nvcc must be the CUDA that torch was built with: torch.utils.cpp_extension refuses another major
  # version, and a different minor would link against a second libcudart. So the set is torch's, and
  # the lock's engine.cuda.exllamav3.version must name it.
  inherit (torch) cudaPackages;
  cudaVersion = cudaPackages.cudaMajorMinorVersion;
  fla = callPackage ./fla.nix { inherit torch einops transformers; };
  # The libraries the extension includes and links, besides nvcc.
  cudaLibraries = with cudaPackages; [
    cuda_cudart
    cuda_cccl
    libcublas
    libcusparse
    libcusolver
    libcurand
  ];
  # torch.utils.cpp_extension takes headers from CUDA_HOME/include and links -lcudart from CUDA_HOME/lib64:
  # CUDA_HOME must be one tree with nvcc and these libraries (nixpkgs' CUDA is split per component, so
  # nvcc's own tree has neither), as nixpkgs' vLLM joins them for CUDA_TOOLKIT_ROOT_DIR.
  cudaHome = symlinkJoin {
    name = "cuda-home-${cudaVersion}";
    paths = lib.concatMap (p: [
      (lib.getBin p)
      (lib.getLib p)
      (lib.getDev p)
    ]) ([ cudaPackages.cuda_nvcc ] ++ cudaLibraries);
    # cpp_extension looks in lib64.
    postBuild = ''
      if [ ! -e $out/lib64 ] && [ -d $out/lib ]; then ln -s lib $out/lib64; fi
    '';
  };
in
assert lib.assertMsg (cudaVersion == cudaPin.version)
  "repro.lock.json: engine.cuda.exllamav3.version is ${cudaPin.version}, but torch at the pinned nixpkgs is built with CUDA ${cudaVersion}; ExLlamaV3 is compiled with torch's CUDA, so set engine.cuda.exllamav3.version to ${cudaVersion} (and its driver_min to what that CUDA needs), or move torch to another cudaPackages set in nix/nixpkgs.nix";
buildPythonPackage {
  pname = "exllamav3";
  inherit (pin) version;
  format = "wheel";

  src = fetchurl {
    inherit (pin.wheel) url hash;
  };

  # torch propagates python ninja, whose setup hook would otherwise make `ninja` the build, install
  # and check phases of this wheel install ("loading 'build.ninja': No such file or directory").
  # ninja stays on PATH for torch's BuildExtension in postInstall.
  dontUseNinjaBuild = true;
  dontUseNinjaInstall = true;
  dontUseNinjaCheck = true;

  nativeBuildInputs = [
    ninja
    which
    setuptools # build_ext.py runs setuptools' build_ext
    cudaPackages.cuda_nvcc
  ];
  buildInputs = cudaLibraries;
  dependencies = [
    torch
    tokenizers
    numpy
    rich
    typing-extensions
    safetensors
    ninja
    pillow
    pyyaml
    marisa-trie
    pydantic
    llguidance
    fla.flash-linear-attention
    # exllamav3/ext.py imports torch.utils.cpp_extension, which imports setuptools (no distutils in 3.12+).
    setuptools
  ];

  # Built after the wheel is installed: compile the bundled sources into a real extension module
  # beside the package (site-packages/exllamav3_ext.*.so), which exllamav3/ext.py imports instead of
  # JIT-compiling. Checked on an H200 (sm_86 + sm_90): see docs/nix.md, "Building the engine".
  postInstall = ''
    export CUDA_HOME=${cudaHome}
    export TORCH_CUDA_ARCH_LIST="${archList}"
    export MAX_JOBS=$NIX_BUILD_CORES
    site=$out/${torch.pythonModule.sitePackages}
    (cd "$NIX_BUILD_TOP" && ${torch.pythonModule.interpreter} ${./build_ext.py} "$site/exllamav3/exllamav3_ext" "$site")
    # glm53's GPU expert cache (lookup and fetch kernels over the same pointer tables), the same way and
    # flags, as its own module beside it; its own build folder, so no object of the first build is reused.
    mkdir -p "$NIX_BUILD_TOP/expert-cache"
    (cd "$NIX_BUILD_TOP/expert-cache" && EXL3_EXTENSION_NAME=glm53_expert_cache \
      ${torch.pythonModule.interpreter} ${./build_ext.py} ${./expert-cache} "$site")
  '';

  # torch first (it loads libc10 and libtorch), then the module: loading it resolves every symbol
  # against torch and the CUDA runtime, so a link error fails the build; it needs no GPU (the module
  # opens libcuda lazily). `exllamav3` itself imports fla and triton, which probe the driver: that
  # import is checked on GPU machines.
  pythonImportsCheck = [
    "torch"
    "exllamav3_ext"
    "glm53_expert_cache"
  ];

  passthru = {
    inherit cudaPackages cudaHome cudaCapabilities;
    inherit (fla) fla-core flash-linear-attention;
  };

  meta = {
    description = "ExLlamaV3 ${pin.version} (${pin.rev}) with its CUDA extension prebuilt for sm ${archList}";
    homepage = pin.url;
    license = lib.licenses.mit;
    platforms = [ "x86_64-linux" ];
  };
}
