"""`glm53 repro`: show the pins, check the repository, audit a build, the image or this host against the lock;
resolve the open source pins; record and compare host manifests."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from glm53.cli.app import App
from glm53.cli.options import (
    OUT_POLICY,
    ForceOpt,
    JsonOpt,
    ModelDirOpt,
    OptionalProfileOpt,
    ReproLockOpt,
    refuse_to_replace,
)
from glm53.errors import BadInput, CheckFailed
from glm53.fsutil import missing_directory
from glm53.host.facts import read_host_facts
from glm53.output import Output
from glm53.preflight.doctor import audit_host, limits_from_lock, read_container_facts
from glm53.preflight.engines import preflight_engine
from glm53.preflight.render import render_report
from glm53.recipe.pins import find_repro_lock, load_repro_lock, repro_lock_sha256
from glm53.recipe.profiles import load_profile
from glm53.repro import PinsInForce, audit_build, check_repo
from glm53.repro.engine_env import (
    InstallPlan,
    InstallRequest,
    check_request,
    check_target,
    environment_of,
    gpu_architectures,
    install_engine,
    install_steps,
    interpreter_facts,
    wheels_for,
)
from glm53.repro.image import compare_image_tarballs, stream_image_twice
from glm53.repro.manifest import build_manifest, diff_against_lock, diff_manifests, load_manifest, write_manifest
from glm53.repro.render import (
    render_build_audit,
    render_findings,
    render_image_audit,
    render_install,
    render_install_steps,
    render_manifest_diff,
    render_pins,
)
from glm53.repro.resolve import (
    ResolvePreview,
    describe_fetches,
    pending_image,
    pending_pins,
    plan_resolution,
    write_resolution,
)
from glm53.safetext import printable

repro_app = App(help="Audit the repository, builds and hosts against repro.lock.json.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(repro_app, name="repro")


@repro_app.command("show")
def show(lock_path: ReproLockOpt = None, json_out: JsonOpt = False) -> None:
    """Print the pins in force, the lock's sha256, and every field still unresolved with what fills it.

    Examples:
      glm53 repro show
      glm53 repro show --lock repro.lock.json --json
    """

    path = lock_path or find_repro_lock(Path.cwd())
    lock = load_repro_lock(path)
    sha256 = repro_lock_sha256(path)
    result = PinsInForce(
        path=str(path), sha256=sha256, lock=lock, unpinned=lock.unpinned(), unresolved=lock.unresolved()
    )
    Output(json_mode=json_out).result(result, lambda console: render_pins(lock, str(path), sha256, console))


@repro_app.command("check")
def check(
    root: Annotated[
        Path,
        typer.Argument(
            metavar="REPO", help="The repository to check (default: the current directory).", show_default=False
        ),
    ] = Path("."),
    release: Annotated[bool, typer.Option("--release", help="Also fail while any pin is unset.")] = False,
    lock_path: ReproLockOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the repository against the lock: flake.lock, Makefile, profiles, README, tracked files.

    Examples:
      glm53 repro check
      glm53 repro check ~/src/glm53 --release --json
    """

    lock = load_repro_lock(lock_path or (root / "repro.lock.json"))
    result = check_repo(root.resolve(), lock, release=release)
    Output(json_mode=json_out).result(
        result, lambda console: render_findings("repository vs lock", result.findings, console)
    )
    if not result.ok:
        raise CheckFailed("the repository disagrees with repro.lock.json", fix="see the fix column")


@repro_app.command("audit-build")
def audit_build_cmd(
    installable: Annotated[
        str,
        typer.Argument(
            metavar="INSTALLABLE", help="Flake output (.#glm53) or, with --file, an attribute.", show_default=False
        ),
    ] = "",
    file: Annotated[Path | None, typer.Option("--file", help="Build from this Nix file (nix build -f).")] = None,
    nix_arg: Annotated[list[str] | None, typer.Option("--nix-arg", help="Extra argument for nix build.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Build an output twice and compare bit for bit; exit 1 when the rebuild differs.

    Examples:
      glm53 repro audit-build .#glm53
      glm53 repro audit-build glm53 --file default.nix --json
    """

    extra = [*(["-f", str(file)] if file else []), *(nix_arg or [])]
    if not installable and file is None:
        raise BadInput("nothing to audit", fix="name a flake output (e.g. .#glm53) or pass --file FILE")
    result = audit_build(installable, extra_args=extra)
    Output(json_mode=json_out).result(result, lambda console: render_build_audit(result, console))
    if not result.reproducible:
        raise CheckFailed(
            f"{result.installable} is not bit-for-bit reproducible",
            fix="rebuild with --keep-failed and compare the outputs with diffoscope",
        )


@repro_app.command("audit-host")
def audit_host_cmd(
    profile: OptionalProfileOpt = None,
    lock_path: ReproLockOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Compare this host with the engine it will run and the hardware the recipe was validated on.

    The engine is the profile's: vLLM (the vendor image: CUDA 13, driver 580+, a container runtime and the
    GPUs as CDI devices) or exllamav3 (nixpkgs' CUDA 12.8, driver 570+). The GPU count, model and system
    memory are the lock's validated hardware; the checks are the same as `glm53 doctor`'s.

    Examples:
      glm53 repro audit-host
      glm53 repro audit-host --profile exl3-2x3090 --json
    """

    lock = load_repro_lock(lock_path)
    engine = load_profile(profile or lock.runtime.default_profile, environ={}).engine
    limits = limits_from_lock(lock, engine)
    containers = read_container_facts() if preflight_engine(engine).runs_in_container else None
    report = audit_host(read_host_facts(engine_libraries=None), limits, containers)
    title = f"host vs lock — the {engine} engine"
    Output(json_mode=json_out).result(report, lambda console: render_report(console, report, title))
    if not report.ok:
        names = ", ".join(c.name for c in report.failures)
        raise CheckFailed(
            f"this host differs from what the {engine} engine needs or was validated on: {names}",
            fix="see the fix column",
        )


@repro_app.command("resolve")
def resolve_cmd(
    lock_path: ReproLockOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Write without asking.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be fetched; fetch nothing.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds each git fetch may take.")] = 900.0,
    update: Annotated[
        list[str] | None,
        typer.Option("--update", help="Move this pin to its upstream's newest commit (tabbyapi).", metavar="PIN"),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Fill the lock's open source pins: the full commit of each short one and its Nix hash (NAR sha256).

    TabbyAPI (engine.tabbyapi) gets the hash of its commit; when its commit is null, or with
    `--update tabbyapi`, the newest commit of its upstream's default branch, its hash and date.
    The vendor image (engine.vllm.image) gets its Nix hash: the flake next to the lock pulls it once by its
    digest (`nix build DIR#image.probe`) and the hash Nix reports is written.
    Asks the upstream git server (a network fetch); shows the diff, then asks before writing (or --yes).
    Exit 3 when a server or the registry cannot be reached: nothing is written.

    Examples:
      glm53 repro resolve --dry-run
      glm53 repro resolve --update tabbyapi --yes
    """

    path = lock_path or find_repro_lock(Path.cwd())
    if path is None:
        raise BadInput("repro.lock.json not found", fix="pass --lock FILE")
    updates = tuple(update or ())
    lock = load_repro_lock(path)
    pending = pending_pins(lock, update=updates)
    image = pending_image(lock, path)
    out = Output(json_mode=json_out)
    if dry_run or not (pending or image):
        out.result(
            ResolvePreview(lock=str(path), would_fetch=pending, would_pull=image),
            lambda console: console.print(
                ("would fetch: " + describe_fetches(pending, image))
                if pending or image
                else "every source pin is resolved"
            ),
        )
        return
    result, old, new = plan_resolution(path, timeout=timeout, update=updates)
    if not json_out:
        typer.echo(printable(result.diff), nl=False)  # the lock's own text: shown, never acted on
    if not yes:
        if json_out or not sys.stdin.isatty():
            raise BadInput("not written: confirm with --yes", fix="review the diff, then run again with --yes")
        if not typer.confirm(f"write {path}?", default=False):
            raise CheckFailed("not written", fix="run again and answer yes, or pass --yes")
    write_resolution(path, old, new)
    result.written = True
    out.result(result, lambda console: console.print(f"[green]wrote[/green] {path}"))


@repro_app.command("audit-image")
def audit_image_cmd(
    installable: Annotated[
        str,
        typer.Argument(
            metavar="INSTALLABLE", help="The streamed image output to build and stream twice (.#image is a tarball)."
        ),
    ] = ".#image-exl3",
    tarball: Annotated[
        list[Path] | None, typer.Option("--tarball", help="Compare these two image tarballs instead (twice).")
    ] = None,
    keep: Annotated[Path | None, typer.Option("--keep", help="Stream the two tarballs into this directory.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Stream the image twice (or take two tarballs): same sha256, same layers; exit 1 naming the first difference.

    Examples:
      glm53 repro audit-image
      glm53 repro audit-image --tarball a.tar --tarball b.tar --json
    """

    if tarball:
        if len(tarball) != 2:
            raise BadInput("--tarball takes exactly two files", fix="--tarball A.tar --tarball B.tar")
        result = compare_image_tarballs(tarball[0], tarball[1])
    else:
        if keep is not None and (problem := missing_directory(keep)) is not None:
            raise BadInput(f"--keep: {keep} {problem}", fix="create the directory first, or leave --keep out")
        with tempfile.TemporaryDirectory(prefix="glm53-image-", dir=keep) as tmp:
            where = keep if keep is not None else Path(tmp)
            a, b = stream_image_twice(installable, where)
            result = compare_image_tarballs(a, b)
            if keep is not None:
                for name in ("image-a.tar", "image-b.tar"):
                    (Path(tmp) / name).unlink(missing_ok=True)
    Output(json_mode=json_out).result(result, lambda console: render_image_audit(result, console))
    if not result.identical:
        raise CheckFailed("the two image tarballs differ: " + result.detail, fix=result.suggestion)


@repro_app.command("manifest")
def manifest_cmd(
    output: Annotated[Path, typer.Option("--out", help="Write the manifest here." + OUT_POLICY)] = Path(
        "host-manifest.json"
    ),
    model_dir: ModelDirOpt = None,
    profile: OptionalProfileOpt = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Do not verify the checkpoint.")] = False,
    force: ForceOpt = False,
    lock_path: ReproLockOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Record what this host runs: GPUs, driver, CUDA, kernel, CPU, memory, packages, locks, profile, plan.

    With --model-dir, the checkpoint's lock hash and verify status; with --profile, that profile's values.

    Examples:
      glm53 repro manifest --out host-manifest.json
      glm53 repro manifest --out gpu-host.json --model-dir /srv/models/glm53 --profile agent-256k
    """

    refuse_to_replace([output], force=force)
    manifest = build_manifest(lock_path=lock_path, model_dir=model_dir, profile=profile, verify=not no_verify)
    write_manifest(manifest, output, force=force)
    Output(json_mode=json_out).result(manifest, lambda console: console.print(f"[green]wrote[/green] {output}"))


@repro_app.command("diff")
def diff_cmd(
    a: Annotated[Path, typer.Argument(metavar="A", help="A host manifest.", show_default=False)],
    b: Annotated[
        Path | None, typer.Argument(metavar="B", help="Another host manifest (or --lock).", show_default=False)
    ] = None,
    lock: Annotated[
        Path | None, typer.Option("--lock", help="Compare manifest A with this repro.lock.json instead.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Explain how two host manifests (or a manifest and the lock) differ; exit 1 when a pinned fact differs.

    Examples:
      glm53 repro diff host-a.json host-b.json
      glm53 repro diff host-manifest.json --lock repro.lock.json --json
    """

    first = load_manifest(a)
    if (b is None) == (lock is None):
        raise BadInput("compare with one thing", fix="glm53 repro diff A.json B.json, or A.json --lock LOCK")
    if b is not None:
        result = diff_manifests(first, load_manifest(b), a_name=str(a), b_name=str(b))
    else:
        assert lock is not None
        result = diff_against_lock(first, lock, m_name=str(a))
    Output(json_mode=json_out).result(result, lambda console: render_manifest_diff(result, console))
    if result.pinned_differ:
        names = ", ".join(d.fact for d in result.differences if d.group == "pinned")
        raise CheckFailed(f"pinned facts differ: {names}", fix="see the table; the pinned group decides")


@repro_app.command("install-engine")
def install_engine_cmd(
    target: Annotated[Path, typer.Argument(metavar="DIR", help="A new directory for the engine.", show_default=False)],
    python: Annotated[
        str,
        typer.Option("--python", help="The base interpreter: CPython 3.11 or 3.12 whose torch has CUDA."),
    ] = "python3",
    cuda_arch: Annotated[
        list[str] | None,
        typer.Option("--cuda-arch", help="A compute capability to build for (repeat); default: this host's GPUs."),
    ] = None,
    wheels: Annotated[
        Path | None,
        typer.Option("--wheels", help="Install from the wheels in this folder only (offline); default: PyPI."),
    ] = None,
    tabbyapi: Annotated[
        Path | None,
        typer.Option("--tabbyapi", help="Copy TabbyAPI from this tree (at the lock's commit) instead of cloning it."),
    ] = None,
    max_jobs: Annotated[int | None, typer.Option("--max-jobs", help="Parallel compiles (MAX_JOBS).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the steps; install nothing.")] = False,
    lock_path: ReproLockOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Install the second engine (TabbyAPI + ExLlamaV3) at the lock's pins without Nix, then say what to run.

    A venv over --python (for its torch with CUDA), every wheel of engine.tabbyapi.environment for its ABI by
    sha256, TabbyAPI at engine.tabbyapi.rev, and ExLlamaV3's extension and glm53's expert cache built ahead
    for the GPUs (never compiled at serve time). DIR appears only when every step passed.

    Examples:
      glm53 repro install-engine ~/glm53-engine
      glm53 repro install-engine ~/glm53-engine --python /opt/torch/bin/python --cuda-arch 8.6
      glm53 repro install-engine DIR --wheels ./wheels --tabbyapi ./tabbyAPI --dry-run
    """

    lock = load_repro_lock(lock_path or find_repro_lock(Path.cwd()))
    out = Output(json_mode=json_out)
    target = target.expanduser().absolute()
    if not dry_run:
        check_target(target)  # bad usage before anything about this host is read
    facts = interpreter_facts(python)
    request = InstallRequest(
        target=target,
        python=facts.python,
        cuda_arch=cuda_arch or ([] if dry_run else gpu_architectures()),
        wheels=wheels,
        tabbyapi=tabbyapi,
        max_jobs=max_jobs,
    )
    if dry_run:
        check_request(request)
        environment = environment_of(lock)
        wheels_for(environment, facts)
        plan = InstallPlan(base=facts, steps=install_steps(request, facts, lock))
        out.result(plan, lambda console: render_install_steps(plan, console))
        return
    result = install_engine(request, facts, lock, out.info)
    out.result(result, lambda console: render_install(result, console))
