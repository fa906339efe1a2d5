"""A GPU profile served without --plan-env is planned on the host first, as the recipe's entrypoint did."""

from __future__ import annotations

from pathlib import Path

from glm53.cli.serve import ServeRequest, plan_on_this_host, prepare
from glm53.host.topology import parse_cpu_list
from glm53.plan.planner import GpuSpec
from glm53.serve.profiles import load_profile

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
GIB = 2**30
RTX_3090 = 24 * GIB


def test_the_recipe_rig_plan_layers_over_the_profile(tmp_path: Path) -> None:
    profile = load_profile("agent-256k", environ={})
    gpus = [GpuSpec(index=i, name="NVIDIA GeForce RTX 3090", total_bytes=RTX_3090) for i in range(2)]
    values, plan_input = plan_on_this_host(profile, None, gpus=gpus, root=HOSTS / "threadripper-5975wx-cgv2")

    planned = {key: value for key, value, _ in values}
    assert {source for _, _, source in values} == {"plan (this host)"}
    # The planner's figures replace the profile's recipe defaults (CPU_OFFLOAD_GB=64, EXL3_PINNED_FRAC=0.2).
    assert planned["CPU_OFFLOAD_GB"] != profile.value("CPU_OFFLOAD_GB")
    assert int(planned["KV_CACHE_MEMORY_BYTES"]) > 0
    layers = planned["EXL3_LRU_CAPACITY_PLAN"].split(",")
    assert len(layers) == 42 and layers[0].startswith("3:")

    spec, _, layered = prepare(ServeRequest(model_dir=tmp_path), dry_run=True, plan_layer=(values, plan_input))
    assert layered.settings["CPU_OFFLOAD_GB"].origin == "plan"
    argv = spec.argv
    assert argv[argv.index("--cpu-offload-gb") + 1] == planned["CPU_OFFLOAD_GB"]
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == planned["KV_CACHE_MEMORY_BYTES"]
    assert spec.env["EXL3_LRU_CAPACITY_PLAN"] == planned["EXL3_LRU_CAPACITY_PLAN"]
    # Serving CPUs: the published split of this Threadripper (pool cores' SMT siblings left out).
    assert spec.cpu_affinity == list(parse_cpu_list("0-33,40-41,48-49,56-57", what="expected"))
    assert plan_input.env["HYBRID_MAIN_CPUS"] == "0-33,40-41,48-49,56-57"
