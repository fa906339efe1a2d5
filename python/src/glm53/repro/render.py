"""Rich tables for `glm53 repro` (human output; `--json` prints the models instead)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from glm53.recipe.pins import ReproLock
from glm53.repro import BuildAudit, RepoFinding
from glm53.repro.engine_env import EngineInstallResult, InstallPlan
from glm53.repro.image import ImageAudit
from glm53.repro.manifest import ManifestDiff


def render_pins(lock: ReproLock, source: str, sha256: str | None, console: Console) -> None:
    table = Table(title=f"{source}  sha256 {sha256}")
    table.add_column("pin")
    table.add_column("value", overflow="fold")  # hashes whole, folded, never cut
    table.add_row("checkpoint", f"{lock.checkpoint.repo}@{lock.checkpoint.revision} ({lock.checkpoint.branch})")
    table.add_row("vLLM", f"{lock.engine.vllm.version} rev {lock.engine.vllm.rev or 'unpinned'}")
    image = lock.engine.vllm.image
    if image is not None:
        contents = ", ".join(f"{name} {version}" for name, version in image.contents.items())
        table.add_row(
            "vLLM image",
            f"{image.reference} ({image.platform} {image.digest}); Nix hash {image.hash or 'unresolved'}; {contents}",
        )
    table.add_row(
        "GLM-5.3 overlay", f"{lock.engine.glm53_overlay.short_rev} rev {lock.engine.glm53_overlay.rev or 'unpinned'}"
    )
    table.add_row("ExLlamaV3", f"{lock.engine.exllamav3.version} = {lock.engine.exllamav3.rev}")
    tabby = lock.engine.tabbyapi
    wheels = ", ".join(f"{name} {wheel.version}" for name, wheel in sorted(tabby.python.items()))
    table.add_row(
        "TabbyAPI", f"rev {tabby.rev or 'unpinned'} ({tabby.date})" + (f"; PyPI wheels: {wheels}" if wheels else "")
    )
    for engine in ("vllm", "exllamav3"):
        cuda = lock.engine.cuda.of(engine)
        table.add_row(
            f"CUDA ({engine})",
            f"{cuda.version}, driver >= {cuda.driver_min}, sm {','.join(cuda.capabilities)}; {cuda.source}",
        )
    wheels = ", ".join(f"{name} {wheel.version}" for name, wheel in sorted(lock.router.python.items()))
    table.add_row("router", f"PyPI wheels: {wheels}")
    table.add_row("nixpkgs", f"{lock.nix.nixpkgs.ref} {lock.nix.nixpkgs.rev}")
    table.add_row(
        "hardware", f"{lock.hardware.gpu_count}x {lock.hardware.gpu}, {lock.hardware.system_memory_gib} GiB RAM"
    )
    console.print(table)
    unresolved = lock.unresolved()
    if unresolved:
        pending = Table(title=f"[yellow]unresolved: {len(unresolved)}[/yellow]")
        # The field names tell the rows apart: never cut (a narrow terminal folds them instead), and as wide
        # as the longest where it fits; the prose columns wrap.
        widest = max(len(item.field) for item in unresolved)
        pending.add_column("field", overflow="fold", min_width=min(widest, max(16, console.width - 58)))
        pending.add_column("needed by", overflow="fold")
        pending.add_column("resolved by", overflow="fold")
        for item in unresolved:
            pending.add_row(item.field, item.needed_by, item.resolved_by)
        console.print(pending)


def render_findings(title: str, findings: Sequence[RepoFinding], console: Console) -> None:
    table = Table(title=title)
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column)
    for f in findings:
        table.add_row(f.check, "[green]ok[/green]" if f.ok else "[red]FAIL[/red]", f.detail, f.fix or "")
    console.print(table)


def render_build_audit(result: BuildAudit, console: Console) -> None:
    table = Table(title=f"reproducibility of {result.installable}")
    table.add_column("output")
    table.add_column("narHash")
    for path in result.out_paths:
        table.add_row(path, result.nar_hashes.get(path, ""))
    console.print(table)
    console.print(
        ("[green]reproducible[/green]: " if result.reproducible else "[red]NOT reproducible[/red]: ") + result.detail
    )


def render_image_audit(result: ImageAudit, console: Console) -> None:
    console.print(f"A {result.a}  sha256 {result.sha256_a}")
    console.print(f"B {result.b}  sha256 {result.sha256_b}")
    if result.layers:
        table = Table(title="layers")
        for column in ("#", "layer", "A sha256", "B sha256"):
            table.add_column(column)
        for layer in result.layers:
            mark = "" if layer.same else "[red]"
            table.add_row(str(layer.index), layer.name, mark + str(layer.sha256_a), mark + str(layer.sha256_b))
        console.print(table)
    console.print(("[green]identical[/green]: " if result.identical else "[red]differ[/red]: ") + result.detail)
    if result.suggestion:
        console.print(f"compare in depth: {result.suggestion}")


def render_manifest_diff(result: ManifestDiff, console: Console) -> None:
    if not result.differences:
        console.print(f"[green]no differences[/green] between {result.a} and {result.b}")
        return
    table = Table(title=f"{result.a} vs {result.b}")
    for column in ("group", "fact", "A", "B", "why it matters"):
        table.add_column(column)
    for d in result.differences:
        group = f"[red]{d.group}[/red]" if d.group == "pinned" else d.group
        table.add_row(group, d.fact, str(d.a), str(d.b), d.why)
    console.print(table)


def render_install_steps(plan: InstallPlan, console: Console) -> None:
    facts = plan.base
    console.print(
        f"base interpreter: {facts.python} (CPython {facts.version}, {facts.abi}), torch {facts.torch}, "
        f"CUDA {facts.cuda}"
    )
    table = Table("step", "runs", "what")
    for step in plan.steps:
        table.add_row(step.name, shlex.join(step.argv) if step.argv else "(glm53: copy and check)", step.detail)
    console.print(table)


def render_install(result: EngineInstallResult, console: Console) -> None:
    console.print(
        f"installed into {result.target}: {result.wheels} wheels ({result.abi}), TabbyAPI {result.tabbyapi_rev[:12]}, "
        f"extensions for {', '.join(result.cuda_arch)} in {sum(result.seconds.values()):.0f} s"
    )
    console.print("next:")
    for line in result.next:
        console.print(f"  {line}")
