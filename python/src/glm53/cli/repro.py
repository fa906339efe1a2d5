"""`glm53 repro`: show the pins, check the repository, audit a build or this host against the lock."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.cli.options import JsonOpt, ReproLockOpt
from glm53.errors import BadInput, CheckFailed
from glm53.output import Output

repro_app = typer.Typer(help="Audit the repository, builds and hosts against repro.lock.json.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(repro_app, name="repro")


@repro_app.command("show")
def show(lock_path: ReproLockOpt = None, json_out: JsonOpt = False) -> None:
    """Print the pins in force and the lock's sha256."""
    from glm53.repro import find_repro_lock, load_repro_lock, repro_lock_sha256
    from glm53.repro_render import render_pins

    path = lock_path or find_repro_lock(Path.cwd())
    lock = load_repro_lock(path)
    sha256 = repro_lock_sha256(path)
    payload = {"path": str(path), "sha256": sha256, "lock": lock.model_dump(mode="json"), "unpinned": lock.unpinned()}
    Output(json_mode=json_out).result(payload, lambda console: render_pins(lock, str(path), sha256, console))


@repro_app.command("check")
def check(
    root: Annotated[Path, typer.Option("--root", help="Repository root.")] = Path("."),
    release: Annotated[bool, typer.Option("--release", help="Also fail while any pin is unset.")] = False,
    lock_path: ReproLockOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the repository against the lock: flake.lock, Makefile, profiles, README, tracked files."""
    from glm53.repro import check_repo, load_repro_lock
    from glm53.repro_render import render_findings

    lock = load_repro_lock(lock_path or (root / "repro.lock.json"))
    result = check_repo(root.resolve(), lock, release=release)
    payload = {"ok": result.ok, **result.model_dump(mode="json")}
    Output(json_mode=json_out).result(
        payload, lambda console: render_findings("repository vs lock", result.findings, console)
    )
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
    from glm53.repro_render import render_build_audit

    extra = [*(["-f", str(file)] if file else []), *(nix_arg or [])]
    if not installable and file is None:
        raise BadInput("nothing to audit", hint="name a flake output (e.g. .#glm53) or pass --file FILE")
    result = audit_build(installable, extra_args=extra)
    Output(json_mode=json_out).result(result, lambda console: render_build_audit(result, console))
    if not result.reproducible:
        raise CheckFailed(
            f"{result.installable} is not bit-for-bit reproducible",
            hint="rebuild with --keep-failed and compare the outputs with diffoscope",
        )


@repro_app.command("audit-host")
def audit_host_cmd(lock_path: ReproLockOpt = None, json_out: JsonOpt = False) -> None:
    """Compare this host's GPUs, driver and memory with the hardware the recipe was validated on.

    The same checks as `glm53 doctor`, with the validated GPU count, model and system memory from the lock.
    """
    from glm53.host.doctor import audit_host, limits_from_lock
    from glm53.host.facts import read_host_facts
    from glm53.host.render import render_report
    from glm53.repro import load_repro_lock

    limits = limits_from_lock(load_repro_lock(lock_path))
    report = audit_host(read_host_facts(engine_libraries=None), limits)
    payload = {"ok": report.ok, **report.model_dump(mode="json")}
    Output(json_mode=json_out).result(payload, lambda console: render_report(console, report, "host vs lock"))
    if not report.ok:
        names = ", ".join(c.name for c in report.failures)
        raise CheckFailed(f"this host differs from the validated hardware: {names}", hint="see the fix column")
