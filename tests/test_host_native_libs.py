"""The engine's shared libraries, resolved as the loader does: checked against `ldd` on the installed engine,
on objects compiled here with RPATH/RUNPATH/$ORIGIN, and with libnuma removed from the loader's view (an
ldconfig cache without it and empty default directories), through doctor, serve and demo."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from glm53.host import native_libs
from glm53.host.native_libs import (
    LoaderView,
    NotElf,
    engine_objects,
    find_missing,
    parse_ldconfig,
    read_elf,
    read_loader_view,
    resolve,
)
from glm53.host.os_packages import parse_os_packages, read_os_packages
from tests.support.cli import run_glm53

ROOT = Path(__file__).resolve().parents[1]
needs_engine = pytest.mark.skipif(not engine_objects(["vllm"]), reason="vLLM is not installed")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _without_numa(view: LoaderView, empty: Path) -> LoaderView:
    """This host's loader view with libnuma gone: not in the ldconfig cache, and no default directory."""
    cache = {name: paths for name, paths in view.cache.items() if not name.startswith("libnuma.")}
    return view.model_copy(update={"cache": cache, "default_dirs": [str(empty)], "ld_library_path": []})


def _ldd(path: Path) -> dict[str, str | None]:
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    found: dict[str, str | None] = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\S+) => (not found|(\S+))", line)
        if match:
            found[match.group(1)] = None if match.group(2) == "not found" else match.group(3)
    return found


def test_ldconfig_output_is_parsed_by_soname() -> None:
    text = (
        "541 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibnuma.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnuma.so.1\n"
        "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n"
        "\tlibz.so.1 (libc6) => /lib/i386-linux-gnu/libz.so.1\n"
    )
    assert parse_ldconfig(text) == {
        "libnuma.so.1": ["/lib/x86_64-linux-gnu/libnuma.so.1"],
        "libz.so.1": ["/lib/x86_64-linux-gnu/libz.so.1", "/lib/i386-linux-gnu/libz.so.1"],
    }


def test_non_elf_and_truncated_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "text.so").write_text("not a library")
    header = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    header[32:40] = (64).to_bytes(8, "little")  # program headers at 64 ...
    header[54:58] = (56).to_bytes(2, "little") + (3).to_bytes(2, "little")  # ... three of them, not there
    (tmp_path / "short.so").write_bytes(bytes(header))
    for name in ("text.so", "short.so", "absent.so"):
        with pytest.raises(NotElf, match=name):
            read_elf(tmp_path / name)


@needs_engine
def test_every_engine_dependency_resolves_to_the_same_file_as_ldd() -> None:
    """On this host nothing is missing, and each library we resolve is the one the real loader maps."""
    view = read_loader_view()
    objects = engine_objects()
    assert any(p.name.startswith("_C") for p in objects)
    assert find_missing(objects, view) == []
    provided = {p.name for p in objects}
    for path in objects:
        info = read_elf(path)
        by_ldd = _ldd(path)
        for soname in info.needed:
            ours = resolve(soname, info, view)
            if soname not in by_ldd:  # the program interpreter, which ldd lists without "=>"
                continue
            if by_ldd[soname] is None:  # ldd alone does not know what `import torch` already loaded
                assert soname in provided or ours is None, (path, soname)
            else:
                assert ours is not None and ours.resolve() == Path(by_ldd[soname]).resolve(), (path, soname)


@needs_engine
def test_libnuma_hidden_from_the_loader_is_named_with_its_package(tmp_path: Path) -> None:
    missing = find_missing(engine_objects(), _without_numa(read_loader_view(), tmp_path))
    assert [m.soname for m in missing] == ["libnuma.so.1"]
    assert missing[0].debian_package == "libnuma1"
    assert any(user.endswith("_C.abi3.so") for user in missing[0].needed_by)
    assert missing[0].install_fix() == "apt-get install libnuma1"


@needs_cc
def test_rpath_runpath_origin_and_ld_library_path_follow_the_loader(tmp_path: Path) -> None:
    """Objects compiled here: a library found through $ORIGIN, then only through LD_LIBRARY_PATH."""
    lib_dir, app_dir = tmp_path / "lib", tmp_path / "app"
    lib_dir.mkdir()
    app_dir.mkdir()
    (tmp_path / "dep.c").write_text("int glm53_dep(void) { return 7; }\n")
    (tmp_path / "user.c").write_text("int glm53_dep(void);\nint glm53_user(void) { return glm53_dep(); }\n")
    cc = ["cc", "-shared", "-fPIC"]
    subprocess.run(
        [*cc, "-Wl,-soname,libglm53dep.so.1", "-o", lib_dir / "libglm53dep.so.1", tmp_path / "dep.c"], check=True
    )
    (lib_dir / "libglm53dep.so").symlink_to("libglm53dep.so.1")
    link = ["-L", str(lib_dir), "-lglm53dep", "-Wl,--no-as-needed"]
    subprocess.run(
        [
            *cc,
            "-o",
            app_dir / "with_origin.so",
            tmp_path / "user.c",
            *link,
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib",
        ],
        check=True,
    )
    subprocess.run([*cc, "-o", app_dir / "plain.so", tmp_path / "user.c", *link], check=True)
    with_origin, plain = read_elf(app_dir / "with_origin.so"), read_elf(app_dir / "plain.so")
    assert with_origin.needed[0] == "libglm53dep.so.1" and with_origin.runpath == ["$ORIGIN/../lib"]
    assert read_elf(lib_dir / "libglm53dep.so.1").soname == "libglm53dep.so.1"

    empty = LoaderView(ld_library_path=[], cache={}, default_dirs=[])
    assert resolve("libglm53dep.so.1", with_origin, empty) == app_dir / "../lib/libglm53dep.so.1"
    assert resolve("libglm53dep.so.1", plain, empty) is None
    on_path = empty.model_copy(update={"ld_library_path": [str(lib_dir)]})
    assert resolve("libglm53dep.so.1", plain, on_path) == lib_dir / "libglm53dep.so.1"
    # the same answers from the real loader
    assert _ldd(app_dir / "plain.so")["libglm53dep.so.1"] is None
    missing = find_missing([app_dir / "plain.so"], read_loader_view(environ={}), relative_to=tmp_path)
    assert [(m.soname, m.needed_by, m.debian_package) for m in missing] == [
        ("libglm53dep.so.1", ["app/plain.so"], None)
    ]
    assert "apt-file search libglm53dep.so.1" in missing[0].install_fix()
    assert find_missing([app_dir / "with_origin.so"], read_loader_view(environ={})) == []


def _hide_numa(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = read_loader_view()
    monkeypatch.setattr(native_libs, "read_loader_view", lambda environ=None: _without_numa(real, tmp_path))


@needs_engine
@pytest.mark.parametrize(
    "args",
    [
        ("demo", "--port", "8123"),
        ("serve", "--profile", "cpu-tiny", "--model-dir", "."),
        ("doctor", "--profile", "cpu-tiny"),
    ],
    ids=["demo", "serve", "doctor"],
)
def test_missing_library_stops_demo_serve_and_doctor_in_seconds(
    args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _hide_numa(monkeypatch, tmp_path)
    started = time.monotonic()
    result = run_glm53(*args)
    assert result.code == 3, result.stderr
    assert time.monotonic() - started < 20
    message = " ".join(result.stderr.split())
    assert "libnuma.so.1" in message and "vllm/_C.abi3.so" in message
    assert "apt-get install libnuma1" in message


def test_readme_ci_and_makefile_state_the_one_package_list() -> None:
    names = [p.name for p in read_os_packages()]
    assert "libnuma1" in names and "make" in names
    readme = (ROOT / "README.md").read_text()
    lines = [line for line in readme.splitlines() if "apt-get install" in line and "--no-install-recommends" in line]
    assert lines, "README: no prerequisites line"
    stated = lines[0].split("--no-install-recommends", 1)[1].split("`")[0].split()
    assert stated == names
    resource = "python/src/glm53/data/os-packages.txt"
    assert resource in (ROOT / ".ci" / "run").read_text()
    assert resource in (ROOT / "Makefile").read_text()
    assert parse_os_packages("# c\nfoo libfoo.so.1 libfoo.so.2  # why\n\nbar\n")[0].libraries == (
        "libfoo.so.1",
        "libfoo.so.2",
    )
