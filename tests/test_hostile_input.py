"""Hostile and clumsy input to the serving side: pipes and devices where files belong, values out of range,
JSON nested or sized to crash a reader, CPU lists that would fill memory. Each is a clear error (exit 2) that
names the file, key or flag, in well under a second, with no traceback."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.fsutil import parse_json, read_json
from glm53.host.topology import parse_cpu_list
from tests.support.cli import run_glm53


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def _quick(*args: str) -> tuple[int, str]:
    """Run the CLI on a watchdog thread: a read that blocks fails the test instead of hanging it."""
    result: list[tuple[int, str]] = []
    worker = threading.Thread(target=lambda: result.append(_run(*args)), daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(timeout=20)
    assert result, f"glm53 {' '.join(args)} still running after {time.monotonic() - started:.0f} s"
    return result[0]


def _run(*args: str) -> tuple[int, str]:
    outcome = run_glm53(*args)
    assert "Traceback" not in outcome.stderr, outcome.stderr
    return outcome.code, " ".join(outcome.stderr.split())


@pytest.mark.parametrize("flag", ["--env-file", "--api-key-file"])
def test_a_pipe_given_as_a_file_is_refused_at_once(fifo: Path, flag: str) -> None:
    code, message = _quick("serve", "--profile", "cpu-tiny", "--dry-run", "--skip-flag-check", flag, str(fifo))
    assert code == 2 and f"{flag}: {fifo} is not a regular file" in message


def test_a_device_or_a_huge_file_is_not_read_into_memory(tmp_path: Path) -> None:
    code, message = _quick("profile", "check", "--env-file", "/dev/zero")
    assert code == 2 and "--env-file: /dev/zero is not a regular file" in message
    huge = tmp_path / "huge.env"
    with open(huge, "wb") as handle:
        handle.truncate(2 << 20)  # sparse: 2 MiB of zeros, past the 1 MiB an env file may be
    code, message = _quick("profile", "check", "--env-file", str(huge))
    assert code == 2 and "more than the 1,048,576 this takes" in message


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("MAX_MODEL_LEN=-4096", "between 1 and 2,147,483,647"),
        ("MAX_MODEL_LEN=0", "between 1 and"),
        ("MAX_MODEL_LEN=" + "9" * 40, "between 1 and"),
        ("TENSOR_PARALLEL_SIZE=-2", "between 1 and 64"),
        ("GPU_MEMORY_UTILIZATION=nan", "a finite number"),
        ("GPU_MEMORY_UTILIZATION=inf", "a finite number"),
        ("GPU_MEMORY_UTILIZATION=7", "between 0.01 and 1"),
        ("CPU_OFFLOAD_GB=-64", "between 0 and 65,536"),
        ("KV_CACHE_MEMORY_BYTES=0", "between 1 and"),
        ("EXL3_PINNED_FRAC=1.5", "between 0 and 1"),
        ("REASONING_CONFIG=" + "[" * 100_000, "valid JSON"),
    ],
)
def test_profile_values_are_range_checked_at_the_build_time_gate(setting: str, expected: str) -> None:
    code, message = _run("profile", "check", "--set", setting)
    key = setting.split("=", 1)[0]
    assert code == 2 and f"--set {key}" in message and expected in message


def test_a_plan_env_cannot_allocate_four_billion_cpus(tmp_path: Path) -> None:
    plan = tmp_path / "plan.env"
    plan.write_text("HYBRID_MAIN_CPUS=0-4000000000\n")
    code, message = _quick("serve", "--profile", "cpu-tiny", "--dry-run", "--skip-flag-check", "--plan-env", str(plan))
    assert code == 2 and "HYBRID_MAIN_CPUS" in message and "beyond the 8192 CPUs" in message
    with pytest.raises(BadInput, match="not a CPU number"):
        parse_cpu_list("0-²")


def test_json_readers_name_the_file_for_deep_nesting_and_huge_integers(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadInput, match=r"deep\.json: JSON nested too deeply"):
        read_json(deep, what="lock")
    big = tmp_path / "big.json"
    big.write_text('{"size": ' + "9" * 5000 + "}")
    with pytest.raises(BadInput, match=r"big\.json: .*4300 digits"):
        read_json(big, what="lock")
    with pytest.raises(BadInput, match="not UTF-8"):
        parse_json(b'{"a": "\xff"}', what="a server's answer")


def test_listening_everywhere_without_a_key_and_a_group_readable_key_are_warned(tmp_path: Path) -> None:
    listen_all = [
        "serve",
        "--profile",
        "cpu-tiny",
        "--dry-run",
        "--json",
        "--skip-flag-check",
        "--host",
        "0.0.0.0",
        "--listen-all",
    ]
    result = run_glm53(*listen_all)
    assert result.code == 0
    assert any("without an API key" in w for w in result.json()["warnings"])
    assert "without an API key" in " ".join(result.stderr.split())
    key = tmp_path / "key"
    key.write_text("k\n")
    key.chmod(0o640)
    result = run_glm53(*listen_all, "--api-key-file", str(key))
    assert result.code == 0
    assert result.json()["warnings"] == [
        f"--api-key-file: {key} is readable by its group; chmod 600 {key} keeps the key to its owner"
    ]


def test_clumsy_paths_and_addresses_are_named(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    code, message = _run("demo", "--prepare-only", "--model-dir", str(a_file))
    assert code == 2 and f"--model-dir: {a_file} is not a directory" in message
    bad = tmp_path / "plan.env"
    bad.write_bytes(b"\xff\xfe")
    code, message = _run("serve", "--profile", "cpu-tiny", "--dry-run", "--plan-env", str(bad))
    assert code == 2 and f"--plan-env: {bad} is not UTF-8 text" in message
    code, message = _run("doctor", "--port", "70000")
    assert code == 2 and "--port" in message
    # The IPv4 loopback spelled as IPv6 is loopback; a link-local address is not.
    assert _run("profile", "check", "--host", "::ffff:127.0.0.1")[0] == 0
    code, message = _run("profile", "check", "--host", "fe80::1%eth0")
    assert code == 2 and "--listen-all" in message
