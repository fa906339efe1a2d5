"""Nix archives (NAR), written here from the format's definition, and their SRI sha256 — the content hash a
fixed-output fetch (fetchFromGitHub, fetchgit) checks.

    nar_hash_path(path) -> "sha256-..."       a directory, file or symlink on disk (what `nix hash path` says)
    nar_hash_tar(fileobj) -> "sha256-..."     the tree a tar stream unpacks to (`git archive`, a GitHub tarball)

The format: every token is a string written as its 64-bit little-endian length, its bytes and zero padding to
a multiple of 8. After "nix-archive-1" comes one node:

    ( type regular [executable ""] contents <bytes> )
    ( type symlink target <target> )
    ( type directory { entry ( name <name> node <node> ) }* )     entries sorted by the bytes of their names

Only the executable bit of a file's mode is kept; owners, times and other bits are not part of a NAR.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

from glm53.errors import BadInput

NAR_MAGIC = b"nix-archive-1"
_CHUNK = 1 << 20


class Sink(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _str(sink: Sink, data: bytes) -> None:
    sink.update(len(data).to_bytes(8, "little"))
    sink.update(data)
    if len(data) % 8:
        sink.update(b"\0" * (8 - len(data) % 8))


def _regular(sink: Sink, size: int, executable: bool, chunks: Callable[[], IO[bytes]]) -> None:
    for token in (b"(", b"type", b"regular"):
        _str(sink, token)
    if executable:
        _str(sink, b"executable")
        _str(sink, b"")
    _str(sink, b"contents")
    sink.update(size.to_bytes(8, "little"))
    written = 0
    with chunks() as handle:
        while chunk := handle.read(_CHUNK):
            sink.update(chunk)
            written += len(chunk)
    if written != size:
        raise BadInput(f"a file changed size while it was hashed ({size} -> {written} bytes)")
    if size % 8:
        sink.update(b"\0" * (8 - size % 8))
    _str(sink, b")")


def _symlink(sink: Sink, target: bytes) -> None:
    for token in (b"(", b"type", b"symlink", b"target", target, b")"):
        _str(sink, token)


def write_nar_path(sink: Sink, path: Path) -> None:
    """The NAR of `path` (not followed if it is a symlink) into `sink`."""
    _str(sink, NAR_MAGIC)
    _path_node(sink, Path(path))


def _path_node(sink: Sink, path: Path) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        _symlink(sink, os.fsencode(os.readlink(path)))
    elif stat.S_ISREG(info.st_mode):
        _regular(sink, info.st_size, bool(info.st_mode & 0o100), lambda: open(path, "rb"))  # noqa: SIM115
    elif stat.S_ISDIR(info.st_mode):
        for token in (b"(", b"type", b"directory"):
            _str(sink, token)
        for name in sorted(os.listdir(os.fsencode(path))):
            for token in (b"entry", b"(", b"name", name, b"node"):
                _str(sink, token)
            _path_node(sink, path / os.fsdecode(name))
            _str(sink, b")")
        _str(sink, b")")
    else:
        raise BadInput(f"{path}: a NAR holds only files, directories and symlinks")


@dataclass
class _Dir:
    entries: dict[bytes, _Dir | tarfile.TarInfo] = field(default_factory=dict)


def _tar_tree(archive: tarfile.TarFile) -> _Dir:
    root = _Dir()
    for member in archive:
        parts = PurePosixPath(member.name).parts
        if member.type == tarfile.XGLTYPE or member.name == "pax_global_header":
            continue  # `git archive` writes the commit id as a pax global header, not a file
        if not parts or parts[0] in ("/", "..") or ".." in parts:
            raise BadInput(f"tar member {member.name!r} leaves the tree")
        if parts == (".",):
            continue
        parts = tuple(p for p in parts if p != ".")
        node = root
        for part in parts[:-1]:
            child = node.entries.setdefault(os.fsencode(part), _Dir())
            if not isinstance(child, _Dir):
                raise BadInput(f"tar member {member.name!r} is inside a file")
            node = child
        name = os.fsencode(parts[-1])
        if member.isdir():
            existing = node.entries.setdefault(name, _Dir())
            if not isinstance(existing, _Dir):
                raise BadInput(f"tar member {member.name!r} is both a file and a directory")
        elif member.isreg() or member.issym():
            node.entries[name] = member
        else:
            raise BadInput(f"tar member {member.name!r}: a NAR holds only files, directories and symlinks")
    return root


def _tar_node(sink: Sink, archive: tarfile.TarFile, node: _Dir | tarfile.TarInfo) -> None:
    if isinstance(node, _Dir):
        for token in (b"(", b"type", b"directory"):
            _str(sink, token)
        for name in sorted(node.entries):
            for token in (b"entry", b"(", b"name", name, b"node"):
                _str(sink, token)
            _tar_node(sink, archive, node.entries[name])
            _str(sink, b")")
        _str(sink, b")")
    elif node.issym():
        _symlink(sink, os.fsencode(node.linkname))
    else:

        def opened() -> IO[bytes]:
            handle = archive.extractfile(node)
            assert handle is not None  # a regular member always has contents
            return handle

        _regular(sink, node.size, bool(node.mode & 0o100), opened)


def write_nar_tar(sink: Sink, fileobj: IO[bytes], *, strip_top: bool = False) -> None:
    """The NAR of the tree a seekable tar file unpacks to; `strip_top`: of its single top-level directory
    (a GitHub tarball, as fetchFromGitHub unpacks it)."""
    with tarfile.open(fileobj=fileobj, mode="r:*") as archive:
        root: _Dir | tarfile.TarInfo = _tar_tree(archive)
        if strip_top:
            assert isinstance(root, _Dir)
            if len(root.entries) != 1:
                raise BadInput("the tarball does not hold exactly one top-level directory")
            root = next(iter(root.entries.values()))
        _str(sink, NAR_MAGIC)
        _tar_node(sink, archive, root)


def sri_sha256(digest: bytes) -> str:
    return "sha256-" + base64.b64encode(digest).decode()


def nar_hash_path(path: Path) -> str:
    digest = hashlib.sha256()
    write_nar_path(digest, path)
    return sri_sha256(digest.digest())


def nar_hash_tar(fileobj: IO[bytes], *, strip_top: bool = False) -> str:
    digest = hashlib.sha256()
    write_nar_tar(digest, fileobj, strip_top=strip_top)
    return sri_sha256(digest.digest())


__all__ = ["nar_hash_path", "nar_hash_tar", "sri_sha256", "write_nar_path", "write_nar_tar"]
