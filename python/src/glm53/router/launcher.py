"""`python -m glm53.router.launcher ARGS`: vllm-router's own launcher, plus the API key from the environment.

vllm-router takes its key only as `--api-key KEY`, which would put it in /proc/PID/cmdline for every user to
read. This shim parses ARGS with the router's own parser, sets the key from GLM53_ROUTER_API_KEY on the parsed
arguments (removing it from the environment first), and starts the router in this process.
"""

from __future__ import annotations

import os
import sys

from glm53.router.launch import API_KEY_ENV


def main(argv: list[str] | None = None) -> None:
    key = os.environ.pop(API_KEY_ENV, None)
    try:
        from vllm_router.launch_router import launch_router, parse_router_args  # optional: the router's package
    except ImportError as exc:  # pragma: no cover - depends on the installation
        sys.stderr.write(f"vllm-router is not installed in {sys.executable}: {exc}\n")
        sys.exit(3)
    args = parse_router_args(sys.argv[1:] if argv is None else argv)
    if "--api-key" in (sys.argv[1:] if argv is None else argv):
        sys.stderr.write("glm53.router.launcher: pass the key in the environment, never as --api-key\n")
        sys.exit(2)
    if key:
        args.api_key = key
    launch_router(args)


if __name__ == "__main__":
    main()
