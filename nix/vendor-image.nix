# The vLLM engine as the recipe builds it (docker/Dockerfile of the recipe's repository): the vendor image,
# pinned by digest, and on top of it the GLM-5.3 overlay copied over the image's vLLM, ExLlamaV3 at the lock's
# wheel with its extension compiled against the image's own torch and CUDA (the recipe's "exllamav3 @ 499890c
# overlay (sm_86)"), and glm53 as the entrypoint. The image brings what no nixpkgs builds: this vLLM build with
# torch 2.13.0+cu130 and CUDA 13.0.1 (docs/nix.md, "The vLLM engine").
# What runs the image's own programs (its Python, nvcc) runs inside it: dockerTools.buildImage's runAsRoot, in
# a VM (the builder needs KVM) with the store mounted and no network.
{
  lib,
  dockerTools,
  fetchFromGitHub,
  fetchurl,
  runCommand,
  cacert,
  glm53,
  glmLib,
  name ? "glm53",
}:
let
  pin = glmLib.pins.vllm.image;
  inherit (glmLib) requirePin;
  overlayPin = glmLib.pins.glm53_overlay;
  wheel = glmLib.pins.exllamav3.wheel;

  vendor = import ./vendor-pull.nix { inherit dockerTools glmLib; };
  overlay = fetchFromGitHub {
    inherit (glmLib.githubRepo "engine.glm53_overlay.url" overlayPin.url) owner repo;
    rev = requirePin "engine.glm53_overlay.rev" overlayPin.rev;
    hash = requirePin "engine.glm53_overlay.hash" overlayPin.hash;
  };
  exllamav3 = fetchurl { inherit (wheel) url hash; };
  # glm53 under /opt (the vendor image's /bin is a link to /usr/bin: a layer must not replace it).
  opt = runCommand "glm53-opt" { } ''
    mkdir -p $out/opt/glm53/bin
    ln -s ${lib.getExe glm53} $out/opt/glm53/bin/glm53
  '';
  # buildImage does not inherit the vendor image's Env: PATH as nvidia/cuda images set it, on which the build
  # below checks that the image's `vllm` is found.
  path = "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
in
dockerTools.buildImage {
  inherit name;
  tag = glmLib.version;
  fromImage = vendor;
  copyToRoot = [
    opt
    cacert
  ];
  # The vendor image unpacked, and nvcc's objects: tens of GB.
  diskSize = 81920;
  buildVMMemorySize = 16384;
  runAsRoot = ''
    export PATH=${path}:$PATH
    vllm=$(command -v vllm) || {
      echo "the vendor image has no vllm on ${path}" >&2
      exit 1
    }
    echo "vendor vllm: $vllm"
    site=$(python3 -c 'import os, sysconfig; print(sysconfig.get_paths()["purelib"])')
    package=$(python3 -c 'import importlib.util; print(importlib.util.find_spec("vllm").submodule_search_locations[0])')

    # The overlay is a tree of files laid over vLLM's package; copying it is the whole of applying it.
    cp -r --no-preserve=mode ${overlay}/vllm/. "$package/"

    # ExLlamaV3's wheel is pure Python: unpacked into site-packages it is installed (the image may have
    # neither pip nor uv), without its dependencies, which the image's vLLM already pulls in.
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' ${exllamav3} "$site"

    # Its extension, compiled against the image's torch and CUDA for the lock's capabilities, so that serving
    # never JIT-compiles (the same script and flags as pkgs/exllamav3).
    export CUDA_HOME=/usr/local/cuda
    export TORCH_CUDA_ARCH_LIST="${glmLib.torchArchList "vllm"}"
    export MAX_JOBS=$(nproc)
    python3 ${../pkgs/exllamav3/build_ext.py} "$site/exllamav3/exllamav3_ext" "$site"
    python3 -c 'import torch, exllamav3_ext'
    rm -rf /root/.cache
  '';
  config = glmLib.imageConfig {
    inherit name cacert path;
    command = [
      "/opt/glm53/bin/glm53"
      "serve"
    ];
    labels = {
      "org.opencontainers.image.base.name" = "${pin.name}:${pin.tag}@${pin.index_digest}";
      "org.opencontainers.image.base.digest" = pin.digest;
      "io.glm53.overlay.rev" = requirePin "engine.glm53_overlay.rev" overlayPin.rev;
    };
  };
}
