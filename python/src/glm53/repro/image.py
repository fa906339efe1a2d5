"""`glm53 repro audit-image`: two streams of the image must be byte-identical.

The image is a docker-archive tarball as `dockerTools.streamLayeredImage` streams it: manifest.json (one entry:
Config, RepoTags, Layers) beside the config JSON and one tar per layer. Two tarballs (built twice, or given) are
compared by sha256; when they differ, by the config's and each layer's sha256, and inside the first differing
layer, member by member, to the first file that differs and how (content, mtime, mode, owner, ...).
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from glm53.errors import BadInput
from glm53.fsutil import missing_file, parse_json
from glm53.proc import environment, run, text
from glm53.repro import nix_build_outputs, nix_rebuild, positional_installables
from glm53.safetext import quoted

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


# An image's manifest.json is a few KiB; its member list is a config and a few hundred layers; a layer holds at
# most some hundred thousand files. Beyond these the tarball is not an image, and is refused before it is read.
MAX_MANIFEST_BYTES = 16 << 20
MAX_MEMBERS = 1_000_000


def _members(archive: tarfile.TarFile, where: str) -> dict[str, tarfile.TarInfo]:
    """Name -> header of each member, read one header at a time (at most MAX_MEMBERS)."""
    members: dict[str, tarfile.TarInfo] = {}
    while (member := archive.next()) is not None:
        if len(members) >= MAX_MEMBERS:
            raise BadInput(f"{where}: more than {MAX_MEMBERS:,} members, more than an image holds")
        members[member.name] = member
    return members


def _regular(archive: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str, where: str) -> IO[bytes]:
    """The member `name` as a stream: it must be there and be a regular file. A symlink or hard link (which
    could point at itself or out of the archive) is not followed: an image's manifest, config and layers
    are files."""
    member = members.get(name)
    if member is None:
        raise BadInput(f"{where}: manifest.json lists {name!r}, which the tarball does not hold")
    if not member.isreg():
        kind = "a symlink" if member.issym() else "a hard link" if member.islnk() else "not a regular file"
        raise BadInput(f"{where}: {name!r} is {kind}; an image's manifest, config and layers are files")
    handle = archive.extractfile(member)
    assert handle is not None  # a regular member always has data
    return handle


def _manifest(archive: tarfile.TarFile, members: dict[str, tarfile.TarInfo], where: str) -> dict[str, Any]:
    if "manifest.json" not in members:
        raise BadInput(f"{where}: no manifest.json (not a docker-archive image tarball)")
    size = members["manifest.json"].size
    if size > MAX_MANIFEST_BYTES:
        raise BadInput(f"{where}: manifest.json claims {size:,} bytes, more than the {MAX_MANIFEST_BYTES:,} read")
    raw = _regular(archive, members, "manifest.json", where).read(MAX_MANIFEST_BYTES)
    entries = parse_json(raw, what=f"{where}: manifest.json")
    try:
        entry = entries[0]
        config, layers = entry["Config"], entry["Layers"]
    except (KeyError, IndexError, TypeError) as exc:
        raise BadInput(f"{where}: manifest.json is not a docker-archive manifest (no {exc})") from exc
    if not isinstance(config, str) or not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
        raise BadInput(f"{where}: manifest.json is not a docker-archive manifest (Config and Layers are names)")
    return {"Config": config, "Layers": layers}


_COMPARED = ("name", "type", "mode", "uid", "gid", "uname", "gname", "mtime", "linkname", "size")


def _first_member_difference(
    layer: str, a: IO[bytes], b: IO[bytes], where_a: str, where_b: str
) -> MemberDifference | None:
    with (
        _open(fileobj=a, where=f"{where_a}, layer {layer}") as ta,
        _open(fileobj=b, where=f"{where_b}, layer {layer}") as tb,
    ):
        members_a = list(_members(ta, f"{where_a}, layer {layer}").values())
        members_b = list(_members(tb, f"{where_b}, layer {layer}").values())
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


@contextlib.contextmanager
def _open(*, where: str, path: Path | None = None, fileobj: IO[bytes] | None = None) -> Iterator[tarfile.TarFile]:
    """A tar archive, every failure to read it a BadInput that names which one (image A or B, which layer)."""
    try:
        with tarfile.open(path, fileobj=fileobj, mode="r:*") as archive:
            yield archive
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        raise BadInput(f"{where}: not a readable tar archive ({str(exc)[:200]})") from exc


class _Image:
    """One of the two tarballs: its members, its manifest and how messages name it."""

    def __init__(self, archive: tarfile.TarFile, label: str, path: Path) -> None:
        self.archive = archive
        self.where = f"image {label} ({path})"
        self.members = _members(archive, self.where)
        self.manifest = _manifest(archive, self.members, self.where)
        self.layers: list[str] = self.manifest["Layers"]

    def sha256(self, name: str) -> str:
        return _sha256(_regular(self.archive, self.members, name, self.where))

    def layer(self, index: int) -> str | None:
        return self.layers[index] if index < len(self.layers) else None


def compare_image_tarballs(a: Path, b: Path) -> ImageAudit:
    for label, path in (("A", a), ("B", b)):
        problem = missing_file(Path(path))
        if problem is not None:
            raise BadInput(
                f"image {label}: {path} {problem}",
                fix="pass the tarballs `nix build .#image-exl3` streams (or the vLLM image's)",
            )
    sha_a, sha_b = file_sha256(a), file_sha256(b)
    if sha_a == sha_b:
        return ImageAudit(
            a=str(a), b=str(b), sha256_a=sha_a, sha256_b=sha_b, identical=True, detail="byte-identical tarballs"
        )
    with _open(path=a, where=f"image A ({a})") as ta, _open(path=b, where=f"image B ({b})") as tb:
        image_a, image_b = _Image(ta, "A", a), _Image(tb, "B", b)
        config_same = image_a.sha256(image_a.manifest["Config"]) == image_b.sha256(image_b.manifest["Config"])
        layers = []
        for index in range(max(len(image_a.layers), len(image_b.layers))):
            name_a, name_b = image_a.layer(index), image_b.layer(index)
            layers.append(
                LayerDigest(
                    index=index,
                    name=name_a or name_b or "",
                    sha256_a=image_a.sha256(name_a) if name_a else None,
                    sha256_b=image_b.sha256(name_b) if name_b else None,
                )
            )
        first = None
        differing = [layer for layer in layers if not layer.same]
        for layer in differing:
            name_a, name_b = image_a.layer(layer.index), image_b.layer(layer.index)
            if name_a is None or name_b is None:
                first = MemberDifference(
                    layer=layer.name, member="", fields=["presence"], detail="layer present in one image only"
                )
                break
            first = _first_member_difference(
                layer.name,
                _regular(ta, image_a.members, name_a, image_a.where),
                _regular(tb, image_b.members, name_b, image_b.where),
                image_a.where,
                image_b.where,
            )
            if first is not None:
                break
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
    targets = positional_installables([installable], "the image output")
    outputs = nix_build_outputs(
        nix, targets, installable, missing_fix="install Nix, or pass two tarballs with --tarball"
    )
    try:
        out = outputs[0]["out"]
    except (KeyError, IndexError) as exc:
        raise BadInput(f"unexpected output from nix build --json: no 'out' output in {outputs!r:.200}") from exc
    rebuilt = nix_rebuild(nix, targets)
    if rebuilt.returncode != 0:
        raise BadInput(
            f"a second build of {installable} differs or failed: {rebuilt.stderr.strip()[-400:]}",
            fix=f"glm53 repro audit-build {installable}",
        )
    paths = []
    if not Path(out).is_absolute():
        raise BadInput(f"nix build --json named {quoted(out)} as the image script, not an absolute store path")
    for name in ("image-a.tar", "image-b.tar"):
        target = out_dir / name
        with target.open("wb") as handle:
            streamed = run([out], env=environment(), what="streaming the image", stdout=handle)
        if streamed.returncode != 0:
            raise BadInput(f"{out} could not stream the image: {text(streamed.stderr, limit=400)}")
        paths.append(target)
    return paths[0], paths[1]


__all__ = ["ImageAudit", "LayerDigest", "MemberDifference", "compare_image_tarballs", "stream_image_twice"]
