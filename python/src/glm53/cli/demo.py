"""`glm53 demo`: the embedded default: a tiny GLM-style MoE model built offline, locked, verified, served."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.cli.options import JsonOpt, PortOpt
from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.output import Output
from glm53.serve.demo import demo_start_checks, prepare_demo_model, serve_demo


def demo_cmd(
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir",
            help="Where the tiny model lives (default: $XDG_CACHE_HOME/glm53/demo/glm53-tiny).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback only).")] = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Build the model again even if it exists.")] = False,
    prepare_only: Annotated[bool, typer.Option("--prepare-only", help="Build, lock and verify; do not serve.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Serve a tiny GLM-style MoE model with real vLLM on the CPU: no GPU, no download.

    The model (Glm4MoeForCausalLM, 2 layers, 8 experts, random weights) is built offline in seconds, locked
    and verified like a real checkpoint, then served through `glm53 serve --profile cpu-tiny`.
    Ctrl-C stops it.

    Examples:
      glm53 demo
      glm53 demo --port 8001 --rebuild
      glm53 demo --prepare-only --model-dir /tmp/tiny --json
    """

    out = Output(json_mode=json_out)
    if not prepare_only:
        demo_start_checks(host, port)
    out.info("building the tiny model (first run only) ...")
    demo = prepare_demo_model(model_dir, rebuild=rebuild)
    action = "built and locked" if demo.built else ("locked" if demo.locked else "found")
    out.info(f"model {action}: {demo.model_dir} ({demo.verified})")
    if prepare_only:
        out.result(demo, lambda console: console.print(str(demo.model_dir), highlight=False))
        return
    serve_demo(demo, host, port, out)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
