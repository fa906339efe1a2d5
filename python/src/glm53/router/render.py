"""The human rendering of `glm53 router --dry-run` (--json prints the model itself)."""

from __future__ import annotations

import shlex

from rich.console import Console

from glm53.router.start import RouterDryRun


def render_dry_run(console: Console, result: RouterDryRun) -> None:
    launch = result.launch
    console.print(f"[bold]router[/bold] {launch.base_url}  policy {launch.policy}  backends {len(launch.backends)}")
    for url in launch.backends:
        console.print(f"  backend {url}")
    key = f"from the fleet's api_key_file, in {launch.api_key_env}" if launch.api_key else "none"
    console.print(f"API key: {key}")
    check = result.flag_check
    if check.checked:
        console.print(f"flags accepted by vllm-router {check.router_version}" + (" (cached)" if check.cached else ""))
    else:
        console.print(f"flags not checked: {check.reason}")
    console.print("command:", highlight=False)
    console.print("  " + shlex.join(launch.argv), highlight=False, soft_wrap=True)
