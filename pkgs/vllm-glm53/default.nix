# vLLM at the recipe's vendor commit with the GLM-5.3 overlay applied, built with nixpkgs' vLLM recipe
# for its inputs (dependencies, CUDA libraries, cmake flags) but with this commit's own patch set and
# CMake sources, for the lock's capabilities only.
# nixpkgs' recipe (pkgs/development/python-modules/vllm) patches and substitutes a tagged release
# (0.11.x on nixos-25.11); none of that applies to the vendor commit, so `patches` and `postPatch`
# are set here from scratch, not inherited. The sources vLLM's CMake would fetch (FetchContent) are
# fixed-output fetches below: the build sandbox is offline.
# Every commit here is published only in short form or depends on the vendor commit: they are null in
# repro.lock.json until someone fills them in, and evaluation stops with the field to fill, not with a
# hash mismatch.
{
  lib,
  vllm,
  torch,
  fetchFromGitHub,
  exllamav3-glm53,
  nvidia-ml-py,
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

  # What vLLM's CMake fetches at the vendor commit, pinned in repro.lock.json
  # (engine.vllm_cmake_sources): each rev read from its `read_from` in the vendor commit, then the hash
  # from a first build's mismatch message.
  cmakeSources = lib.mapAttrs (
    name: pin:
    fetchFromGitHub {
      name = "${name}-source";
      inherit (pin) owner repo;
      rev = requirePin "engine.vllm_cmake_sources.sources.${name}.rev (${pin.read_from})" pin.rev;
      hash = requirePin "engine.vllm_cmake_sources.sources.${name}.hash" pin.hash;
    }
  ) pins.vllm_cmake_sources.sources;
  inherit (cmakeSources)
    cutlass
    flashmla
    flashmla_cutlass
    vllm_flash_attn
    qutlass
    triton_kernels
    ;

  # Submodules the CMake projects expect, replaced by the fetched CUTLASS.
  withCutlass =
    name: src: cutlassSrc:
    torch.stdenv.mkDerivation {
      name = "${name}-with-cutlass";
      inherit src;
      dontConfigure = true;
      dontBuild = true;
      installPhase = ''
        rm -rf csrc/cutlass
        ln -s ${cutlassSrc} csrc/cutlass
        cp -r . $out
      '';
    };

  cudaPin = pins.cuda.vllm;
  # The lock's capabilities, as CMake's CUDA architectures (8.6 -> 86).
  cudaArchitectures = lib.concatMapStringsSep ";" (
    c: lib.replaceStrings [ "." ] [ "" ] (lib.removeSuffix "+PTX" c)
  ) cudaPin.capabilities;
  sourceDirs = {
    FLASH_MLA_SRC_DIR = "${withCutlass "flashmla" flashmla flashmla_cutlass}";
    VLLM_FLASH_ATTN_SRC_DIR = "${withCutlass "vllm-flash-attn" vllm_flash_attn cutlass}";
    QUTLASS_SRC_DIR = "${qutlass}";
  };

  cmakeArgs = [
    (lib.cmakeBool "FETCHCONTENT_FULLY_DISCONNECTED" true)
    (lib.cmakeFeature "FETCHCONTENT_SOURCE_DIR_CUTLASS" "${cutlass}")
    (lib.cmakeFeature "TORCH_CUDA_ARCH_LIST" (lib.concatStringsSep ";" cudaPin.capabilities))
    (lib.cmakeFeature "CUTLASS_NVCC_ARCHS_ENABLED" cudaArchitectures)
  ]
  ++ lib.mapAttrsToList lib.cmakeFeature sourceDirs
  # nixpkgs' flags that name no source (CUDA toolkit root, cuDNN, cuFile, cuBLAS), kept as they are.
  ++ lib.filter (
    flag:
    !(lib.any (key: lib.hasInfix key flag) [
      "FETCHCONTENT_SOURCE_DIR_CUTLASS"
      "FLASH_MLA_SRC_DIR"
      "VLLM_FLASH_ATTN_SRC_DIR"
      "QUTLASS_SRC_DIR"
      "TORCH_CUDA_ARCH_LIST"
      "CUTLASS_NVCC_ARCHS_ENABLED"
    ])
  ) (vllm.cmakeFlags or [ ]);

  cudaVersion = vllm.passthru.cudaPackages.cudaMajorMinorVersion or torch.cudaPackages.cudaMajorMinorVersion;
in
# The vendor build is CUDA 13 with torch 2.13 (engine.cuda.vllm); a nixpkgs whose torch has another CUDA builds
# another engine.
assert lib.assertMsg (lib.versions.majorMinor cudaPin.version == cudaVersion)
  "repro.lock.json: the vendor vLLM build is CUDA ${cudaPin.version} (engine.cuda.vllm.version), but torch at this nixpkgs is built with CUDA ${cudaVersion}: build from source only with a nixpkgs whose torch matches the vendor image's (engine.vllm.image.contents), or run the image (packages.image)";
(vllm.override { gpuTargets = cudaPin.capabilities; }).overridePythonAttrs (old: {
  version = pins.vllm.version;
  src = engineSrc;

  # nixpkgs' patches and substitutions target its own release; none is carried over but the one that lets
  # vLLM see the GPU (below).
  patches = [ ];
  postPatch = ''
    # The overlay is a tree of files laid over vLLM's package (model, quantization and kernel glue for
    # GLM-5.3 and EXL3); copying it is the whole of "applying" it.
    cp -r --no-preserve=mode ${overlaySrc}/vllm/. vllm/

    # vLLM's vendored pynvml loads libnvidia-ml.so.1 by name, which a Nix-built Python does not find on NixOS;
    # nixpkgs' recipe removes it for nixpkgs' pynvml (nvidia-ml-py, patched to fall back to
    # /run/opengl-driver/lib). The vendored module becomes nixpkgs' module, whichever files import it.
    cp ${./pynvml.py} vllm/third_party/pynvml.py

    # nixpkgs provides torch and setuptools at its own versions; the build-system pins are exact.
    sed -i -E 's/"torch ?==[^"]*"/"torch"/; s/"setuptools[<>=][^"]*"/"setuptools"/' pyproject.toml

    # CMake's supported-Python list lags nixpkgs' interpreter.
    sed -i -E 's/set\(PYTHON_SUPPORTED_VERSIONS /set(PYTHON_SUPPORTED_VERSIONS "${lib.versions.majorMinor torch.pythonModule.version}" /' CMakeLists.txt
  '';

  dependencies = (old.dependencies or [ ]) ++ [
    exllamav3-glm53
    nvidia-ml-py
  ];

  # nixpkgs passes cmakeFlags to vLLM's setup.py through its own setup.py patch, dropped above; the
  # vendor setup.py reads CMAKE_ARGS instead, and the source-dir variables are also read from the
  # environment by cmake/external_projects/*.cmake.
  cmakeFlags = cmakeArgs;
  env = (old.env or { }) // {
    SETUPTOOLS_SCM_PRETEND_VERSION = pins.vllm.version;
    CMAKE_ARGS = lib.concatStringsSep " " cmakeArgs;
    inherit (sourceDirs) FLASH_MLA_SRC_DIR VLLM_FLASH_ATTN_SRC_DIR QUTLASS_SRC_DIR;
    TRITON_KERNELS_SRC_DIR = "${triton_kernels}/python/triton_kernels/triton_kernels";
  };
})
