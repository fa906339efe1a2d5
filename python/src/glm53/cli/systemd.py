"""`glm53 systemd-unit`: a hardened systemd unit for hosts without NixOS (Debian/Ubuntu + NVIDIA driver)."""

from __future__ import annotations

import sys

import typer

from glm53.cli.options import (
    ApiKeyFileOpt,
    EnvFileOpt,
    ForceOpt,
    Glm53PathOpt,
    HostOpt,
    JsonOpt,
    ListenAllOpt,
    ModelDirOpt,
    PortOpt,
    ProfileOpt,
    UnitOutOpt,
    refuse_to_replace,
)
from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.fsutil import atomic_write_text
from glm53.output import Output
from glm53.recipe.profiles import DEFAULT_PROFILE
from glm53.serve.resolve import ServeRequest
from glm53.serve.systemd import load_unit_data, render_unit, unit_settings


def systemd_unit_cmd(
    model_dir: ModelDirOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    host: HostOpt = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    listen_all: ListenAllOpt = False,
    env_file: EnvFileOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    glm53: Glm53PathOpt = None,
    out_file: UnitOutOpt = None,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Render a hardened systemd unit that serves a profile (for hosts without NixOS).

    The unit runs `glm53 doctor` before the start and `glm53 serve ... --skip-preflight`; the API key and the
    env file are passed as systemd credentials. Hardening and limits are those of the NixOS module (one data
    file, glm53/data/systemd-unit.json). The settings are checked as `glm53 serve` checks them.

    Examples:
      glm53 systemd-unit --model-dir /srv/models/glm53 --out /etc/systemd/system/glm53.service
      glm53 systemd-unit --model-dir /srv/glm53 --host 0.0.0.0 --listen-all --api-key-file /etc/key
      glm53 systemd-unit --model-dir /srv/models/glm53 --env-file /etc/glm53/agent.env --json
    """

    out = Output(json_mode=json_out)
    if out_file is not None:
        refuse_to_replace([out_file], force=force)
    req = ServeRequest(
        profile=profile,
        model_dir=model_dir,
        host=host,
        port=port,
        listen_all=listen_all,
        env_file=env_file,
        api_key_file=api_key_file,
    )
    settings, warnings = unit_settings(req, glm53=glm53)
    unit = render_unit(settings, load_unit_data(), warnings=warnings)
    for warning in unit.warnings:
        out.warn(warning)
    if out_file is not None:
        atomic_write_text(out_file, unit.text)
        out.info(f"wrote {out_file}; then: systemctl daemon-reload && systemctl enable --now {out_file.name}")
    if json_out:
        out.result(unit.model_copy(update={"out": str(out_file) if out_file is not None else None}), lambda c: None)
    elif out_file is None:
        sys.stdout.write(unit.text)
        sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("systemd-unit")(systemd_unit_cmd)
