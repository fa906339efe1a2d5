"""vLLM's vendored NVML bindings, replaced by nixpkgs' pynvml (nvidia-ml-py), which finds libnvidia-ml.so.1 in
/run/opengl-driver/lib on NixOS: every `import vllm.third_party.pynvml` (and `from ... import`) gets that module."""

import sys

import pynvml

sys.modules[__name__] = pynvml
