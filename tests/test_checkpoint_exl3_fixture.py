"""Ground truth: the headers of a real EXL3 conversion (tools/make-exl3-fixture.py, ExLlamaV3 1.4.6, H200).

A tiny random `Glm5NextForConditionalGeneration` (8 layers: KDA x3 + DSA, MoE from layer 3 with 16 experts, top-8,
the MTP block as layer 8) converted at 3.0 bpw. tests/fixtures/exl3/ keeps the converter's JSON files and the header
block of its one safetensors file; the file is rebuilt here as header + zero-filled (sparse) data of the real length.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from glm53.checkpoint.index_repair import check_index, install
from glm53.checkpoint.safetensors_header import DTYPE_SIZES, read_safetensors_header
from glm53.plan.inputs.model import read_checkpoint_facts
from tests.support.tiny_glm53 import TinySpec, exl3_linear

FIXTURE = Path(__file__).parent / "fixtures" / "exl3"
PREFIX = "model.language_model.layers"


def _header() -> dict:
    return json.loads((FIXTURE / "model.safetensors.header.json").read_bytes())


def _nbytes(entry: dict) -> int:
    return entry["data_offsets"][1] - entry["data_offsets"][0]


@pytest.fixture
def exl3_dir(tmp_path: Path) -> Path:
    """The converter's output directory, weights zero-filled (sparse), every size as the converter wrote it."""
    files = {f["name"]: f["size"] for f in json.loads((FIXTURE / "files.json").read_text())}
    for name in files:
        if name.endswith(".json"):
            shutil.copyfile(FIXTURE / name, tmp_path / name)
    raw = (FIXTURE / "model.safetensors.header.json").read_bytes()
    with (tmp_path / "model.safetensors").open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(files["model.safetensors"])
    assert (tmp_path / "model.safetensors").stat().st_size == files["model.safetensors"]
    return tmp_path


def test_converter_writes_one_file_and_no_index(exl3_dir: Path) -> None:
    names = {f["name"] for f in json.loads((FIXTURE / "files.json").read_text())}
    assert {n for n in names if n.endswith(".safetensors")} == {"model.safetensors"}
    assert "model.safetensors.index.json" not in names  # ExLlamaV3 writes an index only for more than one shard
    header = read_safetensors_header(exl3_dir / "model.safetensors")
    assert header.file_size == (exl3_dir / "model.safetensors").stat().st_size
    assert header.tensor_bytes == sum(_nbytes(v) for k, v in _header().items() if k != "__metadata__")


def test_mtp_and_kpool_stay_with_the_converted_layers() -> None:
    """The converter puts the MTP block (layer L = 8, at mtp_bits 4) and each DSA layer's kpool pair into the
    model shards; no `mtp.safetensors` / `kpool_aux.safetensors` (the published checkpoint's extra files)."""
    header = _header()
    config = json.loads((FIXTURE / "config.json").read_text())
    assert config["quantization_config"]["mtp_bits"] == 4
    mtp = [k for k in header if k.startswith(f"{PREFIX}.8.")]
    assert {f"{PREFIX}.8.{n}" for n in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight")} <= set(mtp)
    assert f"{PREFIX}.8.eh_proj.trellis" in header  # EXL3, not a bf16 weight
    assert header[f"{PREFIX}.8.mlp.experts.0.gate_proj.trellis"]["shape"][-1] == 16 * 4
    assert not [k for k in mtp if ".hc_" in k]  # the MTP block has no mHC
    for layer in (3, 7, 8):
        base = f"{PREFIX}.{layer}.self_attn.indexer.index_kpool_compress"
        assert header[f"{base}_ape"]["dtype"] == "F32"
        assert header[f"{base}_gate"]["dtype"] == "F16"


def test_install_leaves_the_converter_output_alone(exl3_dir: Path) -> None:
    check = check_index(exl3_dir)
    assert check.ok, check.summary
    result = install(exl3_dir)
    assert not result.changed
    assert not (exl3_dir / "model.safetensors.index.json").exists()


def test_install_leaves_a_complete_converter_index_alone(exl3_dir: Path) -> None:
    """Above one shard the converter writes {"metadata": {"total_size"}, "weight_map"} listing every tensor."""
    header = _header()
    index = {
        "metadata": {"total_size": sum(_nbytes(v) for k, v in header.items() if k != "__metadata__")},
        "weight_map": {k: "model.safetensors" for k in header if k != "__metadata__"},
    }
    path = exl3_dir / "model.safetensors.index.json"
    path.write_text(json.dumps(index, indent=4))
    before = path.read_bytes()
    result = install(exl3_dir)
    assert result.before.ok and not result.changed
    assert path.read_bytes() == before
    assert not (exl3_dir / "model.safetensors.index.shards-only.json").exists()


def expert_bytes(hidden: int, moe_intermediate: int, bits: int) -> int:
    """Bytes of one routed EXL3 expert (gate, up: hidden -> I; down: I -> hidden).

    Per projection (in -> out, `bits` bits): trellis int16 [in/16, out/16, 16*bits] = in*out*bits/8 B,
    suh fp16 [in] = 2*in, svh fp16 [out] = 2*out, mul1 int32 scalar = 4. For the three projections:
    3*H*I*bits/8 + 6*(H+I) + 12."""
    return 3 * hidden * moe_intermediate * bits // 8 + 6 * (hidden + moe_intermediate) + 12


def test_bytes_per_expert_formula_matches_the_real_headers() -> None:
    header = _header()
    config = json.loads((FIXTURE / "config.json").read_text())["text_config"]
    h, i = config["hidden_size"], config["moe_intermediate_size"]
    pattern = re.compile(rf"^{re.escape(PREFIX)}\.(\d+)\.mlp\.experts\.(\d+)\.")
    sums: dict[tuple[int, int], int] = {}
    for name, entry in header.items():
        match = pattern.match(name)
        if match:
            key = (int(match.group(1)), int(match.group(2)))
            sums[key] = sums.get(key, 0) + _nbytes(entry)
            assert _nbytes(entry) == DTYPE_SIZES[entry["dtype"]] * _prod(entry["shape"])
    trunk = {v for (layer, _), v in sums.items() if layer < 8}
    assert trunk == {expert_bytes(h, i, 3)} == {39_180}
    assert {v for (layer, _), v in sums.items() if layer == 8} == {expert_bytes(h, i, 4)}
    # The published checkpoint: hidden 4096, moe_intermediate 2048, experts at 3 bits.
    assert expert_bytes(4096, 2048, 3) == 9_474_060


def _prod(shape: list[int]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def test_planner_expert_bytes_equal_the_header_sum(exl3_dir: Path) -> None:
    facts = read_checkpoint_facts(exl3_dir)
    assert facts.n_routed_experts == 16 and facts.first_k_dense_replace == 3 and facts.num_hidden_layers == 8
    assert facts.expert_bytes == 39_180
    assert facts.mtp_bytes == sum(_nbytes(v) for k, v in _header().items() if k.startswith(f"{PREFIX}.8."))
    assert facts.checkpoint_bytes == (exl3_dir / "model.safetensors").stat().st_size


def test_planner_dsa_layers_from_the_real_config(exl3_dir: Path) -> None:
    assert read_checkpoint_facts(exl3_dir).dsa_layers == (3, 7)


def test_tiny_fixture_expert_tensors_follow_the_converter() -> None:
    """tests/support/tiny_glm53.py's EXL3 linear: same names, dtypes and shapes as the converter's."""
    header = _header()
    base = f"{PREFIX}.3.mlp.experts.0"
    real = {
        k.removeprefix(base + "."): (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k.startswith(base)
    }
    ours: dict[str, tuple[str, tuple[int, ...]]] = {}
    for proj, (i, o) in {"gate_proj": (256, 128), "up_proj": (256, 128), "down_proj": (128, 256)}.items():
        for k, t in exl3_linear(proj, i, o, 3).items():
            ours[k] = (t.dtype, t.shape)
    assert ours == real
    assert TinySpec().dsa_layers == [3, 7]
