"""Rich tables for the checkpoint commands (human output; `--json` prints the models instead)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from glm53.checkpoint.hub import DownloadResult
from glm53.checkpoint.index_repair import InstallResult
from glm53.checkpoint.lock import CheckpointLock
from glm53.checkpoint.verify import VerifyReport


def render_lock(lock: CheckpointLock, path: Path, console: Console) -> None:
    table = Table("file", "bytes", "sha256", "tensors", title=f"lock written to {path}")
    for f in lock.files:
        table.add_row(
            f.path,
            f"{f.size:,}",
            f.sha256[:16] + "…",
            str(f.safetensors.tensors) if f.safetensors else "",
        )
    console.print(table)
    console.print(f"{len(lock.files)} files, {lock.total_size:,} bytes")


def render_download(result: DownloadResult, console: Console) -> None:
    made = " (made from the Hub's metadata)" if result.lock_created else ""
    resumed = f", {result.bytes_resumed:,} of them kept from an earlier run" if result.bytes_resumed else ""
    console.print(
        f"fetched {result.files_fetched} of {result.files} files ({result.bytes_fetched:,} bytes{resumed})"
        f" into {result.model_dir}"
    )
    if result.refetched:
        console.print(f"fetched again from byte 0 (kept bytes did not match): {', '.join(result.refetched)}")
    console.print(f"lock {result.lock}{made}: {result.verify.summary}")


def render_verify(report: VerifyReport, console: Console) -> None:
    table = Table("problem", "path", "detail", title=f"verify {report.model_dir} against {report.lock}")
    for path in report.missing:
        table.add_row("[red]missing[/red]", path, "")
    for m in report.size_mismatch:
        table.add_row("[red]size mismatch[/red]", m.path, f"expected {m.expected:,} bytes, found {m.actual:,}")
    for h in report.hash_mismatch:
        table.add_row("[red]hash mismatch[/red]", h.path, f"expected {h.expected[:16]}…, found {h.actual[:16]}…")
    for path in report.changed_while_hashing:
        table.add_row("[red]changed while hashing[/red]", path, "run verify again once writes stop")
    for path in report.stray_safetensors:
        table.add_row("[red]stray safetensors[/red]", path, "loaders glob *.safetensors: move it out")
    for path in report.extra_files:
        table.add_row("[yellow]extra file[/yellow]", path, "not in the lock (harmless)")
    if table.row_count:
        console.print(table)
    rate = report.bytes_hashed / report.seconds / 1e6 if report.seconds > 0 else 0.0
    console.print(
        f"{'[green]OK[/green]' if report.ok else '[red]FAILED[/red]'}: {report.summary}\n"
        f"{report.files} files, {report.bytes_total:,} bytes: {report.bytes_hashed:,} hashed "
        f"({rate:,.0f} MB/s), {report.bytes_from_cache:,} unchanged since last verify; "
        f"{report.seconds:.2f} s"
    )


def install_json(result: InstallResult) -> dict[str, Any]:
    """The install result for `--json`: the index checks before and after in their report form."""
    return result.model_dump(mode="json") | {
        "message": result.message,
        "before": result.before.model_dump_report(),
        "after": result.after.model_dump_report(),
    }


def render_install(result: InstallResult, console: Console) -> None:
    check = result.after if result.changed else result.before
    table = Table(
        "file",
        "tensors",
        "indexed",
        "bytes",
        title=f"index of {result.model_dir}" + (f" (spec {check.spec})" if check.spec else ""),
    )
    for f in check.files:
        table.add_row(f.file, str(f.tensors), str(f.indexed), f"{f.tensor_bytes:,}")
    console.print(table)
    for note in check.spec_notes:
        console.print(f"[dim]{note}[/dim]")
    console.print(result.message)
