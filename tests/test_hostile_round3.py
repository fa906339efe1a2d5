"""Hostile and clumsy input, round 3: data never becomes a command option, an output never replaces a link or a
device, reads never reserve what they do not need, every path argument is checked, nothing from outside reaches
a terminal raw, and the router's probe of its backends is bounded. (Children ended on SIGTERM: test_signals.py;
the parsers under generated input: test_parsers_property.py.)"""

from __future__ import annotations

import inspect
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
import typing
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import typer
from pydantic import BaseModel

import glm53
from glm53.errors import BadInput, Unavailable
from glm53.fsutil import atomic_write_bytes, atomic_write_text, parse_json, read_bytes_bounded
from glm53.output import SafeConsole
from glm53.plan.routing.traces import read_trace
from glm53.proc import TimedOut, check_commit, check_url, environment, run
from glm53.safetext import hostname_problem, mask_secrets, printable
from tests.support.cli import CliResult, run_glm53

ROOT = Path(__file__).resolve().parents[1]
SOURCE = str(Path(glm53.__file__).resolve().parents[1])


def _run(*args: str) -> CliResult:
    result = run_glm53(*args)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _message(result: CliResult) -> str:
    return " ".join(result.stderr.split())


# ---------------------------------------------------------------- 1. data never becomes a command option


def _lock_with(tmp_path: Path, **vllm: object) -> Path:
    data = json.loads((ROOT / "repro.lock.json").read_text())
    data["engine"]["vllm"] |= {"short_rev": "8e685d198", "rev": None, "hash": None, **vllm}
    lock = tmp_path / "repro.lock.json"
    lock.write_text(json.dumps(data, indent=2))
    return lock


@pytest.mark.parametrize(
    "url",
    [
        "--upload-pack=touch {pwned};true",
        "-uupload-pack=touch {pwned}",
        "ext::sh -c touch% {pwned}",
        "file:///x --upload-pack=touch {pwned}",
        "git@github.com:org/repo.git",
    ],
)
def test_a_lock_url_never_reaches_git_as_an_option(tmp_path: Path, url: str) -> None:
    pwned = tmp_path / "PWNED"
    lock = _lock_with(tmp_path, url=url.format(pwned=pwned))
    before = lock.read_text()
    for extra in ((), ("--dry-run",)):
        result = _run("repro", "resolve", "--lock", str(lock), "--yes", *extra)
        assert result.code == 2, result.stderr
        assert "engine.vllm.url" in result.stderr
    assert not pwned.exists() and lock.read_text() == before


def test_urls_and_commits_are_checked_before_they_reach_a_command() -> None:
    for bad in ("-x", "--upload-pack=x", "ext::sh", "fd::3", "https://", "https://h/ x", "https://h/\x1b[2J", ""):
        with pytest.raises(BadInput):
            check_url(bad, what="url")
    assert check_url("https://github.com/org/repo", what="url") == "https://github.com/org/repo"
    assert check_url("file:///srv/git/repo.git", what="url")
    for bad_rev in ("--all", "HEAD", "abc", "g" * 40, "0" * 65, "8e685d198 --x"):
        with pytest.raises(BadInput):
            check_commit(bad_rev, what="rev")
    assert check_commit("8e685d198", what="rev") == "8e685d198"


def test_resolve_without_git_on_path_is_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = _lock_with(tmp_path, url="https://github.com/vllm-project/vllm")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = _run("repro", "resolve", "--lock", str(lock), "--yes")
    assert result.code == 3, result.stderr
    assert "git is not installed" in result.stderr


def test_a_child_sees_only_the_environment_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLM53_SECRET_OF_THE_PARENT", "s3cret")
    done = run(["/usr/bin/env"], env={"ONLY": "1"}, what="env")
    assert done.stdout == b"ONLY=1\n"
    assert "GLM53_SECRET_OF_THE_PARENT" not in environment()


def _state(pid: int) -> str | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_a_timed_out_child_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    started = time.monotonic()
    with pytest.raises(TimedOut):
        run(["sh", "-c", script], env=environment(), what="sleeping", timeout=1.0)
    assert time.monotonic() - started < 10
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _state(grandchild) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(grandchild) in (None, "Z"), "the child's own child outlived the timeout"


def test_a_missing_program_is_unavailable_not_a_traceback() -> None:
    with pytest.raises(Unavailable, match="not installed"):
        run(["glm53-no-such-program"], env=environment(), what="testing")


# ---------------------------------------------------------------- 2. one output policy


def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of the test's own
        except PermissionError:
            pytest.skip("cannot create a device node here")
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "target-fifo")
        path.symlink_to(tmp_path / "target-fifo")
    return path


def _output_commands(path: Path) -> list[tuple[str, ...]]:
    return [
        ("repro", "manifest", "--no-verify", "--out", str(path), "--force"),
        (
            "plan",
            "trace",
            "synth",
            "--steps",
            "10",
            "--layers",
            "3-4",
            "--experts",
            "8",
            "--top-k",
            "2",
            "--force",
            "--out",
            str(path),
        ),
        ("systemd-unit", "--model-dir", "/srv/models/glm53", "--glm53", "/bin/true", "--force", "--out", str(path)),
    ]


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "link-to-fifo"])
def test_an_output_never_replaces_a_fifo_a_device_or_a_directory(tmp_path: Path, kind: str) -> None:
    target = _special(tmp_path, kind)
    mode = os.stat(target).st_mode
    for command in _output_commands(target):
        result = _quick(*command)
        assert result.code == 2, (command, result.stderr)
        assert " is a " in result.stderr
        assert os.stat(target).st_mode == mode, f"{command} replaced the {kind}"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_an_output_through_a_symlink_writes_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real" / "unit.service"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.service"
    link.symlink_to(target)
    for command in _output_commands(link):
        result = _quick(*command)
        assert result.code == 0, (command, result.stderr)
        assert link.is_symlink() and os.readlink(link) == str(target)
        assert target.read_text() != "old\n"
        target.write_text("old\n")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "real" / "new.txt")
    atomic_write_text(dangling, "new\n")
    assert dangling.is_symlink() and (tmp_path / "real" / "new.txt").read_text() == "new\n"


def test_the_output_policy_is_in_every_out_options_help() -> None:
    from glm53.fsutil import OUTPUT_POLICY

    reference = " ".join((ROOT / "docs" / "cli.md").read_text().replace("│", " ").split())
    policy = " ".join(OUTPUT_POLICY.split())
    for command in ("systemd-unit", "repro manifest", "plan trace synth", "plan simulate", "model lock", "bench run"):
        section = reference.split(f"## `glm53 {command}`", 1)[1].split("## `glm53", 1)[0]
        assert policy in section, command


def test_an_interrupted_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(tmp_path / "out.json", b"{}")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 3. bounded reads, declared sizes checked


def test_a_bounded_read_costs_what_the_file_holds_not_the_bound(tmp_path: Path) -> None:
    small = tmp_path / "trace.jsonl"
    small.write_bytes(b"x" * 4096)
    # Under a 1 GiB address-space limit, a 1 GiB bound must not be reserved for a 4 KiB file.
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from glm53.fsutil import read_bytes_bounded\n"
        f"data = read_bytes_bounded({str(small)!r}, what='trace', max_bytes=1 << 30)\n"
        "sys.exit(0 if len(data) == 4096 else 1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SOURCE}, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    assert read_bytes_bounded(small, what="trace", max_bytes=4096) == b"x" * 4096
    with pytest.raises(BadInput, match="more than the 4,095"):
        read_bytes_bounded(small, what="trace", max_bytes=4095)


def _npz_claiming(path: Path, rows: int) -> Path:
    """A valid header array and a routes array whose .npy header claims `rows` steps over a few bytes of data."""
    from numpy.lib import format as npy

    header = json.dumps({"format": "glm53-routing-trace", "version": 1, "layers": [3], "experts": 8, "top_k": 2})
    good = io.BytesIO()
    np.save(good, np.frombuffer(header.encode(), dtype=np.uint8))
    routes = io.BytesIO()
    npy.write_array_header_1_0(routes, {"descr": "<i2", "fortran_order": False, "shape": (rows, 1, 2)})
    routes.write(b"\x00\x01" * 16)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("header.npy", good.getvalue())
        archive.writestr("routes.npy", routes.getvalue())
    return path


def test_an_npz_whose_header_claims_1e12_rows_is_refused_before_allocation(tmp_path: Path) -> None:
    path = _npz_claiming(tmp_path / "huge.npz", 10**12)
    assert path.stat().st_size < 2048
    with pytest.raises(BadInput, match=r"routes\.npy: its header declares \[1000000000000, 1, 2\]"):
        read_trace(path)
    result = _run("plan", "simulate", str(path))
    assert result.code == 2 and "declares" in result.stderr


def test_json_duplicate_keys_and_5000_digit_numbers_are_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="'port' appears twice"):
        parse_json('{"port": 1, "port": 2}', what="fleet")
    fleet = tmp_path / "fleet.json"
    fleet.write_text('{"backends": [{"url": "http://127.0.0.1:8001"}], "port": 8100, "port": 8200}')
    result = _run("router", str(fleet), "--dry-run", "--skip-flag-check")
    assert result.code == 2 and "appears twice" in result.stderr
    manifest = tmp_path / "m.json"
    manifest.write_text('{"schema_version": "glm53.repro-manifest/1", "created_at": ' + "9" * 5000 + "}")
    result = _run("repro", "diff", str(manifest), str(manifest))
    assert result.code == 2 and "4300 digits" in result.stderr
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    result = _run("repro", "diff", str(deep), str(deep))
    assert result.code == 2 and "nested too deeply" in result.stderr


# ---------------------------------------------------------------- audit-image: which tarball, and why


def _tar(members: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                archive.addfile(info, io.BytesIO(member[1]))
    return buffer.getvalue()


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def _image(path: Path, *, manifest: list[object] | None = None, extra: tuple[tarfile.TarInfo, ...] = ()) -> Path:
    """A docker-archive tarball: one layer, a config, manifest.json (unless `extra` brings its own)."""
    layer_tar = _tar([("app/run.py", b"print(1)\n")])
    listing = manifest if manifest is not None else [{"Config": "c.json", "Layers": ["l/layer.tar"]}]
    members: list[tarfile.TarInfo | tuple[str, bytes]] = [("l/layer.tar", layer_tar), ("c.json", b"{}"), *extra]
    if not any(isinstance(m, tarfile.TarInfo) and m.name == "manifest.json" for m in extra):
        members.append(("manifest.json", json.dumps(listing).encode()))
    path.write_bytes(_tar(members))
    return path


def _audit(a: Path, b: Path) -> CliResult:
    return _run("repro", "audit-image", "--tarball", str(a), "--tarball", str(b))


def test_audit_image_names_the_bad_tarball(tmp_path: Path) -> None:
    good = _image(tmp_path / "good.tar")
    missing = _image(tmp_path / "missing.tar", manifest=[{"Config": "c.json", "Layers": ["l/gone.tar"]}])
    result = _audit(good, missing)
    assert result.code == 2 and f"image B ({missing})" in _message(result) and "l/gone.tar" in result.stderr
    result = _audit(missing, good)
    assert result.code == 2 and f"image A ({missing})" in _message(result)

    self_link = _image(tmp_path / "self.tar", extra=(_link("manifest.json", "manifest.json"),))
    escaping = _image(tmp_path / "escape.tar", extra=(_link("manifest.json", "../../../etc/passwd"),))
    for bad in (self_link, escaping):
        result = _audit(good, bad)
        assert result.code == 2 and f"image B ({bad})" in _message(result) and "symlink" in result.stderr

    layer_link = tmp_path / "layerlink.tar"
    layer_link.write_bytes(
        _tar(
            [
                _link("l/layer.tar", "l/layer.tar"),
                ("c.json", b"{}"),
                ("manifest.json", json.dumps([{"Config": "c.json", "Layers": ["l/layer.tar"]}]).encode()),
            ]
        )
    )
    result = _audit(good, layer_link)
    assert result.code == 2 and "image B" in result.stderr and "symlink" in result.stderr

    nested = tmp_path / "nested.tar"
    nested.write_bytes(_tar([("manifest.json", b"[" * 100_000 + b"]" * 100_000)]))
    result = _audit(nested, good)
    assert result.code == 2 and "image A" in result.stderr and "nested too deeply" in result.stderr

    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"\x00not a tar" * 100)
    result = _audit(good, garbage)
    assert result.code == 2 and "image B" in result.stderr


def test_a_manifest_member_claiming_more_than_it_may_is_refused(tmp_path: Path) -> None:
    good = _image(tmp_path / "good.tar")
    big = tmp_path / "big.tar"
    big.write_bytes(_tar([("c.json", b"{}"), ("manifest.json", b" " * (17 << 20))]))
    result = _audit(good, big)
    assert result.code == 2 and "image B" in result.stderr and "claims 17,825,792 bytes" in result.stderr


def test_a_keep_directory_that_does_not_exist_is_bad_input(tmp_path: Path) -> None:
    result = _run("repro", "audit-image", ".#image", "--keep", str(tmp_path / "nope"))
    assert result.code == 2 and "--keep" in result.stderr and "does not exist" in result.stderr


# ---------------------------------------------------------------- 4. every path argument, every terminal


def _commands() -> Iterator[tuple[tuple[str, ...], typing.Any]]:
    """(command words, callback) of every command and group callback of the CLI."""
    from glm53.cli.main import app

    def walk(instance: typing.Any, words: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], typing.Any]]:
        if instance.registered_callback is not None and words:
            yield words, instance.registered_callback.callback
        for info in instance.registered_commands:
            function = inspect.unwrap(info.callback)
            name = info.name if isinstance(info.name, str) else function.__name__.replace("_", "-")
            yield (*words, name), function
        for group in instance.registered_groups:
            name = group.name if isinstance(group.name, str) else group.typer_instance.info.name
            yield from walk(group.typer_instance, (*words, name))

    yield from walk(app, ())


def _path_cases() -> list[tuple[tuple[str, ...], str, list[str]]]:
    """(command, the option or argument under test, its arguments with LONG where the long path goes)."""
    from glm53.cli.guard import _flag

    cases = []
    for words, function in _commands():
        hints = typing.get_type_hints(inspect.unwrap(function), include_extras=True)
        params = [p for p in inspect.signature(inspect.unwrap(function)).parameters.values() if p.name in hints]

        def is_path(name: str, hints: dict[str, typing.Any] = hints) -> bool:
            hint = hints[name]
            return "Path" in str(typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else "")

        # A pydantic model parameter is not an argument: its fields are options (glm53.cli.model_options), each
        # with a default, and a path among them is checked like any other.
        params = [
            p
            for p in params
            if hints[p.name] is not typer.Context
            and not (isinstance(hints[p.name], type) and issubclass(hints[p.name], BaseModel))
        ]
        for param in params:
            if not is_path(param.name):
                continue
            # Every other required value: options by name, arguments in their order (the one under test in its
            # place, marked LONG).
            given: list[str] = []
            for other in params:
                flag = _flag(hints, other.name)
                if other is param:
                    given += ["LONG"] if not flag.startswith("--") else [flag, "LONG"]
                elif other.default is inspect.Parameter.empty:
                    value = "/etc/hostname" if is_path(other.name) else "x"
                    given += [value] if not flag.startswith("--") else [flag, value]
            cases.append((words, _flag(hints, param.name), given))
    return cases


PATH_CASES = _path_cases()


def test_the_path_cases_cover_the_cli() -> None:
    names = {" ".join(words) for words, *_ in PATH_CASES}
    assert {"plan host", "plan simulate", "repro diff", "router", "systemd-unit", "model verify", "bench run"} <= names
    assert len(PATH_CASES) >= 40


@pytest.mark.parametrize(("words", "flag", "given"), PATH_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("length", ["name", "path"])
def test_every_path_argument_is_checked_for_length(
    words: tuple[str, ...], flag: str, given: list[str], length: str
) -> None:
    long = "n" * 300 if length == "name" else "/tmp/" + "d/" * 2100 + "file"
    result = _quick(*words, *(long if arg == "LONG" else arg for arg in given))
    assert result.code == 2, result.stderr
    expected = "a file name may be" if length == "name" else "a path may be"
    assert expected in result.stderr and flag in result.stderr


def _quick(*args: str) -> CliResult:
    """The CLI on a watchdog thread: a command that blocks fails the test instead of hanging it."""
    outcome: list[CliResult] = []
    worker = threading.Thread(target=lambda: outcome.append(_run(*args)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert outcome, f"glm53 {' '.join(args)} still running after 60 s"
    return outcome[0]


def test_nothing_from_outside_reaches_the_terminal_raw(tmp_path: Path) -> None:
    hostile = "evil\x1b]0;owned\x07\x1b[2J\u202egnp.exe\r\x9b31m"
    assert printable(hostile) == "evil\\x1b]0;owned\\x07\\x1b[2J\\u202egnp.exe\\x0d\\x9b31m"
    buffer = io.StringIO()
    console = SafeConsole(file=buffer, force_terminal=True, width=200)
    console.print(f"host {hostile} https://user:hunter2@example.com/x")
    console.print({"hostname": hostile})
    text = buffer.getvalue()
    assert "\x07" not in text and "\u202e" not in text and "\x9b" not in text and "\r" not in text
    assert "\x1b]0" not in text and "\x1b[2J" not in text and "hunter2" not in text
    assert mask_secrets("git://a:b@c and https://u:p@h/") == "git://a:***@c and https://u:***@h/"

    manifest = json.loads(_run("repro", "manifest", "--no-verify", "--out", str(tmp_path / "m.json"), "--json").stdout)
    manifest["hostname"] = "box\x1b[31mred"
    (tmp_path / "evil.json").write_text(json.dumps(manifest))
    result = _run("repro", "diff", str(tmp_path / "m.json"), str(tmp_path / "evil.json"))
    assert result.code == 2 and "\x1b" not in result.stderr and "\\x1b[31m" in result.stderr


def test_a_backend_url_with_a_secret_is_refused_without_printing_it(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[backends]]\nurl = "http://admin:SECRET-TOKEN@127.0.0.1:8001"\n')
    result = _run("router", str(fleet), "--dry-run", "--skip-flag-check")
    assert result.code == 2 and "credentials" in result.stderr
    assert "SECRET-TOKEN" not in result.stderr and "admin:***@" in result.stderr


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ('host = "127.0.0.1 "\n', "white space"),
        ('host = "my host"\n', "white space"),
        ('host = "evil\\u001b[2J"\n', "control"),
        ('host = "exa\\u202emple.com"\n', "bidi"),
        ('[metrics]\nhost = "a\\tb"\n', "white space"),
        ("port = true\n", "port"),
        ('port = "8100"\n', "port"),
        ("port = 8001\n", "the router's own address"),
        ('host = "0.0.0.0"\nlisten_all = true\nport = 8001\n', "the router's own address"),
    ],
)
def test_fleet_values_that_cannot_be_right_are_refused(tmp_path: Path, fleet: str, expected: str) -> None:
    path = tmp_path / "fleet.toml"
    backend = '[[backends]]\nurl = "http://127.0.0.1:8001"\n' if "url" not in fleet else ""
    path.write_text(fleet + backend)
    result = _run("router", str(path), "--dry-run", "--skip-flag-check")
    assert result.code == 2, result.stderr
    assert expected in result.stderr


def test_hostnames_with_spaces_controls_or_bidi_are_not_hosts() -> None:
    for bad in ("a b", "a\tb", "a\x00b", "a\u202eb", "a\u200bb", "", "-a", "a..b", "x" * 254):
        assert hostname_problem(bad) is not None, bad
    for good in ("localhost", "box-1.example.com", "127.0.0.1", "::1", "[::1]", "10.0.0.11", "node_2"):
        assert hostname_problem(good) is None, good


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xef\xbb\xbfMAX_MODEL_LEN=4096\n", "byte order mark (BOM)"),
        (b"SERVED_MODEL_NAME=a\x00b\n", "\\x00"),
        (b"SERVED_MODEL_NAME=a\x1b[2Jb\n", "\\x1b"),
        (b"SERVED_MODEL_NAME=a\xe2\x80\xaeb\n", "\\u202e"),
    ],
)
def test_env_files_with_a_bom_nul_or_escape_say_so(tmp_path: Path, content: bytes, expected: str) -> None:
    env = tmp_path / "recipe.env"
    env.write_bytes(content)
    result = _run("profile", "check", "--profile", "cpu-tiny", "--env-file", str(env))
    assert result.code == 2 and expected in result.stderr
    assert "\x1b" not in result.stderr and "\u202e" not in result.stderr


def test_repro_manifest_with_an_unknown_profile_fails(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    result = _run("repro", "manifest", "--no-verify", "--profile", "agent-265k", "--out", str(out))
    # The profile is a choice of the packaged ones: a usage error (exit 2) that names the value and the choices.
    message = " ".join(result.stderr.replace("│", " ").split())
    assert result.code == 2 and "'agent-265k' is not one of" in message and not out.exists()


def test_systemd_unit_refuses_the_root_as_model_dir() -> None:
    for directory in ("/", "/usr", "/etc"):
        result = _run("systemd-unit", "--model-dir", directory, "--glm53", "/bin/true")
        assert result.code == 2 and "ReadOnlyPaths" not in result.stdout
        assert "system directory" in result.stderr


def test_markup_in_an_error_is_text(tmp_path: Path) -> None:
    result = _run("repro", "diff", str(tmp_path / "[/bold][red]x.json"))
    assert result.code == 2 and "[/bold][red]x.json" in result.stderr


# ---------------------------------------------------------------- 5. the router's probe is bounded


@pytest.fixture
def hostile_backend() -> Iterator[tuple[str, list[str]]]:
    """A backend whose /health answers 200 with a body that never ends, or a byte a second; its URL, and the
    mode list to set ("endless" or "trickle")."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    mode: list[str] = ["endless"]
    stop = threading.Event()

    def serve(connection: socket.socket) -> None:
        with connection:
            try:
                connection.recv(4096)
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n")
                while not stop.is_set():
                    if mode[0] == "endless":
                        connection.sendall(b"x" * 65536)
                    else:
                        connection.sendall(b"x")
                        time.sleep(0.2)
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", mode
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("mode", ["endless", "trickle"])
def test_the_probe_gives_up_on_an_endless_or_trickling_health_answer(
    hostile_backend: tuple[str, list[str]], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from glm53.router import start
    from glm53.router.fleet import parse_fleet

    url, modes = hostile_backend
    modes[0] = mode
    monkeypatch.setattr(start, "PROBE_DEADLINE_S", 1.5)
    fleet = parse_fleet(json.dumps({"backends": [{"url": url}]}), source="fleet", fmt="json")
    began = time.monotonic()
    with pytest.raises(BadInput) as raised:
        start.probe_backends(fleet, None)
    assert time.monotonic() - began < 1.5 + start.PROBE_TIMEOUT_S + 2
    expected = "more than 65,536 bytes" if mode == "endless" else "took more than 1.5 s"
    assert expected in raised.value.message


def test_the_probe_limits_are_in_the_router_docs() -> None:
    from glm53.router.start import PROBE_DEADLINE_S, PROBE_MAX_BYTES, PROBE_TIMEOUT_S

    docs = (ROOT / "docs" / "router.md").read_text()
    assert f"{PROBE_MAX_BYTES // 1024} KiB" in docs
    assert f"{PROBE_DEADLINE_S:g} s" in docs and f"{PROBE_TIMEOUT_S:g} s" in docs


def test_sigterm_is_an_exit_code_not_a_traceback(tmp_path: Path) -> None:
    """The CLI's own handling: SIGTERM during a command exits 143 (128 + 15)."""
    script = (
        "import os, signal, sys, threading\n"
        "from glm53.cli import main as m\n"
        "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()\n"
        "sys.argv = ['glm53', 'repro', 'resolve', '--lock', sys.argv[1], '--yes']\n"
        "import glm53.repro.resolve as r\n"
        "r.resolve_pins = lambda *a, **k: __import__('time').sleep(30)\n"
        "m.main()\n"
    )
    lock = _lock_with(tmp_path, url="https://github.com/vllm-project/vllm")
    done = subprocess.run(
        [sys.executable, "-c", script, str(lock)],
        env={**os.environ, "PYTHONPATH": SOURCE},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr.decode()
    assert b"Traceback" not in done.stderr
