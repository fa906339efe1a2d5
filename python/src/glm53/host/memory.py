"""Host memory: MemTotal / MemAvailable from /proc/meminfo and the memory cgroup limit (v1 or v2).

Every reader takes `root` so tests point it at a fixture tree shaped like a real machine's.
A cgroup limit of "max" or any value >= 2**60 means no limit (v1 reports "unlimited" as a page-rounded
2**63 - 4096).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput

NO_LIMIT_THRESHOLD = 1 << 60


class HostMemory(BaseModel):
    model_config = ConfigDict(frozen=True)

    mem_total_bytes: int
    mem_available_bytes: int | None
    cgroup_version: int | None
    cgroup_limit_bytes: int | None
    # min(MemTotal, cgroup limit): what this process can actually use.
    effective_limit_bytes: int
    # Where the limit came from, e.g. "/sys/fs/cgroup/system.slice/x.service/memory.max".
    cgroup_limit_source: str | None = None


def read_meminfo(root: Path = Path("/")) -> dict[str, int]:
    """/proc/meminfo as bytes per key (the kernel writes `MemTotal:       24683656 kB`)."""
    path = root / "proc/meminfo"
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}", fix="is /proc mounted?") from exc
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        fields = rest.split()
        if not fields or not fields[0].isdigit():
            continue
        scale = 1024 if len(fields) > 1 and fields[1] == "kB" else 1
        values[key.strip()] = int(fields[0]) * scale
    if "MemTotal" not in values:
        raise BadInput(f"{path} has no MemTotal line", fix="is /proc mounted?")
    return values


def _parse_limit(text: str) -> int | None:
    value = text.strip()
    if value in ("", "max"):
        return None
    if not value.isdigit():
        return None
    number = int(value)
    return None if number >= NO_LIMIT_THRESHOLD else number


def _own_cgroup_paths(root: Path) -> tuple[str | None, str | None]:
    """The v2 path ("0::/x") and the v1 memory-controller path ("N:memory:/x") of this process."""
    v2: str | None = None
    v1: str | None = None
    try:
        text = (root / "proc/self/cgroup").read_text()
    except OSError:
        return None, None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's directory and each parent up to the mount point, leaf first.

    Inside a cgroup namespace the kernel shows "/" while the container's own limit sits at the mount root,
    so a path that does not exist under the mount falls back to the mount root itself.
    """
    relative = PurePosixPath(cgroup_path.strip() or "/")
    parts = [p for p in relative.parts if p not in ("/", "", "..")]
    dirs = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    existing = [d for d in dirs if d.is_dir()]
    return existing or [mount]


def _lowest_limit(dirs: list[Path], filename: str) -> tuple[int | None, str | None]:
    """Limits nest: the tightest one on the way to the root binds."""
    best: int | None = None
    source: str | None = None
    for directory in dirs:
        try:
            limit = _parse_limit((directory / filename).read_text())
        except OSError:
            continue
        if limit is not None and (best is None or limit < best):
            best, source = limit, str(directory / filename)
    return best, source


def read_cgroup_memory_limit(root: Path = Path("/")) -> tuple[int | None, int | None, str | None]:
    """(cgroup version, limit in bytes or None, file the limit came from)."""
    cgroup_root = root / "sys/fs/cgroup"
    v2_path, v1_path = _own_cgroup_paths(root)
    if (cgroup_root / "cgroup.controllers").is_file():
        dirs = _ancestors(cgroup_root, v2_path or "/")
        limit, source = _lowest_limit(dirs, "memory.max")
        return 2, limit, _display(source, root)
    memory_mount = cgroup_root / "memory"
    if memory_mount.is_dir():
        dirs = _ancestors(memory_mount, v1_path or "/")
        limit, source = _lowest_limit(dirs, "memory.limit_in_bytes")
        return 1, limit, _display(source, root)
    return None, None, None


def _display(source: str | None, root: Path) -> str | None:
    if source is None:
        return None
    try:
        return "/" + str(Path(source).relative_to(root))
    except ValueError:
        return source


def read_host_memory(root: Path = Path("/")) -> HostMemory:
    meminfo = read_meminfo(root)
    total = meminfo["MemTotal"]
    version, limit, source = read_cgroup_memory_limit(root)
    effective = total if limit is None else min(total, limit)
    return HostMemory(
        mem_total_bytes=total,
        mem_available_bytes=meminfo.get("MemAvailable"),
        cgroup_version=version,
        cgroup_limit_bytes=limit,
        effective_limit_bytes=effective,
        cgroup_limit_source=source,
    )


__all__ = ["NO_LIMIT_THRESHOLD", "HostMemory", "read_cgroup_memory_limit", "read_host_memory", "read_meminfo"]
