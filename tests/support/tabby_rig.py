"""A stand-in TabbyAPI tree with a model folder, a plan, a key file and a private runtime folder, and
`glm53 serve --profile exl3-1gpu` started on it: for the tests of an exllamav3 start (the tree's main.py is
each test's TabbyAPI double)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

STAND_IN = Path(__file__).resolve().parents[1] / "fixtures" / "tabbyapi"
# Runs glm53's real entry point after printing this process's pid: exec keeps it.
GLM53_MAIN = "import os, sys; print(os.getpid(), flush=True); from glm53.cli.main import main; main()"

EXL3_CONFIG = '{"model_type": "glm5_next", "quantization_config": {"quant_method": "exl3", "bits": 3.05}}'


class TabbyRig:
    """A stand-in TabbyAPI tree, a model folder, a plan, a key file and a private runtime folder."""

    def __init__(self, tmp: Path, main: str, *, port: int = 8123) -> None:
        self.tmp = tmp
        self.tabby = tmp / "tabby"
        shutil.copytree(STAND_IN, self.tabby)
        (self.tabby / "main.py").write_text(main)
        self.model = tmp / "models" / "glm53"
        self.model.mkdir(parents=True)
        # what the exl3 profiles check of a checkpoint before a start: its family (model_type, quantization)
        (self.model / "config.json").write_text(EXL3_CONFIG)
        self.plan = tmp / "plan.env"
        self.plan.write_text(
            "GPU_SPLIT=20\nCACHE_SIZE=131072\nCPU_MOE_OFFLOAD_LAYERS=0\nEXL3_MOE_CPU_SPLIT=180\n"
            "EXL3_MOE_CPU_SPLIT_LAYERS=40\nEXL3_MOE_CPU_THREADS=2\n"
        )
        self.key = tmp / "key"
        self.key.write_text("sk-test-4f1c\n")
        self.key.chmod(0o600)
        self.xdg = tmp / "xdg"
        self.xdg.mkdir(mode=0o700)
        self.report = tmp / "report.json"
        self.port = str(port)
        self.run_dir = self.xdg / f"glm53-tabby-{self.port}"

    def args(self, *, key: bool = True) -> list[str]:
        args = ["serve", "--profile", "exl3-1gpu", "--model-dir", str(self.model), "--plan-env", str(self.plan)]
        args += ["--port", self.port, "--skip-preflight"]
        return [*args, "--api-key-file", str(self.key)] if key else args

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TABBY_")}
        env.update(
            GLM53_TABBYAPI_DIR=str(self.tabby),
            XDG_RUNTIME_DIR=str(self.xdg),
            STAND_IN_REPORT=str(self.report),
            TABBY_MODEL_MAX_SEQ_LEN="1",
        )
        env.update(extra)
        env.pop("RUNTIME_DIRECTORY", None)
        return env

    def start(
        self, *flags: str, key: bool = True, cwd: Path | None = None, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        self.report.unlink(missing_ok=True)
        return subprocess.run(
            [sys.executable, "-c", GLM53_MAIN, *self.args(key=key), *flags],
            env=self.env(**extra),
            cwd=cwd or self.tmp,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def seen(self) -> dict[str, Any]:
        return dict(json.loads(self.report.read_text()))
