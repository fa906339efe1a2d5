"""What is specific to one checkpoint family, kept as data: which aux files the stock index leaves out and
what they must hold. The index repair and its check read these files; nothing here is GLM-specific code.

A spec applies to a checkpoint whose `config.json` has the spec's `model_type` and quantization method. Its
rules scale with the checkpoint's own config (layer count), so a tiny test checkpoint with the same layout is
checked by the same rules; the published totals apply only at full scale.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import parse_json, read_json

_SPEC_PACKAGE = "glm53"
_SPEC_FOLDER = "data/model-specs"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecMatch(_Strict):
    model_type: str
    quant_method: str

    def fits(self, config: CheckpointConfig) -> bool:
        """The checkpoint is of this family: its model_type and quantization method."""
        return (config.model_type, config.quant_method) == (self.model_type, self.quant_method)


class LayerPattern(_Strict):
    start: int
    interval: int

    def layers(self, num_layers: int) -> list[int]:
        return list(range(self.start, num_layers, self.interval))


class KpoolRule(_Strict):
    file: str
    dtype: str
    tensors: list[str]

    def names(self, prefix: str, layers: list[int]) -> list[str]:
        return [t.format(prefix=prefix, layer=layer) for layer in layers for t in self.tensors]


class MtpRule(_Strict):
    file: str


class FullScale(_Strict):
    num_hidden_layers: int
    dsa_layers: list[int]
    mtp_layer: int
    kpool_tensors: int
    kpool_tensor_bytes: int


class PublishedBuild(_Strict):
    repo: str
    branch: str
    revision: str
    shards: int
    safetensors_files: int
    checkpoint_bytes: int
    stock_index_tensors: int
    mtp_tensors: int
    mtp_file_bytes: int


class ModelSpec(_Strict):
    name: str
    description: str
    match: SpecMatch
    tensor_prefix: str
    dsa_layers: LayerPattern
    kpool: KpoolRule
    mtp: MtpRule
    full_scale: FullScale
    published_builds: list[PublishedBuild]

    def aux_files(self) -> tuple[str, str]:
        return (self.kpool.file, self.mtp.file)


class CheckpointConfig(BaseModel):
    """The few config.json facts the spec rules need, read from `text_config` when the model is multimodal."""

    model_type: str | None
    quant_method: str | None
    num_hidden_layers: int | None
    layer_types: list[str] | None = None
    hidden_size: int | None = None
    index_head_dim: int | None = None
    index_kpool: int | None = None


def available_specs() -> list[str]:
    folder = resources.files(_SPEC_PACKAGE).joinpath(_SPEC_FOLDER)
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_model_spec(name: str) -> ModelSpec:
    if name not in available_specs():
        raise BadInput(f"unknown model spec {name!r}", fix=f"known specs: {', '.join(available_specs())}")
    text = resources.files(_SPEC_PACKAGE).joinpath(_SPEC_FOLDER).joinpath(f"{name}.json").read_text("utf-8")
    raw = parse_json(text, what=f"model spec {name}", fix="reinstall glm53: its packaged data is damaged")
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, f"model spec {name}", fix="reinstall glm53") from exc


def read_checkpoint_config(model_dir: Path) -> CheckpointConfig | None:
    """Read DIR/config.json; None when there is none. A malformed one is bad input."""
    path = Path(model_dir) / "config.json"
    if not path.exists():
        return None
    raw = read_json(path, what="model config")
    if not isinstance(raw, dict):
        raise BadInput(f"model config {path} is not a JSON object")
    text: Any = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    quant = raw.get("quantization_config") or text.get("quantization_config") or {}
    try:
        return CheckpointConfig(
            model_type=raw.get("model_type"),
            quant_method=quant.get("quant_method") if isinstance(quant, dict) else None,
            num_hidden_layers=text.get("num_hidden_layers"),
            layer_types=text.get("layer_types"),
            hidden_size=text.get("hidden_size"),
            index_head_dim=text.get("index_head_dim"),
            index_kpool=text.get("index_kpool"),
        )
    except ValidationError as exc:
        raise invalid_document(exc, f"model config {path}") from exc


def detect_model_spec(config: CheckpointConfig | None) -> ModelSpec | None:
    """The spec whose match rule fits this config, or None for a checkpoint no spec describes."""
    if config is None:
        return None
    for name in available_specs():
        spec = load_model_spec(name)
        if spec.match.fits(config):
            return spec
    return None


__all__ = [
    "CheckpointConfig",
    "ModelSpec",
    "PublishedBuild",
    "available_specs",
    "detect_model_spec",
    "load_model_spec",
    "read_checkpoint_config",
]
