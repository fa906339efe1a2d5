"""`glm53 repro`: show the pins, check the repository, audit a build or this host against the lock."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from glm53.cli.options import JsonOpt
from glm53.errors import BadInput, CheckFailed
from glm53.output import Output

repro_app = typer.Typer(help="Audit the repository, builds and hosts against repro.lock.json.",
                        no_args_is_help=True)

LockPathOpt = Annotated[Path | None, typer.Option("--lock", help="repro.lock.json to use (default: found).")]


def register(app: typer.Typer) -> None:
    app.add_typer(repro_app, name="repro")


def _findings_table(title: str, findings: list[object]) -> Table:
    table = Table(title=title)
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column)
    for f in findings:
        ok = bool(getattr(f, "ok", False))
        table.add_row(str(getattr(f, "check", "")), "[green]ok[/green]" if ok else "[red]FAIL[/red]",
                      str(getattr(f, "detail", "")), str(getattr(f, "fix", "") or ""))
    return table


@repro_app.command("show")
def show(lock_path: LockPathOpt = None, json_out: JsonOpt = False) -> None:
    """Print the pins in force and the lock's sha256."""
    from glm53.repro import find_repro_lock, load_repro_lock, repro_lock_sha256

    path = lock_path or find_repro_lock(Path.cwd())
    lock = load_repro_lock(path)
    payload = {"path": str(path), "sha256": repro_lock_sha256(path), "lock": lock.model_dump(mode="json"),
               "unpinned": lock.unpinned()}

    def render(console: Console) -> None:
        table = Table(title=f"{path}  sha256 {payload['sha256']}")
        table.add_column("pin")
        table.add_column("value")
        table.add_row("checkpoint", f"{lock.checkpoint.repo}@{lock.checkpoint.revision} ({lock.checkpoint.branch})")
        table.add_row("vLLM", f"{lock.engine.vllm.version} rev {lock.engine.vllm.rev or 'unpinned'}")
        table.add_row("GLM-5.3 overlay", f"{lock.engine.glm53_overlay.short_rev} rev "
                      f"{lock.engine.glm53_overlay.rev or 'unpinned'}")
        table.add_row("ExLlamaV3", f"{lock.engine.exllamav3.version} = {lock.engine.exllamav3.rev}")
        table.add_row("CUDA", f"{lock.engine.cuda.version}, driver >= {lock.engine.cuda.driver_min}, "
                      f"sm {','.join(lock.engine.cuda.capabilities)}")
        table.add_row("nixpkgs", f"{lock.nix.nixpkgs.ref} {lock.nix.nixpkgs.rev}")
        table.add_row("hardware", f"{lock.hardware.gpu_count}x {lock.hardware.gpu}, "
                      f"{lock.hardware.system_memory_gib} GiB RAM")
        console.print(table)
        if lock.unpinned():
            console.print("[yellow]unpinned:[/yellow] " + ", ".join(lock.unpinned()))

    Output(json_mode=json_out).result(payload, render)


@repro_app.command("check")
def check(
    root: Annotated[Path, typer.Option("--root", help="Repository root.")] = Path("."),
    release: Annotated[bool, typer.Option("--release", help="Also fail while any pin is unset.")] = False,
    lock_path: LockPathOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the repository against the lock: flake.lock, Makefile, profiles, README, tracked files."""
    from glm53.repro import check_repo, load_repro_lock

    lock = load_repro_lock(lock_path or (root / "repro.lock.json"))
    result = check_repo(root.resolve(), lock, release=release)
    payload = {"ok": result.ok, **result.model_dump(mode="json")}
    Output(json_mode=json_out).result(payload, lambda c: c.print(_findings_table("repository vs lock",
                                                                                 list(result.findings))))
    if not result.ok:
        raise CheckFailed("the repository disagrees with repro.lock.json", hint="see the fix column")


@repro_app.command("audit-build")
def audit_build_cmd(
    installable: Annotated[str, typer.Argument(help="Flake output (.#glm53) or, with --file, an attribute.")] = "",
    file: Annotated[Path | None, typer.Option("--file", help="Build from this Nix file (nix build -f).")] = None,
    nix_arg: Annotated[list[str] | None, typer.Option("--nix-arg", help="Extra argument for nix build.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Build an output twice and compare bit for bit; exit 1 when the rebuild differs."""
    from glm53.repro import audit_build

    extra = [*(["-f", str(file)] if file else []), *(nix_arg or [])]
    if not installable and file is None:
        raise BadInput("nothing to audit", hint="name a flake output (e.g. .#glm53) or pass --file FILE")
    result = audit_build(installable, extra_args=extra)

    def render(console: Console) -> None:
        table = Table(title=f"reproducibility of {result.installable}")
        table.add_column("output")
        table.add_column("narHash")
        for path in result.out_paths:
            table.add_row(path, result.nar_hashes.get(path, ""))
        console.print(table)
        console.print(("[green]reproducible[/green]: " if result.reproducible else "[red]NOT reproducible[/red]: ")
                      + result.detail)

    Output(json_mode=json_out).result(result, render)
    if not result.reproducible:
        raise CheckFailed(f"{result.installable} is not bit-for-bit reproducible",
                          hint="rebuild with --keep-failed and compare the outputs with diffoscope")


@repro_app.command("audit-host")
def audit_host_cmd(lock_path: LockPathOpt = None, json_out: JsonOpt = False) -> None:
    """Compare this host's GPUs, driver and memory with the hardware the recipe was validated on."""
    from glm53.host.memory import read_host_memory
    from glm53.repro import audit_host, load_repro_lock

    lock = load_repro_lock(lock_path)
    try:
        from glm53.host.gpus import read_gpus

        gpus: list[object] = list(read_gpus())
    except Exception:  # no driver, no NVML: the audit reports it as a finding
        gpus = []
    result = audit_host(lock, gpus=gpus, mem_total_bytes=read_host_memory().mem_total_bytes)
    payload = {"ok": result.ok, **result.model_dump(mode="json")}
    Output(json_mode=json_out).result(payload, lambda c: c.print(_findings_table("host vs lock",
                                                                                 list(result.findings))))
    if not result.ok:
        raise CheckFailed("this host differs from the validated hardware", hint="see the fix column")
