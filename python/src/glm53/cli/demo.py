"""`glm53 demo`: the embedded default: a tiny GLM-style MoE model built offline, locked, verified, served."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.cli.options import JsonOpt
from glm53.output import Output
from glm53.serve.launch import DEFAULT_HOST, DEFAULT_PORT


def demo_cmd(
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir",
            "-m",
            help="Where the tiny model lives (default: $XDG_CACHE_HOME/glm53/serve/demo/glm53-tiny).",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_PORT,
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
    from glm53.serve.demo import TINY_MODEL_NAME, prepare_demo_model, sample_request
    from glm53.serve.launch import check_host
    from glm53.serve.resolve import ServeRequest
    from glm53.serve.start import start

    out = Output(json_mode=json_out)
    check_host(host, listen_all=False)
    if not prepare_only:
        from glm53.host.native_libs import require_engine_libraries

        require_engine_libraries()
        from glm53.host.doctor import port_error

        problem = port_error(host, port)
        if problem is not None:
            from glm53.errors import BadInput

            raise BadInput(f"--port {port}: {host}:{port} is {problem}", hint="pass another --port")
    out.info("building the tiny model (first run only) ...")
    demo = prepare_demo_model(model_dir, rebuild=rebuild)
    action = "built and locked" if demo.built else ("locked" if demo.locked else "found")
    out.info(f"model {action}: {demo.model_dir} ({demo.verified})")
    if prepare_only:
        out.result(demo, lambda console: console.print(str(demo.model_dir), highlight=False))
        return
    base_url = f"http://{host}:{port}"
    out.info(
        f"starting vLLM (CPU) on {base_url}; ready in about half a minute (GET {base_url}/health). Ctrl-C stops it."
    )
    out.info("try:\n  " + sample_request(base_url, TINY_MODEL_NAME))
    start(ServeRequest(profile="cpu-tiny", model_dir=demo.model_dir, host=host, port=port), out)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
