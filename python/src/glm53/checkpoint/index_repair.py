"""The index repair: make `model.safetensors.index.json` list every tensor of every safetensors file.

Upstream GLM-5.3-Flash EXL3 indexes only its 15 shards, leaving out `kpool_aux.safetensors` (the 22 kpool
tensors of the 11 DSA layers) and `mtp.safetensors` (the MTP layer). Loaders glob `*.safetensors`, so every
file in the directory counts. The repair reads each header with the strict parser, adds the tensors the index
lacks, refuses a name found in two files, recomputes `metadata.total_size` (the sum of the indexed tensors'
bytes), keeps the original as `model.safetensors.index.shards-only.json` and writes atomically. A second run
finds nothing to do. When a model spec describes the checkpoint, its aux files are checked against it first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, Field

from glm53.checkpoint.lock import INDEX_BACKUP_NAME, INDEX_NAME
from glm53.checkpoint.model_spec import CheckpointConfig, ModelSpec, detect_model_spec, read_checkpoint_config
from glm53.checkpoint.safetensors_header import SafetensorsHeader, read_safetensors_header
from glm53.errors import BadInput, CheckFailed
from glm53.fsutil import atomic_write_bytes, atomic_write_json, read_json, resolve_inside, safe_relative_path

SAMPLE = 5  # names shown per problem in reports
# config.json layer_types naming a DSA layer: ours ("dsa"), transformers' and ExLlamaV3's ("deepseek_sparse_attention",
# which transformers also maps "full_attention" to).
_DSA_LAYER_TYPES = ("dsa", "deepseek_sparse_attention", "full_attention")


class DanglingEntry(BaseModel):
    tensor: str
    file: str
    reason: str


class DuplicateTensor(BaseModel):
    tensor: str
    files: list[str]


class FileCoverage(BaseModel):
    file: str
    tensors: int
    indexed: int
    tensor_bytes: int


class IndexCheck(BaseModel):
    model_dir: str
    index: str
    spec: str | None
    files: list[FileCoverage]
    indexed_tensors: int
    unindexed: dict[str, list[str]] = Field(description="file -> tensors in its header the index lacks")
    dangling: list[DanglingEntry]
    duplicates: list[DuplicateTensor]
    total_size_recorded: int | None
    total_size_expected: int
    spec_problems: list[str]
    spec_notes: list[str]

    @property
    def unindexed_count(self) -> int:
        return sum(len(v) for v in self.unindexed.values())

    @property
    def repairable(self) -> bool:
        """True when the only defects are the ones the repair fixes (missing entries, stale total)."""
        return not (self.dangling or self.duplicates or self.spec_problems)

    @property
    def ok(self) -> bool:
        return self.repairable and not self.unindexed and self.total_size_recorded == self.total_size_expected

    @property
    def summary(self) -> str:
        if self.ok:
            return f"index complete: {self.indexed_tensors} tensors in {len(self.files)} files"
        parts = []
        if self.unindexed:
            per_file = ", ".join(f"{f} ({len(n)})" for f, n in sorted(self.unindexed.items()))
            parts.append(f"{self.unindexed_count} tensors not in the index: {per_file}")
        if self.dangling:
            parts.append(
                f"{len(self.dangling)} index entries point at missing tensors or files, e.g. "
                + "; ".join(f"{d.tensor} -> {d.file} ({d.reason})" for d in self.dangling[:SAMPLE])
            )
        if self.duplicates:
            parts.append(
                f"{len(self.duplicates)} tensors are in more than one file, e.g. "
                + "; ".join(f"{d.tensor} in {', '.join(d.files)}" for d in self.duplicates[:SAMPLE])
            )
        if self.total_size_recorded != self.total_size_expected:
            parts.append(
                f"metadata.total_size is {self.total_size_recorded}, "
                f"the indexed tensors hold {self.total_size_expected} bytes"
            )
        parts.extend(f"{self.spec}: {p}" for p in self.spec_problems)
        return "; ".join(parts)

    def model_dump_report(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data |= {"ok": self.ok, "repairable": self.repairable, "summary": self.summary}
        return data


class InstallResult(BaseModel):
    model_dir: str
    changed: bool
    check_only: bool
    added: dict[str, int]
    backup: str | None
    total_size_before: int | None
    total_size_after: int
    before: IndexCheck
    after: IndexCheck

    @property
    def message(self) -> str:
        if self.check_only:
            return self.before.summary if self.before.ok else f"index needs repair: {self.before.summary}"
        if not self.changed:
            return f"nothing to change: {self.after.summary}"
        added = ", ".join(f"{n} from {f}" for f, n in sorted(self.added.items()))
        return f"index repaired: added {added}; original kept as {self.backup}"


def _load_index(model_dir: Path) -> tuple[Path, dict[str, Any], dict[str, str]]:
    path = resolve_inside(model_dir, PurePosixPath(INDEX_NAME), what="model directory")
    raw = read_json(path, what="safetensors index")
    if not isinstance(raw, dict) or not isinstance(raw.get("weight_map"), dict):
        raise BadInput(
            f"safetensors index {path}: `weight_map` must be an object of tensor -> file",
            fix="restore the original index (or its .shards-only.json backup)",
        )
    metadata = raw.get("metadata", {})
    if not isinstance(metadata, dict):
        raise BadInput(f"safetensors index {path}: `metadata` must be an object")
    total = metadata.get("total_size")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 0):
        raise BadInput(f"safetensors index {path}: metadata.total_size must be a non-negative integer")
    weight_map: dict[str, str] = {}
    for tensor, file in raw["weight_map"].items():
        if not isinstance(file, str):
            raise BadInput(f"safetensors index {path}: weight_map[{tensor!r}] must be a file name")
        safe_relative_path(file, what=f"safetensors index {path}, weight_map[{tensor!r}]")
        weight_map[tensor] = file
    return path, raw, weight_map


def _single_file(model_dir: Path) -> bool:
    return not (model_dir / INDEX_NAME).exists() and [p.name for p in model_dir.glob("*.safetensors")] == [SINGLE_FILE]


def _read_headers(model_dir: Path, weight_map: dict[str, str]) -> tuple[dict[str, SafetensorsHeader], set[str]]:
    """Headers of every top-level *.safetensors (what loaders glob) and of every file the index names."""
    names = {p.name for p in model_dir.glob("*.safetensors")} | set(weight_map.values())
    headers: dict[str, SafetensorsHeader] = {}
    missing: set[str] = set()
    for name in sorted(names):
        path = resolve_inside(model_dir, PurePosixPath(name), what="model directory")
        if not path.is_file():
            missing.add(name)
            continue
        headers[name] = read_safetensors_header(path)
    return headers, missing


SINGLE_FILE = "model.safetensors"


def check_index(model_dir: Path) -> IndexCheck:
    """Compare the index with the safetensors headers; no file is written.

    A checkpoint of one `model.safetensors` and no index needs none: it is checked as if indexed.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise BadInput(f"model directory not found: {model_dir}")
    if _single_file(model_dir):
        header = read_safetensors_header(model_dir / SINGLE_FILE)
        weight_map = dict.fromkeys(header.tensors, SINGLE_FILE)
        raw: dict[str, Any] = {"metadata": {"total_size": header.tensor_bytes}, "weight_map": weight_map}
        index_path = model_dir / SINGLE_FILE
    else:
        index_path, raw, weight_map = _load_index(model_dir)
    headers, missing = _read_headers(model_dir, weight_map)
    config = read_checkpoint_config(model_dir)
    return _compare(model_dir, index_path, raw, weight_map, headers, missing, config, detect_model_spec(config))


def _compare(
    model_dir: Path,
    index_path: Path,
    raw: dict[str, Any],
    weight_map: dict[str, str],
    headers: dict[str, SafetensorsHeader],
    missing: set[str],
    config: CheckpointConfig | None,
    spec: ModelSpec | None,
) -> IndexCheck:
    owners: dict[str, list[str]] = {}
    for file, header in headers.items():
        for tensor in header.tensors:
            owners.setdefault(tensor, []).append(file)
    duplicates = [DuplicateTensor(tensor=t, files=f) for t, f in sorted(owners.items()) if len(f) > 1]

    dangling = []
    for tensor, file in weight_map.items():
        if file in missing:
            dangling.append(DanglingEntry(tensor=tensor, file=file, reason="file missing"))
        elif tensor not in headers[file].tensors:
            dangling.append(DanglingEntry(tensor=tensor, file=file, reason="not in that file's header"))

    unindexed: dict[str, list[str]] = {}
    for file, header in headers.items():
        lacking = sorted(t for t in header.tensors if t not in weight_map)
        if lacking:
            unindexed[file] = lacking

    expected_total = sum(
        headers[file].tensors[tensor].nbytes
        for tensor, file in weight_map.items()
        if file in headers and tensor in headers[file].tensors
    ) + sum(headers[f].tensors[t].nbytes for f, names in unindexed.items() for t in names if len(owners[t]) == 1)

    files = [
        FileCoverage(
            file=f,
            tensors=len(h.tensors),
            indexed=sum(1 for t in h.tensors if weight_map.get(t) == f),
            tensor_bytes=h.tensor_bytes,
        )
        for f, h in sorted(headers.items())
    ]
    problems, notes = _spec_findings(spec, config, headers, weight_map) if spec else ([], [])
    return IndexCheck(
        model_dir=str(model_dir),
        index=str(index_path),
        spec=spec.name if spec else None,
        files=files,
        indexed_tensors=len(weight_map),
        unindexed=unindexed,
        dangling=dangling,
        duplicates=duplicates,
        total_size_recorded=raw.get("metadata", {}).get("total_size"),
        total_size_expected=expected_total,
        spec_problems=problems,
        spec_notes=notes,
    )


def _spec_findings(
    spec: ModelSpec,
    config: CheckpointConfig | None,
    headers: dict[str, SafetensorsHeader],
    weight_map: dict[str, str],
) -> tuple[list[str], list[str]]:
    """Problems (refuse to install) and notes (informational) from the model spec's rules."""
    problems: list[str] = []
    notes: list[str] = []
    layers = config.num_hidden_layers if config and config.num_hidden_layers else spec.full_scale.num_hidden_layers
    dsa = spec.dsa_layers.layers(layers)
    if config and config.layer_types is not None:
        declared = [n for n, kind in enumerate(config.layer_types) if kind in _DSA_LAYER_TYPES]
        if declared != dsa:
            problems.append(f"config.json layer_types put DSA layers at {declared}, the spec expects {dsa}")
    prefix = spec.tensor_prefix
    shards = set(weight_map.values()) - set(spec.aux_files())

    kpool = headers.get(spec.kpool.file)
    expected_kpool = spec.kpool.names(prefix, dsa)
    in_shards = {t for f, h in headers.items() if f in shards for t in h.tensors}
    if kpool is None and expected_kpool and all(t in in_shards for t in expected_kpool):
        # ExLlamaV3's converter writes each DSA layer's kpool pair into the shards with the layer.
        notes.append(
            f"the {len(expected_kpool)} kpool tensors are in the shards (as ExLlamaV3's converter writes them)"
        )
    elif kpool is None:
        problems.append(f"{spec.kpool.file} is missing: it holds the {len(expected_kpool)} kpool tensors")
    else:
        found = set(kpool.tensors)
        lacking = [t for t in expected_kpool if t not in found]
        surplus = sorted(found - set(expected_kpool))
        if lacking:
            problems.append(f"{spec.kpool.file} lacks {len(lacking)} kpool tensors, e.g. {lacking[:SAMPLE]}")
        if surplus:
            problems.append(
                f"{spec.kpool.file} holds {len(surplus)} tensors the spec does not expect, e.g. {surplus[:SAMPLE]}"
            )
        wrong_dtype = sorted(t for t, e in kpool.tensors.items() if e.dtype != spec.kpool.dtype)
        if wrong_dtype:
            problems.append(f"{spec.kpool.file}: {wrong_dtype[:SAMPLE]} are not {spec.kpool.dtype}")
        if config and config.index_head_dim and config.hidden_size and config.index_kpool:
            shapes = {
                "gate": (config.index_head_dim, config.hidden_size),
                "ape": (config.index_kpool, config.index_head_dim),
            }
            for name, entry in kpool.tensors.items():
                want = shapes.get(name.rsplit("_", 1)[-1])
                if want is not None and entry.shape != want:
                    problems.append(
                        f"{spec.kpool.file}: {name} has shape {list(entry.shape)}, config.json implies {list(want)}"
                    )
        notes.append(
            f"{spec.kpool.file}: {len(kpool.tensors)} tensors, {kpool.tensor_bytes:,} bytes over DSA layers {dsa}"
        )

    mtp = headers.get(spec.mtp.file)
    mtp_prefix = f"{prefix}.layers.{layers}."
    mtp_in_shards = sorted(t for t in in_shards if t.startswith(mtp_prefix))
    if mtp is None and mtp_in_shards:
        # ExLlamaV3's converter writes the MTP block into the shards as layer L.
        notes.append(
            f"MTP layer {layers}: {len(mtp_in_shards)} tensors in the shards (as ExLlamaV3's converter writes it)"
        )
    elif mtp is None:
        problems.append(f"{spec.mtp.file} is missing: it holds the MTP layer {layers}")
    else:
        foreign = sorted(t for t in mtp.tensors if not t.startswith(mtp_prefix))
        if foreign:
            problems.append(
                f"{spec.mtp.file} holds {len(foreign)} tensors outside MTP layer {layers}, e.g. {foreign[:SAMPLE]}"
            )
        notes.append(f"{spec.mtp.file}: {len(mtp.tensors)} tensors of layer {layers}, {mtp.file_size:,} bytes")

    stray = sorted(set(headers) - shards - set(spec.aux_files()))
    if stray:
        problems.append(
            f"unexpected safetensors files {stray}: loaders glob *.safetensors and would load them; "
            "move them out of the model directory"
        )

    if layers == spec.full_scale.num_hidden_layers:
        full = spec.full_scale
        if dsa != full.dsa_layers:
            problems.append(f"DSA layers {dsa} differ from the published {full.dsa_layers}")
        if kpool is not None and (len(kpool.tensors), kpool.tensor_bytes) != (
            full.kpool_tensors,
            full.kpool_tensor_bytes,
        ):
            problems.append(
                f"{spec.kpool.file}: {len(kpool.tensors)} tensors / {kpool.tensor_bytes:,} bytes, "
                f"published {full.kpool_tensors} / {full.kpool_tensor_bytes:,}"
            )
        total_bytes = sum(h.file_size for h in headers.values())
        stock_tensors = sum(1 for f in weight_map.values() if f in shards)
        for build in spec.published_builds:
            facts = (len(headers), total_bytes, stock_tensors, len(mtp.tensors) if mtp else -1)
            published = (
                build.safetensors_files,
                build.checkpoint_bytes,
                build.stock_index_tensors,
                build.mtp_tensors,
            )
            verdict = "matches" if facts == published else "differs from"
            notes.append(
                f"{len(headers)} safetensors files, {total_bytes:,} bytes, {stock_tensors} shard "
                f"tensors indexed: {verdict} the published {build.branch} build "
                f"({build.safetensors_files} files, {build.checkpoint_bytes:,} bytes, "
                f"{build.stock_index_tensors} shard tensors)"
            )
    else:
        notes.append(
            f"{layers} layers (published: {spec.full_scale.num_hidden_layers}): "
            "published totals do not apply at this scale"
        )
    return problems, notes


def _unchanged(model_dir: Path, check: IndexCheck, check_only: bool) -> InstallResult:
    return InstallResult(
        model_dir=str(model_dir),
        changed=False,
        check_only=check_only,
        added={},
        backup=None,
        total_size_before=check.total_size_recorded,
        total_size_after=check.total_size_expected,
        before=check,
        after=check,
    )


@contextlib.contextmanager
def _exclusive(model_dir: Path) -> Iterator[None]:
    """One install at a time per directory: an flock on the directory itself (works on a read-only mount too).
    Where the file system cannot lock, installs go unserialised and the checks below catch a lost race."""
    try:
        fd = os.open(model_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield  # check_index says what is wrong with the directory
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(
                f"another `glm53 model install` is repairing {model_dir} right now",
                fix="wait for it to finish, then run install again (it finds nothing left to do)",
            ) from None
        except OSError:
            pass  # no locks on this file system
        yield
    finally:
        os.close(fd)


def _changed_meanwhile(what: str) -> CheckFailed:
    return CheckFailed(
        f"{what} while install was running: another install (or a person) changed the checkpoint meanwhile",
        fix="run `glm53 model install` again: it starts from what is there now",
    )


def _index_bytes(model_dir: Path) -> bytes | None:
    try:
        return (model_dir / INDEX_NAME).read_bytes()
    except OSError:
        return None


def install(model_dir: Path, *, check_only: bool = False) -> InstallResult:
    """Repair the index in place (or only check it). Refuses, changing nothing, when the checkpoint
    has defects the repair must not paper over (dangling entries, duplicates, spec mismatches)."""
    model_dir = Path(model_dir)
    if check_only:
        return _unchanged(model_dir, check_index(model_dir), check_only)
    with _exclusive(model_dir):
        return _install(model_dir)


def _install(model_dir: Path) -> InstallResult:
    seen = _index_bytes(model_dir)
    before = check_index(model_dir)
    result = _unchanged(model_dir, before, False)
    if before.ok:
        return result
    if not before.repairable:
        raise CheckFailed(
            f"{before.index}: cannot repair: {before.summary}",
            fix="fix or re-download the checkpoint (`glm53 model verify`), then run install again",
        )
    if not os.access(model_dir, os.W_OK):
        raise BadInput(
            f"model directory {model_dir} is read-only: the index cannot be repaired in place",
            fix="repair a writable copy, or run install before mounting it read-only",
        )

    index_path, raw, weight_map = _load_index(model_dir)
    original = _index_bytes(model_dir)
    if original is None or original != seen:
        raise _changed_meanwhile(f"{index_path} changed")
    added_map = {t: f for f, names in before.unindexed.items() for t in names}
    new_index = dict(raw)
    new_index["metadata"] = {**raw.get("metadata", {}), "total_size": before.total_size_expected}
    new_index["weight_map"] = {**weight_map, **dict(sorted(added_map.items()))}

    backup = model_dir / INDEX_BACKUP_NAME
    made_backup = False
    if not os.path.lexists(backup):
        # Byte-for-byte copy of the original, so a lock of the upstream files still matches it.
        try:
            atomic_write_bytes(backup, original, overwrite=False)
        except BadInput:
            if os.path.lexists(backup):  # made by someone else between the look and the write
                raise _changed_meanwhile(f"{backup} appeared") from None
            raise
        made_backup = True
    try:
        atomic_write_json(index_path, new_index)
    except BaseException:
        if made_backup:
            with contextlib.suppress(OSError):
                backup.unlink()
        raise
    after = check_index(model_dir)
    return result.model_copy(
        update={
            "changed": True,
            "added": {f: len(n) for f, n in before.unindexed.items()},
            "backup": str(backup),
            "total_size_after": after.total_size_expected,
            "after": after,
        }
    )


__all__ = ["IndexCheck", "InstallResult", "check_index", "install"]
