#!/usr/bin/env python3
"""Resolve the second engine's Python environment without Nix and write it into repro.lock.json
(engine.tabbyapi.environment): every wheel by PyPI URL and sha256, per Python ABI, with its Requires-Dist.

    python3 tools/lock-engine-env.py --tabbyapi DIR [--lock repro.lock.json] [--abi cp311 --abi cp312]
    python3 tools/lock-engine-env.py --verify [--lock repro.lock.json]

--verify writes nothing: it downloads every locked wheel of each ABI from PyPI with `--require-hashes` (pip
checks each sha256) and compares each wheel's METADATA Requires-Dist with the lock's `requires`; exit 1 on
any difference.

The roots are TabbyAPI's own dependencies (DIR/pyproject.toml, Linux x86_64 markers), ExLlamaV3 at the lock's
version, the TabbyAPI wheels the lock already pins (engine.tabbyapi.python) and CONSTRAINTS. pip resolves them
against PyPI alone (`--isolated`: no local configuration, index or constraints) for manylinux x86_64, binary
wheels only, and reports each wheel's URL, hash and metadata without installing (`--dry-run --report`).
torch comes from the interpreter the environment is made from (it carries the host's CUDA): torch, and what
only torch needs, are left out and recorded as `base`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from glm53.repro.resolve import json_object_span

ROOT = Path(__file__).resolve().parents[1]
# Each with its reason: the bounds the GPU run verified that the roots do not state themselves.
CONSTRAINTS = {
    "starlette<1.0": "TabbyAPI at the pinned commit is served with starlette 0.x (verified with 0.52.1)",
}
BASE = ["torch>=2.6.0"]  # ExLlamaV3 1.4.6's own bound; the interpreter's torch, with its CUDA
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(31, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
LINUX = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix"}


def tabby_roots(tree: Path) -> list[str]:
    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
    roots = []
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({**LINUX, "python_version": "3.12"}):
            requirement.marker = None
            roots.append(str(requirement))
    return roots


def resolve(requirements: list[str], abi: str) -> list[dict[str, object]]:
    version = f"{abi[2]}.{abi[3:]}"
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.json"
        (Path(work) / "requirements.txt").write_text("\n".join(requirements) + "\n")
        argv = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--quiet", "--ignore-installed"]
        argv += ["--report", str(report), "--index-url", "https://pypi.org/simple", "--only-binary=:all:"]
        argv += ["--python-version", version, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
        argv += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        argv += ["--target", str(Path(work) / "target"), "-r", str(Path(work) / "requirements.txt")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        subprocess.run(argv, check=True, env=env)
        return list(json.loads(report.read_text())["install"])


def without_torch(installs: list[dict[str, object]], abi: str) -> tuple[list[dict[str, object]], list[str]]:
    """The wheels reachable from the roots without passing through torch; the names left out."""
    environment = {**LINUX, "python_version": f"{abi[2]}.{abi[3:]}", "python_full_version": f"{abi[2]}.{abi[3:]}.0"}
    by_name = {canonicalize_name(str(i["metadata"]["name"])): i for i in installs}  # type: ignore[index]

    def requires(name: str) -> list[str]:
        out = []
        for line in by_name[name]["metadata"].get("requires_dist", []) or []:  # type: ignore[union-attr]
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({**environment, "extra": ""}):
                out.append(canonicalize_name(requirement.name))
        return out

    roots = [canonicalize_name(str(i["metadata"]["name"])) for i in installs if i.get("requested")]  # type: ignore[index]
    kept: set[str] = set()
    stack = [name for name in roots if name != "torch"]
    while stack:
        name = stack.pop()
        if name in kept or name == "torch" or name not in by_name:
            continue
        kept.add(name)
        stack += requires(name)
    left_out = sorted(set(by_name) - kept)
    return [by_name[name] for name in sorted(kept)], left_out


def wheel_entry(install: dict[str, object]) -> dict[str, object]:
    info = install["download_info"]
    metadata = install["metadata"]
    url = str(info["url"])  # type: ignore[index]
    assert url.startswith("https://files.pythonhosted.org/"), url
    return {
        "name": canonicalize_name(str(metadata["name"])),  # type: ignore[index]
        "version": str(metadata["version"]),  # type: ignore[index]
        "url": url,
        "sha256": info["archive_info"]["hashes"]["sha256"],  # type: ignore[index]
        "requires": list(metadata.get("requires_dist", []) or []),  # type: ignore[union-attr]
    }


def render(environment: dict[str, object]) -> str:
    """The section as the lock writes it: one wheel a line."""
    pad = " " * 6
    lines = ["{"]
    lines.append(f'{pad}  "requirements": {json.dumps(environment["requirements"])},')
    lines.append(f'{pad}  "constraints": {json.dumps(environment["constraints"])},')
    lines.append(f'{pad}  "base": {json.dumps(environment["base"])},')
    lines.append(f'{pad}  "abis": {{')
    abis = environment["abis"]
    assert isinstance(abis, dict)
    for n, (abi, wheels) in enumerate(abis.items()):
        lines.append(f'{pad}    "{abi}": [')
        lines += [f"{pad}      {json.dumps(w)}," for w in wheels]
        lines[-1] = lines[-1].rstrip(",")
        lines.append(f"{pad}    ]" + ("," if n < len(abis) - 1 else ""))
    lines.append(f"{pad}  }}")
    lines.append(f"{pad}}}")
    return "\n".join(lines)


def with_environment(text: str, value: str) -> str:
    """The lock's text with engine.tabbyapi.environment set to `value`, the rest of the text as it was."""
    tabby, end = json_object_span(text, text.index('"tabbyapi": {'))
    block = text[tabby:end]
    if '"environment": {' in block:
        start, stop = json_object_span(text, tabby + block.index('"environment": {'))
        return text[:start] + value + text[stop:]
    closing = end - 1  # the tabbyapi object's own "}"
    return text[:closing].rstrip() + ',\n      "environment": ' + value + "\n    " + text[closing:]


def verify(lock: dict[str, object]) -> int:
    """Every locked wheel downloaded by its hash, its METADATA's Requires-Dist equal to the lock's."""
    environment = lock["engine"]["tabbyapi"]["environment"]  # type: ignore[index]
    differences = 0
    for abi, wheels in environment["abis"].items():
        version = f"{abi[2]}.{abi[3:]}"
        with tempfile.TemporaryDirectory() as work:
            requirements = Path(work) / "requirements.txt"
            requirements.write_text(
                "".join(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in wheels)
            )
            argv = [sys.executable, "-m", "pip", "--isolated", "download", "--quiet", "--no-deps", "--require-hashes"]
            argv += ["--index-url", "https://pypi.org/simple", "--only-binary=:all:", "--python-version", version]
            argv += ["--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
            argv += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
            argv += ["-d", work, "-r", str(requirements)]
            subprocess.run(argv, check=True, env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")})
            by_file = {w["url"].rsplit("/", 1)[1]: w for w in wheels}
            for path in sorted(Path(work).glob("*.whl")):
                wheel = by_file[path.name]
                with zipfile.ZipFile(path) as archive:
                    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
                    requires = Parser().parsestr(archive.read(name).decode()).get_all("Requires-Dist") or []
                if requires != wheel["requires"]:
                    differences += 1
                    print(f"{abi} {path.name}: METADATA {requires}, lock {wheel['requires']}", file=sys.stderr)
            print(f"{abi}: {len(by_file)} wheels downloaded by sha256, Requires-Dist compared", file=sys.stderr)
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tabbyapi", type=Path, help="TabbyAPI's source tree at the pinned commit")
    parser.add_argument("--verify", action="store_true", help="check the locked wheels against PyPI; write nothing")
    parser.add_argument("--lock", type=Path, default=ROOT / "repro.lock.json")
    parser.add_argument("--abi", action="append", default=None, help="cp311 (Debian 12), cp312 (the CUDA image)")
    args = parser.parse_args()
    lock = json.loads(args.lock.read_text())
    if args.verify:
        return verify(lock)
    if args.tabbyapi is None:
        parser.error("--tabbyapi DIR is needed to resolve (or --verify)")
    tabby = lock["engine"]["tabbyapi"]
    pinned = [f"{name}=={pin['version']}" for name, pin in sorted(tabby["python"].items())]
    requirements = [
        *tabby_roots(args.tabbyapi),
        f"exllamav3=={lock['engine']['exllamav3']['version']}",
        *pinned,
        *CONSTRAINTS,
    ]
    abis = {}
    left_out: set[str] = set()
    for abi in args.abi or ["cp311", "cp312"]:
        kept, dropped = without_torch(resolve(requirements, abi), abi)
        abis[abi] = [wheel_entry(install) for install in kept]
        left_out |= set(dropped)
        print(f"{abi}: {len(kept)} wheels; left to the base interpreter: {', '.join(dropped)}", file=sys.stderr)
    environment = {"requirements": requirements, "constraints": CONSTRAINTS, "base": BASE, "abis": abis}
    text = with_environment(args.lock.read_text(), render(environment))
    json.loads(text)  # still JSON
    tmp = args.lock.with_suffix(".json.tmp")
    tmp.write_text(text)
    os.replace(tmp, args.lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
