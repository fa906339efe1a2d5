"""`glm53 serve`, `doctor`, `demo` on the command line: dry runs, bad input (exit 2, nothing started), a fast
`--help` that imports neither torch nor vLLM, and the flags checked against vLLM's own parser."""

from __future__ import annotations

import importlib.util
import json
import re
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from glm53.checkpoint.lock import default_lock_path, lock_from_directory, write_lock
from tests.support.cli import run_glm53
from tests.support.server import free_port

RECIPE = json.loads((Path(__file__).parent / "fixtures" / "serve" / "recipe-launch.json").read_text())


@pytest.fixture(autouse=True)
def never_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests expect serve to stop before the engine; if it ever got that far, fail instead of starting it."""
    import glm53.serve.engines

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("serve reached exec in a test that expected it to stop before")

    monkeypatch.setattr(glm53.serve.engines, "exec_launch", refuse)
    monkeypatch.setattr(glm53.serve.engines, "prepare_launch", refuse)


def _locked_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Glm4MoeForCausalLM"]}\n')
    write_lock(lock_from_directory(model), default_lock_path(model))
    return model


def test_importing_the_cli_imports_neither_torch_nor_vllm() -> None:
    code = (
        "import sys, glm53.cli.main; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'vllm', 'transformers', 'tokenizers', 'pynvml')); print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_every_command_module() -> None:
    import pkgutil

    import glm53.cli

    result = run_glm53("--help")
    assert result.code == 0
    listed = set(re.findall(r"^│ (\w[\w-]*) ", result.stdout, flags=re.MULTILINE))
    present = set()
    for info in pkgutil.iter_modules(glm53.cli.__path__):
        module = importlib.import_module(f"glm53.cli.{info.name}")
        if hasattr(module, "register"):
            present.add(info.name)
    # One command module per noun; its command is the noun, or starts with it (systemd -> systemd-unit).
    assert len(listed) == len(present)
    assert all(any(cmd == noun or cmd.startswith(f"{noun}-") for cmd in listed) for noun in present)
    assert {"serve", "doctor", "demo"} <= listed
    serve_help = run_glm53("serve", "--help").stdout
    for option in (
        "--profile",
        "--model-dir",
        "--dry-run",
        "--set",
        "--env-file",
        "--api-key-file",
        "--listen-all",
        "--skip-preflight",
        "--json",
    ):
        assert option in serve_help


def test_dry_run_json_reproduces_the_recipe_launch() -> None:
    result = run_glm53(
        "serve",
        "--profile",
        "agent-256k",
        "--dry-run",
        "--json",
        "--skip-flag-check",
        "--host",
        "0.0.0.0",
        "--listen-all",
        "--set",
        "CHAT_TEMPLATE=/opt/glm53/configs/chat-template-bounded.jinja",
    )
    assert result.code == 0, result.stderr
    data = result.json()
    argv = data["launch"]["argv"]
    serve_at = argv.index("serve")
    expected = ["--kv-cache-memory-bytes" if a == "--kv-cache-memory" else a for a in RECIPE["launch"][2:]]
    assert argv[serve_at + 1 :] == expected
    assert data["values"]["CHAT_TEMPLATE"] == {
        "value": "/opt/glm53/configs/chat-template-bounded.jinja",
        "origin": "set",
        "source": "--set",
    }
    assert data["values"]["MAX_MODEL_LEN"]["origin"] == "profile"
    assert data["flag_check"]["checked"] is False


def test_dry_run_human_output_shows_command_env_and_origins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MAX_NUM_SEQS", "2")
    result = run_glm53(
        "serve",
        "--profile",
        "cpu-tiny",
        "--dry-run",
        "--skip-flag-check",
        "--port",
        "8123",
    )
    assert result.code == 0, result.stderr
    assert "VLLM_CPU_KVCACHE_SPACE=1" in result.stdout and "cpu-tiny.env:" in result.stdout
    assert "--max-num-seqs 2" in result.stdout and "environment" in result.stdout
    assert "--port 8123" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--profile", "agent-265k", "--dry-run"), "Invalid value for '--profile'"),  # a usage error: the choices
        (
            ("--profile", "cpu-tiny", "--dry-run", "--set", "MAX_MODEL_LENGTH=8"),
            "MAX_MODEL_LEN",
        ),
        (("--profile", "cpu-tiny"), "needs the model directory"),
        (
            ("--profile", "cpu-tiny", "--model-dir", "/nonexistent/model"),
            "--model-dir /nonexistent/model does not exist",
        ),
        (("--profile", "cpu-tiny", "--dry-run", "--host", "0.0.0.0"), "--listen-all"),
        (
            (
                "--profile",
                "cpu-tiny",
                "--dry-run",
                "--api-key-file",
                "/nonexistent/key",
            ),
            "--api-key-file",
        ),
    ],
)
def test_bad_input_exits_2(args: tuple[str, ...], message: str) -> None:
    result = run_glm53("serve", *args)
    assert result.code == 2, result.stderr
    assert message in result.stderr


def test_unverified_model_dir_exits_2_before_anything_starts(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    result = run_glm53(
        "serve",
        "--profile",
        "cpu-tiny",
        "--model-dir",
        str(model),
        "--skip-flag-check",
        "--port",
        str(free_port()),
    )
    assert result.code == 2
    assert "preflight failed" in result.stderr and "model verified" in result.stderr
    assert "glm53 model lock" in result.stderr


def test_port_in_use_exits_2(tmp_path: Path) -> None:
    model = _locked_dir(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_glm53(
            "serve",
            "--profile",
            "cpu-tiny",
            "--model-dir",
            str(model),
            "--port",
            str(port),
            "--skip-flag-check",
        )
    assert result.code == 2
    assert f"127.0.0.1:{port} in use" in result.stderr and "--port" in result.stderr


def test_memlock_too_low_exits_3(tmp_path: Path) -> None:
    # The real resource limit, lowered in the child: the GPU profile pins host memory and must refuse. The
    # host cannot do it (exit 3), and one run names every problem: no GPU here, too little memlock.
    model = _locked_dir(tmp_path)
    script = Path(sys.executable).with_name("glm53")

    def lower_memlock() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))

    result = subprocess.run(
        [
            str(script),
            "serve",
            "--profile",
            "agent-256k",
            "--model-dir",
            str(model),
            "--skip-flag-check",
            "--port",
            str(free_port()),
        ],
        check=False,
        capture_output=True,
        text=True,
        preexec_fn=lower_memlock,
        timeout=120,
    )
    assert result.returncode == 3
    assert "memlock: 0.1 MiB; pinned host expert pools need unlimited" in result.stderr
    assert "gpus: no NVIDIA GPU" in result.stderr
    assert "ulimit -l unlimited" in result.stderr


def test_demo_refuses_to_replace_a_directory_that_is_not_its_model(
    tmp_path: Path,
) -> None:
    other = tmp_path / "precious"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}\n')
    result = run_glm53("demo", "--prepare-only", "--rebuild", "--model-dir", str(other))
    assert result.code == 2 and "not the tiny demo model" in result.stderr
    assert (other / "config.json").read_text() == '{"model_type": "llama"}\n'
    # Without --rebuild it is not locked and served as the demo either.
    plain = run_glm53("demo", "--prepare-only", "--model-dir", str(other))
    assert plain.code == 2 and not (other / "checkpoint.lock.json").exists()


@pytest.mark.slow
def test_flags_are_checked_by_vllms_own_parser() -> None:
    pytest.importorskip("vllm")
    from glm53.errors import BadInput
    from glm53.serve.engines.vllm.flags import check_flags

    argv = [
        "vllm",
        "serve",
        *[("--kv-cache-memory-bytes" if a == "--kv-cache-memory" else a) for a in RECIPE["launch"][2:]],
    ]
    check = check_flags(argv, use_cache=False)
    assert check.checked and check.vllm_version is not None and "0.32" in check.vllm_version
    # The recipe's own spelling is rejected by name, with vLLM 0.32's spelling suggested.
    with pytest.raises(BadInput) as err:
        check_flags(["vllm", "serve", *RECIPE["launch"][2:]], use_cache=False)
    assert "--kv-cache-memory" in err.value.message and "--kv-cache-memory-bytes" in (err.value.fix or "")
    with pytest.raises(BadInput, match="offload-backend"):
        check_flags(["vllm", "serve", "/m", "--offload-backend", "pinned"], use_cache=False)
    with pytest.raises(BadInput, match="max-model-len"):
        check_flags(["vllm", "serve", "/m", "--max-model-len", "lots"], use_cache=False)


@pytest.mark.slow
def test_dry_run_checks_flags_for_the_gpu_profile_without_a_gpu() -> None:
    pytest.importorskip("vllm")
    script = Path(sys.executable).with_name("glm53")
    result = subprocess.run(
        [str(script), "serve", "--profile", "agent-256k", "--dry-run", "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["flag_check"]["checked"] is True
    argv = data["launch"]["argv"]
    assert argv[argv.index("--quantization") + 1] == "exl3"
    bad = subprocess.run(
        [
            str(script),
            "serve",
            "--profile",
            "cpu-tiny",
            "--dry-run",
            "--set",
            "DTYPE=float64x",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "--dtype" in bad.stderr


def test_dry_run_names_a_missing_model_dir_and_the_placeholder(tmp_path: Path) -> None:
    gone = tmp_path / "srv" / "models" / "glm53"
    shown = run_glm53("serve", "--profile", "cpu-tiny", "--model-dir", str(gone), "--dry-run", "--skip-flag-check")
    assert shown.code == 0, shown.stderr
    assert f"--model-dir {gone} does not exist: a start would stop here (exit 2)" in shown.stderr
    assert "glm53 model download" in shown.stderr
    placeholder = run_glm53("serve", "--profile", "cpu-tiny", "--dry-run", "--skip-flag-check", "--json")
    assert placeholder.code == 0
    assert "no --model-dir: the command shows the placeholder /model" in placeholder.stderr
    assert "/model" in placeholder.json()["launch"]["argv"]
    start = run_glm53("serve", "--profile", "cpu-tiny", "--model-dir", str(gone))
    assert start.code == 2 and f"--model-dir {gone} does not exist" in start.stderr
