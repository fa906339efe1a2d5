"""`glm53 model`: lock, download, verify and install (index repair) a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.checkpoint.hub import download_checkpoint
from glm53.checkpoint.hub_api import lock_from_hub
from glm53.checkpoint.index_repair import install
from glm53.checkpoint.lock import WrittenLock, default_lock_path, lock_from_directory, write_lock
from glm53.checkpoint.render import install_json, render_download, render_install, render_lock, render_verify
from glm53.checkpoint.verify import verify_checkpoint
from glm53.cli.app import App
from glm53.cli.options import (
    OUT_POLICY,
    CheckpointLockOpt,
    ForceOpt,
    JobsOpt,
    JsonOpt,
    ModelDirOpt,
    NoCacheOpt,
    RequiredModelDirOpt,
    refuse_to_replace,
)
from glm53.errors import BadInput, CheckFailed
from glm53.output import Output

model_app = App(no_args_is_help=True, help="Lock, download, verify and install a checkpoint.")


@model_app.command("lock")
def lock_cmd(
    repo: Annotated[
        str | None,
        typer.Argument(
            metavar="REPO",
            help="Hub repository, e.g. turboderp/GLM-5.3-Flash-exl3: without --model-dir, locked from the Hub's "
            "file metadata (no weights downloaded); with it, recorded in the local lock.",
            show_default=False,
        ),
    ] = None,
    model_dir: ModelDirOpt = None,
    revision: Annotated[
        str | None,
        typer.Option("--revision", help="Full 40-hex commit: required from the Hub, recorded in a local lock."),
    ] = None,
    out_path: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Lock file to write (default: MODEL_DIR/checkpoint.lock.json, or ./checkpoint.lock.json from the "
            "Hub)." + OUT_POLICY,
        ),
    ] = None,
    jobs: JobsOpt = None,
    no_cache: NoCacheOpt = False,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a checkpoint lock: path, size, sha256 of every file (+ tensor count and header sha256).

    A local copy (--model-dir) is hashed; a Hub repository without --model-dir is locked from the Hub's file
    metadata, without downloading weights.

    Examples:
      glm53 model lock turboderp/GLM-5.3-Flash-exl3 --model-dir /srv/models/glm53 --revision REV
      glm53 model lock turboderp/GLM-5.3-Flash-exl3 --revision REV --out glm53.lock.json
    """

    out = Output(json_mode=json_out)
    if model_dir is None:
        if repo is None:
            raise BadInput(
                "nothing to lock", fix="pass --model-dir DIR (the checkpoint), or a Hub repository REPO --revision REV"
            )
        if revision is None:
            raise BadInput(f"locking {repo} from the Hub needs --revision (a full 40-hex commit)")
        target = out_path or Path("checkpoint.lock.json")
        _refuse_existing(target, force)
        lock = lock_from_hub(repo, revision)
    else:
        target = out_path or default_lock_path(model_dir)
        _refuse_existing(target, force)
        with out.progress("hashing", in_bytes=True) as progress:
            lock = lock_from_directory(
                model_dir, repo=repo, revision=revision, jobs=jobs, use_cache=not no_cache, progress=progress
            )
    write_lock(lock, target, force=force)
    written = WrittenLock(**dict(lock), lock=str(target))
    out.result(written, lambda c: render_lock(lock, target, c))


def _refuse_existing(target: Path, force: bool) -> None:
    if target.is_dir():
        raise BadInput(f"--out {target} is a directory", fix="pass the lock file's path")
    refuse_to_replace([target], force=force)


@model_app.command("download")
def download_cmd(
    repo: Annotated[
        str,
        typer.Argument(metavar="REPO", help="Hub repository, e.g. turboderp/GLM-5.3-Flash-exl3.", show_default=False),
    ],
    revision: Annotated[str, typer.Option("--revision", help="Full 40-hex commit to download.", show_default=False)],
    model_dir: RequiredModelDirOpt,
    lock_path: CheckpointLockOpt = None,
    jobs: JobsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Download the checkpoint at a pinned revision, then verify every file against the lock.

    Resumable across runs: an interrupted file continues from the bytes already on disk.

    Examples:
      glm53 model download turboderp/GLM-5.3-Flash-exl3 --revision REV --model-dir /srv/models/glm53
      glm53 model download REPO --revision REV --model-dir DIR --checkpoint-lock glm53.lock.json
    """

    out = Output(json_mode=json_out)
    try:
        with out.progress("downloading", in_bytes=True) as progress:
            result = download_checkpoint(
                repo,
                revision,
                model_dir,
                lock_path=lock_path,
                jobs=jobs,
                progress=progress,
                verify_progress=progress.stage("verifying"),
            )
    except KeyboardInterrupt:
        out.warn("interrupted: the bytes downloaded so far are kept; run the same command again to continue")
        raise typer.Exit(130) from None
    out.result(result, lambda console: render_download(result, console))


@model_app.command("verify")
def verify_cmd(
    model_dir: RequiredModelDirOpt,
    lock_path: CheckpointLockOpt = None,
    jobs: JobsOpt = None,
    no_cache: NoCacheOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Check the size and sha256 of every locked file, and look for extra files.

    Exit 0 all good, 1 a mismatch, 2 bad input.

    Examples:
      glm53 model verify --model-dir /srv/models/glm53
      glm53 model verify --model-dir DIR --checkpoint-lock glm53.lock.json --no-cache --json
    """

    out = Output(json_mode=json_out)
    with out.progress("verifying", in_bytes=True) as progress:
        report = verify_checkpoint(model_dir, lock_path, jobs=jobs, use_cache=not no_cache, progress=progress)
    out.result(report, lambda console: render_verify(report, console))
    if not report.ok:
        raise CheckFailed(
            f"{model_dir} does not match its lock: {report.summary}",
            fix="download the listed files again (glm53 model download), or re-lock deliberately",
        )


@model_app.command("install")
def install_cmd(
    model_dir: RequiredModelDirOpt,
    check: Annotated[bool, typer.Option("--check", help="Only check the index; write nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Repair model.safetensors.index.json so it lists every tensor (kpool_aux, mtp); keeps the original.

    A second run changes nothing. --check exits 1 when the index is incomplete or inconsistent.

    Examples:
      glm53 model install --model-dir /srv/models/glm53
      glm53 model install --model-dir /srv/models/glm53 --check --json
    """

    out = Output(json_mode=json_out)
    result = install(model_dir, check_only=check)
    out.result(install_json(result), lambda console: render_install(result, console))
    if check and not result.before.ok:
        raise CheckFailed(
            f"the index of {model_dir} needs the repair: {result.message}",
            fix=f"glm53 model install --model-dir {model_dir}",
        )


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model", help="Lock, download, verify and install (index repair) a checkpoint.")
