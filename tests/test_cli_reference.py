"""The --help snapshot: docs/cli.md is every command's help as the code renders it now."""

from __future__ import annotations

from glm53.cli.main import app
from glm53.cli.reference import REFERENCE, command_paths, render_reference


def test_docs_cli_md_is_the_current_help_of_every_command() -> None:
    rendered = render_reference(app)
    assert REFERENCE.read_text(encoding="utf-8") == rendered, "docs/cli.md is stale: run `make cli-docs`"


def test_the_reference_covers_every_command_and_names_the_json_option() -> None:
    import typer

    paths = list(command_paths(typer.main.get_command(app)))
    rendered = render_reference(app)
    assert len(paths) >= 25
    for path in paths:
        assert f"## `{' '.join(('glm53', *path))}`" in rendered
    for reporting in ("doctor", "model verify", "plan host", "bench run", "repro audit-host", "profile check"):
        section = rendered.split(f"## `glm53 {reporting}`", 1)[1].split("\n## ", 1)[0]
        assert "--json" in section, reporting
