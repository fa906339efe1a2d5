"""`glm53 model`: lock, download, verify and install (index repair) a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from glm53.cli.options import ForceOpt, JsonOpt, LockOpt, ModelDirArg
from glm53.errors import BadInput, CheckFailed
from glm53.output import Output

model_app = typer.Typer(no_args_is_help=True, help="Lock, download, verify and install a checkpoint.")

JobsOpt = Annotated[int | None, typer.Option("--jobs", min=1, help="Files hashed at once (default: CPUs).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Hash every file, ignoring the stat cache.")]


@model_app.command("lock")
def lock_cmd(
    model_dir: Annotated[
        Path | None, typer.Argument(help="Checkpoint directory to lock.", show_default=False)
    ] = None,
    from_hub: Annotated[
        str | None,
        typer.Option("--from-hub", metavar="REPO", help="Lock from the Hub's file metadata instead."),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision", help="Full 40-hex commit: required with --from-hub, recorded in a local lock."
        ),
    ] = None,
    out_path: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Lock file to write (default: DIR/checkpoint.lock.json, or ./ with --from-hub)."
        ),
    ] = None,
    repo: Annotated[str | None, typer.Option("--repo", help="Hub repository to record (local lock).")] = None,
    jobs: JobsOpt = None,
    no_cache: NoCacheOpt = False,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a checkpoint lock: path, size, sha256 of every file (+ tensor count and header sha256).

    From a local copy: glm53 model lock /srv/models/glm53 --repo turboderp/GLM-5.3-Flash-exl3 --revision REV

    From the Hub, without downloading weights:
    glm53 model lock --from-hub turboderp/GLM-5.3-Flash-exl3 --revision REV --out glm53.lock.json
    """
    from glm53.checkpoint.lock import default_lock_path, lock_from_directory, lock_from_hub, write_lock
    from glm53.cli.progress import byte_progress

    out = Output(json_mode=json_out)
    if from_hub is not None:
        if model_dir is not None or repo is not None:
            raise BadInput("--from-hub REPO takes neither DIR nor --repo")
        if revision is None:
            raise BadInput("--from-hub needs --revision (a full 40-hex commit)")
        target = out_path or Path("checkpoint.lock.json")
        _refuse_existing(target, force)
        lock = lock_from_hub(from_hub, revision)
    else:
        if model_dir is None:
            raise BadInput("pass the checkpoint directory DIR, or --from-hub REPO --revision REV")
        target = out_path or default_lock_path(model_dir)
        _refuse_existing(target, force)
        with byte_progress(out, "hashing") as progress:
            lock = lock_from_directory(
                model_dir, repo=repo, revision=revision, jobs=jobs, use_cache=not no_cache, progress=progress
            )
    write_lock(lock, target, force=force)

    def render(console: Console) -> None:
        table = Table("file", "bytes", "sha256", "tensors", title=f"lock written to {target}")
        for f in lock.files:
            table.add_row(
                f.path,
                f"{f.size:,}",
                f.sha256[:16] + "…",
                str(f.safetensors.tensors) if f.safetensors else "",
            )
        console.print(table)
        console.print(f"{len(lock.files)} files, {lock.total_size:,} bytes")

    out.result({"lock": str(target), **lock.model_dump(mode="json")}, render)


def _refuse_existing(target: Path, force: bool) -> None:
    if target.exists() and not force:
        raise BadInput(f"{target} already exists", hint="pass --force to replace it")


@model_app.command("download")
def download_cmd(
    repo: Annotated[str, typer.Option("--repo", help="Hub repository, e.g. turboderp/GLM-5.3-Flash-exl3.")],
    revision: Annotated[str, typer.Option("--revision", help="Full 40-hex commit to download.")],
    model_dir: Annotated[Path, typer.Option("--dir", help="Directory to download into.")],
    lock_path: LockOpt = None,
    jobs: JobsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Download the checkpoint at a pinned revision, then verify every file against the lock.

    Resumable across runs: an interrupted file continues from the bytes already on disk.
    """
    from glm53.checkpoint.hub import download_checkpoint
    from glm53.cli.progress import byte_progress

    out = Output(json_mode=json_out)
    try:
        with byte_progress(out, "downloading") as progress:
            result = download_checkpoint(
                repo,
                revision,
                model_dir,
                lock_path=lock_path,
                jobs=jobs,
                progress=progress,
                verify_progress=progress.stage("verifying") if progress is not None else None,
            )
    except KeyboardInterrupt:
        out.warn("interrupted: the bytes downloaded so far are kept; run the same command again to continue")
        raise typer.Exit(130) from None

    def render(console: Console) -> None:
        made = " (made from the Hub's metadata)" if result.lock_created else ""
        resumed = (
            f", {result.bytes_resumed:,} of them kept from an earlier run" if result.bytes_resumed else ""
        )
        console.print(
            f"fetched {result.files_fetched} of {result.files} files ({result.bytes_fetched:,} bytes{resumed})"
            f" into {result.model_dir}"
        )
        if result.refetched:
            console.print(f"fetched again from byte 0 (kept bytes did not match): {', '.join(result.refetched)}")
        console.print(f"lock {result.lock}{made}: {result.verify.summary}")

    out.result(result, render)


@model_app.command("verify")
def verify_cmd(
    model_dir: ModelDirArg,
    lock_path: LockOpt = None,
    jobs: JobsOpt = None,
    no_cache: NoCacheOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Check the size and sha256 of every locked file, and look for extra files.

    Exit 0 all good, 1 a mismatch, 2 bad input.
    """
    from glm53.checkpoint.verify import verify_checkpoint
    from glm53.cli.progress import byte_progress

    out = Output(json_mode=json_out)
    with byte_progress(out, "verifying") as progress:
        report = verify_checkpoint(model_dir, lock_path, jobs=jobs, use_cache=not no_cache, progress=progress)

    def render(console: Console) -> None:
        table = Table("problem", "path", "detail", title=f"verify {report.model_dir} against {report.lock}")
        for path in report.missing:
            table.add_row("[red]missing[/red]", path, "")
        for m in report.size_mismatch:
            table.add_row(
                "[red]size mismatch[/red]", m.path, f"expected {m.expected:,} bytes, found {m.actual:,}"
            )
        for h in report.hash_mismatch:
            table.add_row(
                "[red]hash mismatch[/red]", h.path, f"expected {h.expected[:16]}…, found {h.actual[:16]}…"
            )
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

    out.result(report, render)
    if not report.ok:
        raise CheckFailed(f"{model_dir} does not match its lock: {report.summary}",
                          hint="download the listed files again (glm53 model download), or re-lock deliberately")


@model_app.command("install")
def install_cmd(
    model_dir: ModelDirArg,
    check: Annotated[bool, typer.Option("--check", help="Only check the index; write nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Repair model.safetensors.index.json so it lists every tensor (kpool_aux, mtp); keeps the original.

    A second run changes nothing. --check exits 1 when the index is incomplete or inconsistent.
    """
    from glm53.checkpoint.index_repair import install

    out = Output(json_mode=json_out)
    result = install(model_dir, check_only=check)
    check_result = result.after if result.changed else result.before

    def render(console: Console) -> None:
        table = Table(
            "file",
            "tensors",
            "indexed",
            "bytes",
            title=f"index of {result.model_dir}"
            + (f" (spec {check_result.spec})" if check_result.spec else ""),
        )
        for f in check_result.files:
            table.add_row(f.file, str(f.tensors), str(f.indexed), f"{f.tensor_bytes:,}")
        console.print(table)
        for note in check_result.spec_notes:
            console.print(f"[dim]{note}[/dim]")
        console.print(result.message)

    payload = result.model_dump(mode="json") | {
        "message": result.message,
        "before": result.before.model_dump_report(),
        "after": result.after.model_dump_report(),
    }
    out.result(payload, render)
    if check and not result.before.ok:
        raise CheckFailed(f"the index of {model_dir} needs the repair: {result.message}",
                          hint=f"glm53 model install {model_dir}")


def register(app: typer.Typer) -> None:
    app.add_typer(
        model_app, name="model", help="Lock, download, verify and install (index repair) a checkpoint."
    )
