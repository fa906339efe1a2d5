"""`glm53 repro audit-image`: two streams of the image must be byte-identical.

The image is a docker-archive tarball as `dockerTools.streamLayeredImage` streams it: manifest.json (one entry:
Config, RepoTags, Layers) beside the config JSON and one tar per layer. Two tarballs (built twice, or given) are
compared by sha256; when they differ, by the config's and each layer's sha256, and inside the first differing
layer, member by member, to the first file that differs and how (content, mtime, mode, owner, ...).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from glm53.errors import BadInput
from glm53.repro import nix_build_outputs, nix_rebuild

_CHUNK = 1 << 20


class LayerDigest(BaseModel):
    index: int
    name: str
    sha256_a: str | None
    sha256_b: str | None

    @property
    def same(self) -> bool:
        return self.sha256_a == self.sha256_b


class MemberDifference(BaseModel):
    layer: str
    member: str
    fields: list[str]
    detail: str


class ImageAudit(BaseModel):
    a: str
    b: str
    sha256_a: str
    sha256_b: str
    identical: bool
    config_same: bool | None = None
    layers: list[LayerDigest] = []
    first_difference: MemberDifference | None = None
    detail: str
    suggestion: str | None = None


def _sha256(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    with Path(path).open("rb") as handle:
        return _sha256(handle)


def _manifest(archive: tarfile.TarFile, where: Path) -> dict[str, Any]:
    try:
        member = archive.extractfile("manifest.json")
    except KeyError as exc:
        raise BadInput(f"{where}: no manifest.json (not a docker-archive image tarball)") from exc
    if member is None:
        raise BadInput(f"{where}: manifest.json is not a file")
    try:
        entries = json.loads(member.read(16 << 20))
        entry = entries[0]
        layers = [str(layer) for layer in entry["Layers"]]
        return {"Config": str(entry["Config"]), "Layers": layers}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise BadInput(f"{where}: manifest.json is not a docker-archive manifest ({exc})") from exc


def _member_sha256(archive: tarfile.TarFile, name: str) -> str | None:
    try:
        handle = archive.extractfile(name)
    except KeyError:
        return None
    return _sha256(handle) if handle is not None else None


_COMPARED = ("name", "type", "mode", "uid", "gid", "uname", "gname", "mtime", "linkname", "size")


def _first_member_difference(layer: str, a: IO[bytes], b: IO[bytes]) -> MemberDifference | None:
    with tarfile.open(fileobj=a, mode="r:*") as ta, tarfile.open(fileobj=b, mode="r:*") as tb:
        members_a, members_b = ta.getmembers(), tb.getmembers()
        for ma, mb in zip(members_a, members_b, strict=False):
            fields = [f for f in _COMPARED if getattr(ma, f) != getattr(mb, f)]
            if not fields and ma.isreg():
                fa, fb = ta.extractfile(ma), tb.extractfile(mb)
                if fa is not None and fb is not None and _sha256(fa) != _sha256(fb):
                    fields.append("content")
            if fields:
                detail = ", ".join(
                    f"{f} {getattr(ma, f)!r} vs {getattr(mb, f)!r}" if f != "content" else "content differs"
                    for f in fields
                )
                return MemberDifference(layer=layer, member=ma.name, fields=fields, detail=detail)
        if len(members_a) != len(members_b):
            longer = members_a if len(members_a) > len(members_b) else members_b
            extra = longer[min(len(members_a), len(members_b))]
            return MemberDifference(
                layer=layer,
                member=extra.name,
                fields=["presence"],
                detail=f"{len(members_a)} vs {len(members_b)} members; {extra.name} is in one only",
            )
    return None


def compare_image_tarballs(a: Path, b: Path) -> ImageAudit:
    for path in (a, b):
        if not Path(path).is_file():
            raise BadInput(f"image tarball {path} not found", hint="pass the files `nix build .#image` streams")
    sha_a, sha_b = file_sha256(a), file_sha256(b)
    if sha_a == sha_b:
        return ImageAudit(
            a=str(a), b=str(b), sha256_a=sha_a, sha256_b=sha_b, identical=True, detail="byte-identical tarballs"
        )
    try:
        with tarfile.open(a, mode="r:*") as ta, tarfile.open(b, mode="r:*") as tb:
            man_a, man_b = _manifest(ta, a), _manifest(tb, b)
            config_same = _member_sha256(ta, man_a["Config"]) == _member_sha256(tb, man_b["Config"])
            layers = []
            count = max(len(man_a["Layers"]), len(man_b["Layers"]))
            for index in range(count):
                name_a = man_a["Layers"][index] if index < len(man_a["Layers"]) else None
                name_b = man_b["Layers"][index] if index < len(man_b["Layers"]) else None
                layers.append(
                    LayerDigest(
                        index=index,
                        name=name_a or name_b or "",
                        sha256_a=_member_sha256(ta, name_a) if name_a else None,
                        sha256_b=_member_sha256(tb, name_b) if name_b else None,
                    )
                )
            first = None
            differing = [layer for layer in layers if not layer.same]
            for layer in differing:
                name_a = man_a["Layers"][layer.index] if layer.index < len(man_a["Layers"]) else None
                name_b = man_b["Layers"][layer.index] if layer.index < len(man_b["Layers"]) else None
                if name_a is None or name_b is None:
                    first = MemberDifference(
                        layer=layer.name, member="", fields=["presence"], detail="layer present in one image only"
                    )
                    break
                fa, fb = ta.extractfile(name_a), tb.extractfile(name_b)
                if fa is not None and fb is not None:
                    first = _first_member_difference(layer.name, fa, fb)
                    if first is not None:
                        break
    except tarfile.TarError as exc:
        raise BadInput(f"not a readable image tarball: {exc}") from exc
    if differing:
        where = f"layer {differing[0].index} ({differing[0].name})"
        detail = f"{len(differing)} of {len(layers)} layers differ; first: {where}"
        if first is not None and first.member:
            detail += f", first differing file {first.member}: {first.detail}"
    elif not config_same:
        detail = "the layers are identical; the image config differs (created date, labels?)"
    else:
        detail = "layers and config identical; the tarballs differ in their framing (member order or headers)"
    return ImageAudit(
        a=str(a),
        b=str(b),
        sha256_a=sha_a,
        sha256_b=sha_b,
        identical=False,
        config_same=config_same,
        layers=layers,
        first_difference=first,
        detail=detail,
        suggestion=f"diffoscope {a} {b}",
    )


def stream_image_twice(installable: str, out_dir: Path, *, nix: str = "nix") -> tuple[Path, Path]:
    """Build `installable` (a streamLayeredImage: a script printing the tarball), rebuild it once with
    `--rebuild`, and run the stream script twice into out_dir/image-{a,b}.tar."""
    outputs = nix_build_outputs(
        nix, [installable], installable, missing_hint="install Nix, or pass two tarballs with --tarball"
    )
    try:
        out = outputs[0]["out"]
    except (KeyError, IndexError) as exc:
        raise BadInput(f"unexpected output from nix build --json: no 'out' output in {outputs!r:.200}") from exc
    rebuilt = nix_rebuild(nix, [installable])
    if rebuilt.returncode != 0:
        raise BadInput(
            f"a second build of {installable} differs or failed: {rebuilt.stderr.strip()[-400:]}",
            hint=f"glm53 repro audit-build {installable}",
        )
    paths = []
    for name in ("image-a.tar", "image-b.tar"):
        target = out_dir / name
        with target.open("wb") as handle:
            streamed = subprocess.run([out], stdout=handle, stderr=subprocess.PIPE, check=False)
        if streamed.returncode != 0:
            raise BadInput(f"{out} could not stream the image: {streamed.stderr.decode(errors='replace')[-400:]}")
        paths.append(target)
    return paths[0], paths[1]


__all__ = ["ImageAudit", "LayerDigest", "MemberDifference", "compare_image_tarballs", "stream_image_twice"]
