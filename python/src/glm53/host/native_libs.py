"""Shared libraries the engine's extension modules load, resolved the way the dynamic loader does, before it starts.

A missing system library (vLLM's CPU extension links `libnuma.so.1`) otherwise surfaces 100 seconds into an
engine start, as an ImportError deep in a worker process. Reading ELF headers and the loader's search path
takes well under a second and names the library, the module that needs it and the package that provides it.

    read_elf(path) -> ElfObject                     I/O: the dynamic section of one shared object
    read_loader_view() -> LoaderView                I/O: LD_LIBRARY_PATH, `ldconfig -p`, the default dirs
    find_missing(objects, view) -> [MissingLibrary] pure over what was read (plus existence of candidate files)

Search order per `ld.so(8)`: DT_RPATH (only when there is no DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH, the
ldconfig cache, the default directories. A library that one of the engine's own objects provides (torch's
`libtorch.so`, loaded by `import torch` before vLLM's extension) counts as present, as it does in the process.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from glm53.errors import Unavailable
from glm53.host.os_packages import install_command, read_os_packages
from glm53.proc import TimedOut, environment, run

ELF_MAGIC = b"\x7fELF"
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
# What glibc searches last on Debian's multiarch layout (x86_64 and aarch64).
DEFAULT_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)
# The packages whose compiled modules the engine imports on start: vLLM's own and torch's.
ENGINE_PACKAGES = ("vllm", "torch")


class ElfObject(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: Path
    machine: int  # e_machine: the loader only takes a library built for the same machine
    elf_class: int  # 1 = 32-bit, 2 = 64-bit
    soname: str | None
    needed: list[str]
    rpath: list[str]
    runpath: list[str]


class LoaderView(BaseModel):
    """Where the loader looks, apart from each object's own RPATH/RUNPATH."""

    model_config = ConfigDict(frozen=True)

    ld_library_path: list[str]
    cache: dict[str, list[str]]  # soname -> paths, from `ldconfig -p`
    default_dirs: list[str]


class MissingLibrary(BaseModel):
    model_config = ConfigDict(frozen=True)

    soname: str
    needed_by: list[str]
    debian_package: str | None  # from the project's package list, when it names this library

    def install_fix(self) -> str:
        if self.debian_package:
            return f"apt-get install {self.debian_package}"
        return f"install the package that provides {self.soname} (Debian: apt-file search {self.soname})"


class NotElf(ValueError):
    pass


# ---------------------------------------------------------------- ELF (the dynamic section only)


def read_elf(path: Path) -> ElfObject:
    """NEEDED, SONAME, RPATH and RUNPATH of a shared object; NotElf if it is not a readable ELF file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(64)
            if len(data) < 52 or data[:4] != ELF_MAGIC or data[4] not in (1, 2) or data[5] not in (1, 2):
                raise NotElf(f"{path}: not an ELF file")
            wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
            (machine,) = struct.unpack_from(order + "H", data, 18)
            if wide:
                phoff, phentsize, phnum = (
                    struct.unpack_from(order + "Q", data, 32)[0],
                    *struct.unpack_from(order + "HH", data, 54),
                )
                phdr_fmt, dyn_fmt = order + "IIQQQQQQ", order + "qQ"
            else:
                phoff, phentsize, phnum = (
                    struct.unpack_from(order + "I", data, 28)[0],
                    *struct.unpack_from(order + "HH", data, 42),
                )
                phdr_fmt, dyn_fmt = order + "IIIIIIII", order + "iI"
            handle.seek(phoff)
            table = handle.read(phentsize * phnum)
            loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
            dynamic: tuple[int, int] | None = None
            for i in range(phnum):
                fields = struct.unpack_from(phdr_fmt, table, i * phentsize)
                if wide:
                    p_type, _, p_offset, p_vaddr, _, p_filesz = fields[:6]
                else:
                    p_type, p_offset, p_vaddr, _, p_filesz = fields[:5]
                if p_type == PT_LOAD:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == PT_DYNAMIC:
                    dynamic = (p_offset, p_filesz)
            entries: list[tuple[int, int]] = []
            if dynamic is not None:
                handle.seek(dynamic[0])
                raw = handle.read(dynamic[1])
                step = struct.calcsize(dyn_fmt)
                for at in range(0, len(raw) - step + 1, step):
                    tag, value = struct.unpack_from(dyn_fmt, raw, at)
                    if tag == DT_NULL:
                        break
                    entries.append((tag, value))
            strtab = next((value for tag, value in entries if tag == DT_STRTAB), None)
            strtab_offset = _file_offset(strtab, loads) if strtab is not None else None

            def string(offset: int) -> str:
                if strtab_offset is None:
                    raise NotElf(f"{path}: dynamic section without a string table")
                handle.seek(strtab_offset + offset)
                chunk = handle.read(4096)
                return chunk.split(b"\0", 1)[0].decode("utf-8", "replace")

            def strings(wanted: int) -> list[str]:
                return [string(value) for tag, value in entries if tag == wanted]

            sonames, needed = strings(DT_SONAME), strings(DT_NEEDED)
            rpath, runpath = strings(DT_RPATH), strings(DT_RUNPATH)
    except OSError as exc:
        raise NotElf(f"{path}: {exc.strerror}") from exc
    except struct.error as exc:
        raise NotElf(f"{path}: truncated ELF headers") from exc
    return ElfObject(
        path=path,
        machine=machine,
        elf_class=2 if wide else 1,
        soname=sonames[0] if sonames else None,
        needed=needed,
        rpath=[p for item in rpath for p in item.split(":") if p],
        runpath=[p for item in runpath for p in item.split(":") if p],
    )


def _file_offset(vaddr: int, loads: list[tuple[int, int, int]]) -> int | None:
    for start, offset, size in loads:
        if start <= vaddr < start + size:
            return vaddr - start + offset
    return None


@cache
def _read_elf_cached(path: Path) -> ElfObject | None:
    try:
        return read_elf(path)
    except NotElf:
        return None


# ---------------------------------------------------------------- the loader's view (I/O at the edge)


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    """`ldconfig -p` lines (`\tlibnuma.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnuma.so.1`)."""
    cache_map: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, arrow, target = line.strip().partition(" => ")
        if not arrow:
            continue
        soname = name.split(" (", 1)[0].strip()
        cache_map.setdefault(soname, []).append(target.strip())
    return cache_map


def read_loader_view(environ: Mapping[str, str] | None = None) -> LoaderView:
    env = os.environ if environ is None else environ
    text = ""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            done = run([ldconfig, "-p"], env=environment(LC_ALL="C"), what="reading the loader cache", timeout=20)
        except (Unavailable, TimedOut):
            continue
        text = done.stdout.decode("utf-8", errors="replace")
        break
    return LoaderView(
        ld_library_path=[p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p],
        cache=parse_ldconfig(text),
        default_dirs=list(DEFAULT_DIRS),
    )


def engine_objects(packages: Iterable[str] = ENGINE_PACKAGES) -> list[Path]:
    """The shared objects inside the engine's installed packages (found without importing them)."""
    found: list[Path] = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            found += sorted(p for p in Path(location).rglob("*.so*") if p.is_file() and ".so" in p.suffixes)
    return found


# ---------------------------------------------------------------- resolution (pure but for file existence)


def _expand(entry: str, origin: Path) -> str:
    return entry.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin))


def _compatible(candidate: Path, requester: ElfObject) -> bool:
    info = _read_elf_cached(candidate)
    return info is not None and info.machine == requester.machine and info.elf_class == requester.elf_class


def resolve(soname: str, requester: ElfObject, view: LoaderView) -> Path | None:
    """The file the loader would map for `soname` needed by `requester`, or None if it finds none."""
    if "/" in soname:
        path = Path(_expand(soname, requester.path.parent))
        return path if path.is_file() else None
    origin = requester.path.parent
    dirs = [] if requester.runpath else [_expand(p, origin) for p in requester.rpath]
    dirs += view.ld_library_path + [_expand(p, origin) for p in requester.runpath]
    for directory in dirs:
        candidate = Path(directory) / soname
        if candidate.is_file() and _compatible(candidate, requester):
            return candidate
    for cached in view.cache.get(soname, []):
        candidate = Path(cached)
        if candidate.is_file() and _compatible(candidate, requester):
            return candidate
    for directory in view.default_dirs:
        candidate = Path(directory) / soname
        if candidate.is_file() and _compatible(candidate, requester):
            return candidate
    return None


def find_system_library(soname: str, view: LoaderView) -> Path | None:
    """Where the loader finds `soname` for this Python (LD_LIBRARY_PATH, the ldconfig cache, the default dirs):
    e.g. the driver's libcuda.so.1, wherever a distribution or a container toolkit put it."""
    interpreter = _read_elf_cached(Path(sys.executable).resolve())
    if interpreter is None:
        return None
    return resolve(soname, interpreter.model_copy(update={"rpath": [], "runpath": []}), view)


def find_missing(objects: Iterable[Path], view: LoaderView, *, relative_to: Path | None = None) -> list[MissingLibrary]:
    """Every library that some object (or a library it pulls in) needs and the loader would not find."""
    roots = [info for path in objects if (info := _read_elf_cached(path)) is not None]
    provided = {info.soname or info.path.name for info in roots} | {info.path.name for info in roots}
    packages = soname_packages()
    missing: dict[str, list[str]] = {}
    seen: set[Path] = {info.path for info in roots}
    queue = list(roots)
    while queue:
        info = queue.pop()
        for soname in info.needed:
            if soname in provided:
                continue
            path = resolve(soname, info, view)
            if path is None:
                where = str(info.path.relative_to(relative_to)) if relative_to else str(info.path)
                missing.setdefault(soname, []).append(where)
                continue
            resolved = path.resolve()
            if resolved not in seen:
                seen.add(resolved)
                deps = _read_elf_cached(resolved)
                if deps is not None:
                    queue.append(deps.model_copy(update={"path": path}))
    return [
        MissingLibrary(soname=name, needed_by=sorted(set(users)), debian_package=packages.get(name))
        for name, users in sorted(missing.items())
    ]


def soname_packages() -> dict[str, str]:
    """soname -> the Debian package that provides it, from the project's one list of OS packages."""
    return {soname: package.name for package in read_os_packages() for soname in package.libraries}


def missing_engine_libraries(
    view: LoaderView | None = None, packages: Iterable[str] = ENGINE_PACKAGES
) -> list[MissingLibrary]:
    """What the installed engine needs and this host's loader cannot find (empty: all present)."""
    objects = engine_objects(packages)
    if not objects:
        return []
    site = _common_parent(objects)
    return find_missing(objects, view or read_loader_view(), relative_to=site)


def describe_missing(missing: list[MissingLibrary]) -> tuple[str, str]:
    """(what is missing and what needs it, the install command): one message for doctor, serve and demo."""
    parts = []
    for lib in missing:
        users = ", ".join(lib.needed_by[:3]) + (f" and {len(lib.needed_by) - 3} more" if len(lib.needed_by) > 3 else "")
        parts.append(f"{lib.soname} (needed by {users})")
    packages = sorted({lib.debian_package for lib in missing if lib.debian_package})
    fixes = [install_command(packages)] if packages else []
    fixes += [lib.install_fix() for lib in missing if not lib.debian_package]
    return "the engine cannot load " + "; ".join(parts), "; ".join(fixes)


def require_engine_libraries(view: LoaderView | None = None) -> None:
    """Raise Unavailable (exit 3) naming each library the engine needs and this host lacks."""
    missing = missing_engine_libraries(view)
    if missing:
        message, fix = describe_missing(missing)
        raise Unavailable(message + "; nothing was started", fix=fix)


def _common_parent(paths: list[Path]) -> Path:
    return Path(os.path.commonpath([str(p.parent.parent) for p in paths]))
