"""A systemd unit for hosts without NixOS: settings -> unit text, hardening from one data file.

    load_unit_data() -> UnitData                      the package's data/systemd-unit.json, checked
    unit_settings(request, glm53=...) -> UnitSettings  validates through resolve_launch (reads the key/env files)
    render_unit(settings, data) -> UnitFile           pure: the [Unit], [Service], [Install] text

The hardening and limits live once, in `glm53/data/systemd-unit.json`; the NixOS module reads the same file
(`builtins.fromJSON`). What a unit adds to it is the launch: `glm53 doctor` before the start, `glm53 serve
... --skip-preflight` (the settings were resolved by the same `resolve_launch` as `serve`), the API key and
env file as systemd credentials (read by systemd itself, so they may be root-only or under /home), the
checkpoint read-only, and the environment.

Every value from the user is escaped for the directive it goes into, by the rule the NixOS module uses too
(JSON-quoted, `%` doubled, `$` doubled in command lines); control characters are refused. The checkpoint is
read-only but optional (`ReadOnlyPaths=-...`), so a missing one is explained by `glm53 doctor` in ExecStartPre.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import parse_json
from glm53.serve.resolve import ServeRequest, resolve_launch

DATA_RESOURCE = "data/systemd-unit.json"
UNIT_NAME = "glm53.service"
# systemd's PATH for system services; the directory of glm53 goes first so that `vllm serve` is the one
# installed next to it (the same virtual environment).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
# Invisible to the service: ProtectHome=true (inaccessible) and PrivateTmp=true (a private, empty /tmp).
HIDDEN_ROOTS = {
    "/home": "ProtectHome",
    "/root": "ProtectHome",
    "/run/user": "ProtectHome",
    "/tmp": "PrivateTmp",
    "/var/tmp": "PrivateTmp",
}
CREDENTIAL_API_KEY = "api-key"
CREDENTIAL_ENV_FILE = "env-file"

Value = str | int | bool | list[str]
_DIRECTIVE = re.compile(r"[A-Z][A-Za-z0-9]*\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE_COMMAND = "$\"'\\"


class UnitData(BaseModel):
    """The data file: directives by section, the service's environment, and the why of every loosening."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    about: str
    unit: dict[str, Value]
    service: dict[str, Value]
    environment: dict[str, str]
    install: dict[str, Value]
    # Directives left at systemd's (weaker) default on purpose.
    unset: list[str]
    why: dict[str, str]

    @model_validator(mode="after")
    def _consistent(self) -> UnitData:
        sections = {"unit": self.unit, "service": self.service, "install": self.install}
        for name, section in sections.items():
            for key in section:
                if not _DIRECTIVE.match(key):
                    raise ValueError(f"{name}: {key!r} is not a systemd directive name")
        for key in self.unset:
            if key in self.service:
                raise ValueError(f"unset: {key} is also set in service")
            if key not in self.why:
                raise ValueError(f"unset: {key} has no why")
        known = {*self.unit, *self.service, *self.install, *self.unset}
        for key, reason in self.why.items():
            if key not in known:
                raise ValueError(f"why: {key} is neither set nor in unset")
            if not reason.strip() or _CONTROL.search(reason):
                raise ValueError(f"why: {key} must be one line of text")
        for key, value in self.service.items():
            if value is False and key not in self.why:
                raise ValueError(f"service: {key}=false loosens the default hardening and has no why")
        return self

    def loosenings(self) -> dict[str, str]:
        """Directive -> why, for every directive set to false or left at its default on purpose."""
        keys = [key for key, value in self.service.items() if value is False] + self.unset
        return {key: self.why[key] for key in keys}


def load_unit_data(text: str | None = None) -> UnitData:
    """The packaged data file (or `text`), validated; a broken file is BadInput naming it."""
    source = f"glm53/{DATA_RESOURCE}"
    if text is None:
        text = resources.files("glm53").joinpath(DATA_RESOURCE).read_text(encoding="utf-8")
    raw: Any = parse_json(text, what=source)
    try:
        return UnitData.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, source, fix="restore the file from the glm53 package") from exc


class UnitSettings(BaseModel):
    """What a unit is rendered from; every path absolute, every value already checked."""

    model_config = ConfigDict(frozen=True)

    profile: str
    model_dir: Path
    host: str
    port: int
    listen_all: bool = False
    env_file: Path | None = None
    api_key_file: Path | None = None
    # The glm53 command ExecStartPre and ExecStart run.
    glm53: Path
    # Put first on the service's PATH: where `vllm` is installed next to glm53.
    bin_dir: Path


class UnitFile(BaseModel):
    """A rendered unit: its directives by section as they appear in the file (escaped), and the text."""

    model_config = ConfigDict(frozen=True)

    name: str = UNIT_NAME
    sections: dict[str, dict[str, str | list[str]]]
    text: str
    warnings: list[str] = []
    out: str | None = None  # the file it was written to, when it was


def _hidden_by(path: Path) -> str | None:
    posix = PurePosixPath(path)
    for root, directive in HIDDEN_ROOTS.items():
        if posix == PurePosixPath(root) or PurePosixPath(root) in posix.parents:
            return f"{root} ({directive}=true)"
    return None


def _check_visible(path: Path, *, flag: str, fix: str) -> None:
    hidden = _hidden_by(path)
    if hidden is not None:
        raise BadInput(f"{flag}: {path} is under {hidden}, which the service cannot see", fix=fix)


def _check_text(value: str, *, flag: str) -> None:
    if _CONTROL.search(value):
        raise BadInput(f"{flag}: {value!r} contains a control character (newline, tab, ...)")


def running_glm53(argv0: str | None = None, executable: str | None = None) -> Path | None:
    """The glm53 this process runs as: argv[0] when it is the `glm53` console script (the kernel hands a script
    its own path, so `.venv/bin/glm53` works without glm53 on PATH), else the glm53 beside this interpreter (a
    virtual environment's bin, when run as `python -m glm53.cli.main`); None when neither exists."""
    argv0 = sys.argv[0] if argv0 is None and sys.argv else argv0
    executable = sys.executable if executable is None else executable
    candidates = []
    if argv0 and Path(argv0).name == "glm53":
        candidates.append(Path(os.path.abspath(argv0)))
    if executable:
        candidates.append(Path(os.path.abspath(executable)).parent / "glm53")
    return next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


def find_glm53(explicit: Path | None) -> Path:
    """The glm53 executable the unit runs: --glm53, else the one running (running_glm53), else the one on PATH."""
    if explicit is None:
        found = running_glm53() or (Path(which) if (which := shutil.which("glm53")) else None)
        if found is None:
            raise BadInput("cannot tell which glm53 to run", fix="pass --glm53 /path/to/venv/bin/glm53")
        explicit = found
    path = Path(os.path.abspath(explicit))
    if not path.is_file() or not os.access(path, os.X_OK):
        raise BadInput(f"--glm53: {path} is not an executable file", fix="pass the glm53 of the installation")
    return path


# Directories of the system itself, never a checkpoint's directory.
_SYSTEM_DIRS = frozenset(
    [
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib64",
        "/nix",
        "/nix/store",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/var",
    ]
)


def unit_settings(req: ServeRequest, *, glm53: Path | None = None) -> tuple[UnitSettings, list[str]]:
    """Check a ServeRequest for a unit through `resolve_launch` (profile, env file, address rule, key file),
    without planning and without needing the checkpoint yet. Returns the settings and what deserves a word."""
    if req.model_dir is None:
        raise BadInput("systemd-unit needs the model directory", fix="glm53 systemd-unit --model-dir DIR ...")
    if req.set_values or req.plan_env is not None:
        raise BadInput("--set and --plan-env are not part of a unit", fix="put the keys in an --env-file")
    launch = resolve_launch(req, plan_here=False, need_model=False, environ={})
    warnings = list(launch.warnings)

    model_dir = req.model_dir.resolve()
    _check_text(str(model_dir), flag="--model-dir")
    if model_dir == Path(model_dir.anchor) or str(model_dir) in _SYSTEM_DIRS:
        raise BadInput(
            f"--model-dir {model_dir} is a system directory: the unit's ReadOnlyPaths={model_dir} would cover it "
            "whole and its service would read all of it",
            fix="pass the checkpoint's own directory, e.g. /srv/models/glm53",
        )
    _check_visible(
        model_dir,
        flag="--model-dir",
        fix="move or copy the checkpoint to e.g. /srv/models (`glm53 model install`), then pass that directory",
    )
    if not model_dir.is_dir():
        warnings.append(f"--model-dir: {model_dir} is not a directory yet; the service cannot start until it is")

    exe = find_glm53(glm53)
    bin_dir = exe.resolve().parent
    for path, flag in ((exe, "--glm53"), (bin_dir, "--glm53 (resolved)")):
        _check_text(str(path), flag=flag)
        unsafe = sorted(set(_UNSAFE_COMMAND).intersection(str(path)))
        if unsafe:
            # systemd refuses a command whose path holds quotes or backslashes ("Executable name contains
            # special characters") and does not expand `$` in it, while the one escaping rule doubles `$`.
            raise BadInput(
                f"{flag}: {path} holds {' '.join(unsafe)}, which systemd does not accept in a command's path",
                fix="install glm53 under a directory whose path has none of $ \" ' \\",
            )
        _check_visible(
            path,
            flag=flag,
            fix="install glm53 (and vLLM) outside /home and /tmp, e.g. a virtual environment in /opt/glm53",
        )

    files: dict[str, Path | None] = {"--env-file": req.env_file, "--api-key-file": req.api_key_file}
    resolved: dict[str, Path | None] = {}
    for flag, file in files.items():
        resolved[flag] = file.resolve() if file is not None else None
        if file is not None:
            _check_text(str(resolved[flag]), flag=flag)
            if str(resolved[flag]) != str(resolved[flag]).strip():
                raise BadInput(f"{flag}: {resolved[flag]!r} starts or ends with white space")
    settings = UnitSettings(
        profile=req.profile,
        model_dir=model_dir,
        host=req.host,
        port=req.port,
        listen_all=req.listen_all,
        env_file=resolved["--env-file"],
        api_key_file=resolved["--api-key-file"],
        glm53=exe,
        bin_dir=bin_dir,
    )
    return settings, warnings


# --- escaping -----------------------------------------------------------------------------------------------
#
# One rule for every value a unit takes from the user, the NixOS module's too (nix/lib.nix escapeExecArgs, which
# is nixpkgs' escapeSystemdExecArg of nixos/lib/utils.nix): a JSON string, which systemd unquotes with C escapes,
# with `%` doubled (specifiers) and, in command lines, `$` doubled (variables). tests/test_systemd_escaping.py
# holds the two renderers byte-equal for hostile paths.


class Raw(str):
    """A word that uses a specifier on purpose (`%d/api-key`): quoted, its `%` kept."""


def escape_specifiers(text: str) -> str:
    return text.replace("%", "%%")


def _json(text: str) -> str:
    # ensure_ascii=False: Nix's builtins.toJSON keeps UTF-8 as it is.
    return json.dumps(text, ensure_ascii=False)


def quote_word(word: str, *, command: bool = False) -> str:
    """One word of a directive that splits words (ExecStart=, Environment=): always quoted; specifiers
    escaped; `$` doubled in command lines."""
    if isinstance(word, Raw):
        return _json(str(word))
    _check_text(word, flag="unit value")
    text = escape_specifiers(_json(word))
    return text.replace("$", "$$") if command else text


def command_line(argv: list[str]) -> str:
    """argv as an ExecStart= value: each word quoted for systemd, never through a shell."""
    return " ".join(quote_word(word, command=True) for word in argv)


def optional_path(path: str) -> str:
    """A ReadOnlyPaths= entry that systemd skips when the path is missing (the `-` prefix, systemd.exec(5)), so
    that the unit reaches ExecStartPre, where `glm53 doctor` says what is missing, instead of failing its
    namespace setup (status 226/NAMESPACE) with no word about the checkpoint."""
    _check_text(path, flag="unit path")
    return escape_specifiers(_json("-" + path))


def credential(name: str, path: str) -> str:
    """LoadCredential=NAME:PATH (systemd takes the path to the end of the line and expands specifiers)."""
    _check_text(path, flag="credential path")
    return f"{name}:{escape_specifiers(path)}"


def _scalar(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _values(value: Value) -> str | list[str]:
    return [_scalar(item) for item in value] if isinstance(value, list) else _scalar(value)


# --- rendering ----------------------------------------------------------------------------------------------


def exec_argvs(settings: UnitSettings) -> tuple[list[str], list[str]]:
    """The ExecStartPre (doctor) and ExecStart (serve) argv, the address arguments as lib.nix's serveArgs."""
    exe = str(settings.glm53)
    address = ["--host", settings.host, "--port", str(settings.port)]
    doctor = [exe, "doctor", "--profile", settings.profile, "--model-dir", str(settings.model_dir), *address]
    serve = [exe, "serve", "--profile", settings.profile, "--model-dir", str(settings.model_dir)]
    if settings.env_file is not None:
        serve += ["--env-file", Raw(f"%d/{CREDENTIAL_ENV_FILE}")]
    serve += address
    if settings.listen_all:
        serve.append("--listen-all")
    if settings.api_key_file is not None:
        serve += ["--api-key-file", Raw(f"%d/{CREDENTIAL_API_KEY}")]
    serve.append("--skip-preflight")
    return doctor, serve


def launch_directives(settings: UnitSettings, data: UnitData) -> dict[str, str | list[str]]:
    """The directives a unit adds to the data file's hardening: the commands, credentials, environment."""
    doctor, serve = exec_argvs(settings)
    directives: dict[str, str | list[str]] = {
        "ExecStartPre": command_line(doctor),
        "ExecStart": command_line(serve),
    }
    credentials = []
    if settings.api_key_file is not None:
        credentials.append(credential(CREDENTIAL_API_KEY, str(settings.api_key_file)))
    if settings.env_file is not None:
        credentials.append(credential(CREDENTIAL_ENV_FILE, str(settings.env_file)))
    if credentials:
        directives["LoadCredential"] = credentials
    environment = {"PATH": f"{settings.bin_dir}:{SYSTEM_PATH}", **data.environment}
    directives["Environment"] = [quote_word(f"{key}={value}") for key, value in environment.items()]
    directives["ReadOnlyPaths"] = optional_path(str(settings.model_dir))
    return directives


def _lines(directives: dict[str, str | list[str]], why: dict[str, str] | None = None) -> list[str]:
    lines: list[str] = []
    for key, value in directives.items():
        if why and key in why:
            lines.append(f"# {why[key]}")
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{key}={item}")
    return lines


def render_unit(settings: UnitSettings, data: UnitData, *, warnings: list[str] | None = None) -> UnitFile:
    """The complete unit file for `settings`, its hardening and limits from `data`."""
    unit: dict[str, str | list[str]] = {
        "Description": escape_specifiers(f"GLM-5.3-Flash server (glm53, profile {settings.profile})"),
    }
    unit |= {key: _values(value) for key, value in data.unit.items()}
    service = launch_directives(settings, data) | {key: _values(value) for key, value in data.service.items()}
    install = {key: _values(value) for key, value in data.install.items()}
    sections = {"Unit": unit, "Service": service, "Install": install}

    out = [
        f"# {UNIT_NAME}: rendered by `glm53 systemd-unit --profile {settings.profile}`; render it again rather",
        "# than editing it. Hardening and limits: glm53/data/systemd-unit.json (shared with the NixOS module).",
        "",
        "[Unit]",
        *_lines(unit, data.why),
        "",
        "[Service]",
        *_lines(service, data.why),
    ]
    if data.unset:
        out.append("# Left at their defaults on purpose:")
        out += [f"#   {key}: {data.why[key]}" for key in data.unset]
    out += ["", "[Install]", *_lines(install, data.why), ""]
    return UnitFile(sections=sections, text="\n".join(out), warnings=list(warnings or []))


__all__ = [
    "UNIT_NAME",
    "Raw",
    "UnitData",
    "UnitFile",
    "UnitSettings",
    "command_line",
    "credential",
    "exec_argvs",
    "find_glm53",
    "load_unit_data",
    "optional_path",
    "quote_word",
    "render_unit",
    "running_glm53",
    "unit_settings",
]
