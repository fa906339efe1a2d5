"""glm53's GPU expert cache (pkgs/exllamav3/expert-cache) inside ExLlamaV3's own process, as TabbyAPI serves.

`glm53 serve` with EXPERT_CACHE=1 starts TabbyAPI as
    PYTHON -m glm53.serve.engines.exllamav3.expert_cache --report RUN_DIR/expert-cache.json
        [--capture DIR] TABBYAPI/main.py --config RUN_DIR/config.yml
which hooks ExLlamaV3 1.4.6's classes once the program imports `exllamav3` (as the routing recorder does,
`glm53.serve.engines.exllamav3.routing`; with --capture both run) and then runs main.py as `__main__`, unchanged:

- at a MoE layer's first one-token pass (its pointer tables exist and a deferred load has filled its experts),
  the layer gets a cache of EXPERT_CACHE_PINNED + EXPERT_CACHE_WINDOW + top_k slots: a page-locked, mapped host
  pool holding every routed expert once (gate|up|down trellis), the slots on the layer's GPU, and the lookup's
  directory. The pinned slots hold the layer's hottest experts by EXPERT_CACHE_STATS (`{module key: [count per
  expert]}`). EXPERT_CACHE_POLICY says what the window keeps (pkgs/exllamav3/expert-cache/policy.cuh): lru
  (default), or frequency (the experts of the last EXPERT_CACHE_RECENT steps, then the highest counts decayed
  by half every EXPERT_CACHE_HALF_LIFE steps), the rules glm53's simulator replays.
- `routing_fn`: after the router of a one-token pass, `glm53_expert_cache.lookup` rewrites the layer's pointer
  tables (hits -> their slot, misses -> a newly admitted slot, evicted experts -> home) and `fetch` copies the
  misses from the host pool on a promotion stream that the layer's experts then wait for. No host sync: the
  engine's graphs read the rewritten tables. Prefill (several rows) reads the same tables; every slot holds its
  expert's exact bytes, so the output is the all-resident model's.
- `Generator.on_queue_drained`: the hit, miss and overflow counts of every layer go to --report (JSON, replaced
  atomically) and one line to stderr.

EXPERT_CACHE_EXPERTS says where the experts' home copies are. `gpu` (default): ExLlamaV3's loader is unchanged
and every routed expert is loaded to the GPU as well; the host pool is filled from those copies at the layer's
first decode step. `host` (the VRAM the cache saves): the loader reads each routed expert's trellis from the
checkpoint straight into its layer's host pool and never allocates it on a GPU. Every layer's expert tensors and
home table entries address one staging arena a GPU (one layer's experts), which `HostExperts.stage` refills
from the layer's host pool before any pass the cache does not serve (prefill, several sequences at once, the
loader's own measuring passes), on the engine's stream, so those passes read exactly the checkpoint's bytes.
Only torch, ExLlamaV3 and the cache's extension are imported, and only in that process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import runpy
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.errors import BadInput
from glm53.fsutil import atomic_write_bytes
from glm53.plan.cache.policies import DEFAULT_HALF_LIFE, DEFAULT_RECENT, growth_rate
from glm53.serve.engines.exllamav3 import routing
from glm53.serve.engines.exllamav3.routing import after_import

REPORT_NAME = "expert-cache.json"
EXTENSION = "glm53_expert_cache"
# The lookup this runner needs (API_VERSION in expert_cache.cu: 2 took the policy arguments, 3 returns a freed
# expert's table entries home at the next lookup), found as text in the built module.
EXTENSION_API = 3
EXTENSION_MARKER = f"<glm53_expert_cache api {EXTENSION_API}>".encode()


POLICIES = ("lru", "frequency")  # policy.cuh's POLICY_LRU, POLICY_FREQUENCY, in that order
HOMES = ("gpu", "host")  # EXPERT_CACHE_EXPERTS: where the routed experts' home copies are


@dataclass(frozen=True)
class CacheSettings:
    """The cache of every MoE layer: `pinned` slots of its hottest experts and a `window` beside them, kept by
    `policy` (lru, or frequency with `recent` and `half_life`)."""

    window: int
    pinned: int
    stats: Path | None
    policy: str = "lru"
    recent: int = DEFAULT_RECENT
    half_life: float = DEFAULT_HALF_LIFE
    experts: str = "gpu"  # HOMES

    @property
    def rate(self) -> float:
        """The frequency policy's growth per step, computed as the simulator computes it."""
        return growth_rate(self.half_life)


def cache_settings(env: Mapping[str, str]) -> CacheSettings | None:
    """The cache's settings from the engine's environment (the profile's keys); None when EXPERT_CACHE is not 1.
    A setting the cache cannot run is BadInput naming the key."""
    if env.get("EXPERT_CACHE", "0") in ("", "0"):
        return None
    if env["EXPERT_CACHE"] != "1":
        raise BadInput(f"EXPERT_CACHE={env['EXPERT_CACHE']} is neither 0 nor 1", fix="set EXPERT_CACHE=1 or 0")

    def count(key: str, default: int | None = None) -> int:
        raw = env.get(key, "")
        if raw == "" and default is not None:
            return default
        if raw == "":
            raise BadInput(
                f"EXPERT_CACHE=1 needs {key}",
                fix=f"plan it (`glm53 plan host --profile exl3-... --expert-cache`) or --set {key}=N",
            )
        if not (raw.isascii() and raw.isdigit()):
            raise BadInput(f"{key}={raw} is not a count of slots", fix=f"--set {key}=N with N >= 0")
        return int(raw)

    window, pinned = count("EXPERT_CACHE_WINDOW"), count("EXPERT_CACHE_PINNED", default=0)
    if window + pinned == 0:
        raise BadInput(
            "EXPERT_CACHE_WINDOW=0 and EXPERT_CACHE_PINNED=0 leave the cache no resident slot",
            fix="give the window slots (the planner sizes it from the GPUs' memory), or set EXPERT_CACHE=0",
        )
    stats = Path(env["EXPERT_CACHE_STATS"]) if env.get("EXPERT_CACHE_STATS") else None
    policy = env.get("EXPERT_CACHE_POLICY") or "lru"
    if policy not in POLICIES:
        raise BadInput(
            f"EXPERT_CACHE_POLICY={policy} is not one of {', '.join(POLICIES)}", fix="--set EXPERT_CACHE_POLICY=lru"
        )
    if policy == "frequency" and pinned:
        raise BadInput(
            f"EXPERT_CACHE_POLICY=frequency with EXPERT_CACHE_PINNED={pinned}: the frequency policy keeps its hot "
            "experts by their counts and pins no slots",
            fix="EXPERT_CACHE_PINNED=0 (give its slots to EXPERT_CACHE_WINDOW), or EXPERT_CACHE_POLICY=lru",
        )
    recent = count("EXPERT_CACHE_RECENT", default=DEFAULT_RECENT)
    half_life = _half_life(env.get("EXPERT_CACHE_HALF_LIFE", ""))
    if policy == "lru":
        for key in ("EXPERT_CACHE_RECENT", "EXPERT_CACHE_HALF_LIFE"):
            if env.get(key):
                raise BadInput(
                    f"{key} is a setting of the frequency policy", fix=f"EXPERT_CACHE_POLICY=frequency, or unset {key}"
                )
    if pinned and stats is None:
        raise BadInput(
            f"EXPERT_CACHE_PINNED={pinned} needs EXPERT_CACHE_STATS: the pinned experts are the hottest of its counts",
            fix="plan with a trace (`glm53 plan host --expert-cache --stats FILE --out DIR`) or EXPERT_CACHE_PINNED=0",
        )
    if stats is not None:
        read_rankings(stats)  # refused now, not when the model loads
    experts = env.get("EXPERT_CACHE_EXPERTS") or "gpu"
    if experts not in HOMES:
        raise BadInput(
            f"EXPERT_CACHE_EXPERTS={experts} is not one of {', '.join(HOMES)}",
            fix="--set EXPERT_CACHE_EXPERTS=host (experts in host memory only) or gpu (ExLlamaV3's own loader)",
        )
    return CacheSettings(
        window=window, pinned=pinned, stats=stats, policy=policy, recent=recent, half_life=half_life, experts=experts
    )


def _half_life(raw: str) -> float:
    if raw == "":
        return DEFAULT_HALF_LIFE
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise BadInput(
            f"EXPERT_CACHE_HALF_LIFE={raw} is not a positive number of steps",
            fix=f"--set EXPERT_CACHE_HALF_LIFE=N with N > 0 (default {DEFAULT_HALF_LIFE:g})",
        )
    return value


def read_rankings(path: Path) -> dict[str, list[int]]:
    """Each MoE module's experts, hottest first, from a counts file (`{module key: [count per expert]}`, the
    format of ExLlamaV3's EXL3_MOE_CPU_SPLIT_STATS, which `glm53 plan host --stats` writes)."""
    fix = "name the counts file `glm53 plan host --stats TRACE --out DIR` wrote (DIR/exl3-split-stats.json)"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: bad JSON, or an integer too long
        raise BadInput(f"EXPERT_CACHE_STATS {path}: {exc}", fix=fix) from exc
    if not isinstance(data, dict) or not data:
        raise BadInput(f"EXPERT_CACHE_STATS {path} is not a JSON object of MoE module keys to counts", fix=fix)
    rankings = {}
    for key, counts in data.items():
        numbers = _finite_counts(counts)
        if numbers is None:
            raise BadInput(f"EXPERT_CACHE_STATS {path}: {key!r} is not a list of finite counts", fix=fix)
        rankings[str(key)] = sorted(range(len(numbers)), key=lambda e: (-numbers[e], e))
    return rankings


def _finite_counts(counts: object) -> list[float] | None:
    """The counts as floats, or None when they are not a non-empty list of finite numbers."""
    if not isinstance(counts, list) or not counts:
        return None
    numbers = []
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int | float):
            return None
        try:
            number = float(count)
        except OverflowError:  # an integer no float holds
            return None
        if not math.isfinite(number):
            return None
        numbers.append(number)
    return numbers


class LayerExpertCache:
    """One MoE layer's cache: host pool, slots, directory, and the layer's live pointer tables."""

    def __init__(
        self, mlp: Any, settings: CacheSettings, ranking: Sequence[int], ext: Any, host: HostLayer | None = None
    ) -> None:
        """`host`: the layer's experts are host-resident (EXPERT_CACHE_EXPERTS=host) and this is their pool;
        without it the pool is filled from the experts' GPU copies."""
        import torch  # heavy: only inside the engine's process

        self.ext = ext
        experts, top_k = int(mlp.num_experts), int(mlp.num_experts_per_tok)
        gate, up, down = (m.linears for m in (mlp.multi_gate, mlp.multi_up, mlp.multi_down))
        parts = [gate[0].inner.trellis, up[0].inner.trellis, down[0].inner.trellis]
        sizes = [t.numel() * t.element_size() for t in parts]
        self.offsets = [0, sizes[0], sizes[0] + sizes[1]]
        self.slot_bytes = sum(sizes)
        device = parts[0].device
        if host is not None and (host.offsets, host.slot_bytes) != (self.offsets, self.slot_bytes):
            raise RuntimeError(f"{mlp.key}: the host pool's expert layout differs from the layer's tensors")
        self.pinned, self.window, self.top_k = settings.pinned, settings.window, top_k
        if self.pinned + self.window > experts:
            raise BadInput(
                f"{mlp.key}: EXPERT_CACHE_PINNED + EXPERT_CACHE_WINDOW = {self.pinned + self.window} slots for "
                f"{experts} experts",
                fix=f"at most {experts} resident slots a layer",
            )
        slots = self.pinned + self.window + top_k
        self.tables = [mlp.multi_gate.ptrs_trellis, mlp.multi_up.ptrs_trellis, mlp.multi_down.ptrs_trellis]
        self.home = [t.clone() for t in self.tables]
        # every expert once, gate|up|down, exact size (no power-of-two rounding), page-locked and mapped
        self.owns_host = host is None
        if host is not None:
            self.host, self.host_address = host.pool, host.address
        else:
            self.host = torch.empty((experts, self.slot_bytes), dtype=torch.uint8)
            for e in range(experts):
                row = [gate[e].inner.trellis, up[e].inner.trellis, down[e].inner.trellis]
                self.host[e].copy_(torch.cat([t.contiguous().view(torch.uint8).flatten() for t in row]).cpu())
            self.host_address = ext.host_register(self.host)
        self.pool = torch.empty((slots, self.slot_bytes), dtype=torch.uint8, device=device)
        self.slot_of = torch.full((experts,), -1, dtype=torch.int32, device=device)
        self.expert_of = torch.full((slots,), -1, dtype=torch.int32, device=device)
        self.stamp = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.state = torch.zeros(ext.STATE_FIELDS, dtype=torch.long, device=device)
        self.miss_e = torch.zeros(top_k, dtype=torch.int32, device=device)
        self.miss_s = torch.zeros(top_k, dtype=torch.int32, device=device)
        self.miss_n = torch.zeros(1, dtype=torch.int32, device=device)
        # the frequency policy's decayed counts (then the growth, starting at 1) and each expert's last step
        self.policy = POLICIES.index(settings.policy)
        self.recent, self.rate = settings.recent, settings.rate
        self.score = torch.zeros(experts + 1, dtype=torch.float64, device=device)
        self.score[experts] = 1.0
        self.last = torch.full((experts,), int(ext.NEVER), dtype=torch.long, device=device)
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        for slot, expert in enumerate(list(ranking)[: self.pinned]):
            self.pool[slot].copy_(self.host[expert].to(device))
            self.slot_of[expert] = slot
            self.expert_of[slot] = expert
            for table, offset in zip(self.tables, self.offsets, strict=True):
                table[expert] = self.pool.data_ptr() + slot * self.slot_bytes + offset

    def resolve(self, selected: Any) -> None:
        """Look one step's selections up and copy its misses in before the layer's experts run."""
        import torch  # heavy: only inside the engine's process

        self.ext.lookup(
            selected.contiguous(), self.slot_of, self.expert_of, self.stamp, self.state, self.miss_e, self.miss_s,
            self.miss_n, *self.tables, *self.offsets, self.pool, self.slot_bytes, self.pinned, self.window,
            *self.home, self.policy, self.recent, self.rate, self.score, self.last,
        )  # fmt: skip
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            self.ext.fetch(
                self.miss_e, self.miss_s, self.miss_n, self.state, self.host_address, self.slot_bytes, self.pool,
                self.slot_bytes, self.top_k, 8, 0.0,
            )  # fmt: skip
        main.wait_stream(self.stream)

    def counts(self) -> dict[str, int]:
        state = self.state.tolist()
        return {
            "steps": int(state[self.ext.STATE_STEP]),
            "hits": int(state[self.ext.STATE_HITS]),
            "misses": int(state[self.ext.STATE_MISSES]),
            "overflow": int(state[self.ext.STATE_OVERFLOW]),
        }

    def close(self) -> None:
        if self.owns_host:
            self.ext.host_unregister(self.host)


class HostLayer:
    """One MoE layer's routed experts in host memory only: every expert's gate|up|down trellis read from the
    checkpoint into one page-locked, mapped pool (the cache's host pool), laid out as the cache's slots are."""

    def __init__(self, key: str, experts: int, shapes: Sequence[Sequence[int]], device: Any, ext: Any) -> None:
        import torch  # heavy: only inside the engine's process

        self.key, self.experts, self.shapes, self.device = key, experts, [tuple(s) for s in shapes], device
        self.part_bytes = [math.prod(shape) * 2 for shape in self.shapes]  # int16 trellis
        self.offsets = [0, self.part_bytes[0], self.part_bytes[0] + self.part_bytes[1]]
        self.slot_bytes = sum(self.part_bytes)
        self.pool = torch.empty((experts, self.slot_bytes), dtype=torch.uint8)
        self.address = ext.host_register(self.pool)
        self.ext = ext

    def close(self) -> None:
        self.ext.host_unregister(self.pool)


class HostExperts:
    """EXPERT_CACHE_EXPERTS=host: the routed experts' trellis in host memory only (`HostLayer`, one a MoE layer),
    and one staging arena a GPU, one layer's experts, that the layers' expert tensors address."""

    def __init__(self, ext: Any) -> None:
        self.ext = ext
        self.layers: dict[str, HostLayer] = {}
        self.arenas: dict[int, Any] = {}
        self.files: dict[str, Any] = {}

    def trellis(self, mlp: Any, part: int, expert: int, stc: Any, key: str, device: Any) -> Any:
        """The expert's trellis as the engine will address it (a view of the device's arena), its bytes read from
        the checkpoint into the layer's host pool."""
        import torch  # heavy: only inside the engine's process

        layer = self.layers.get(mlp.key)
        if layer is None:
            shapes = [tensor_header(stc, linears[0].key + ".trellis")[1] for linears in (mlp.gates, mlp.ups, mlp.downs)]
            layer = self.layers[mlp.key] = HostLayer(mlp.key, int(mlp.num_experts), shapes, device, self.ext)
        filename, shape, offset, nbytes = tensor_header(stc, key)
        if tuple(shape) != layer.shapes[part]:
            raise RuntimeError(f"{key}: shape {shape} differs from the layer's {layer.shapes[part]}")
        start = layer.offsets[part]
        handle = self.files.get(filename)
        if handle is None:
            handle = self.files[filename] = open(filename, "rb")  # noqa: SIM115 (kept for the load)
        read_exactly(handle, offset, layer.pool[expert].numpy()[start : start + nbytes])
        arena = self.arena(torch.device(device), layer.experts * layer.slot_bytes)
        begin = expert * layer.slot_bytes + start
        return arena[begin : begin + nbytes].view(torch.int16).view(tuple(shape))

    def arena(self, device: Any, size: int) -> Any:
        import torch  # heavy: only inside the engine's process

        index = _device_index(device)
        arena = self.arenas.get(index)
        if arena is None:
            arena = self.arenas[index] = torch.empty(size, dtype=torch.uint8, device=device)
        if arena.numel() < size:
            raise RuntimeError(f"a MoE layer's experts take {size} bytes, more than the first layer's {arena.numel()}")
        return arena

    def stage(self, key: str) -> None:
        """Before a pass the cache does not serve: the device's arena holds this layer's experts (copied from its
        host pool on the engine's stream, so the pass's kernels read them after the copy)."""
        layer = self.layers.get(key)
        if layer is None:
            return
        # every time, not only when another layer was staged last: a pass captured into a CUDA graph replays
        # this copy, where a skipped one would replay nothing
        self.arenas[_device_index(layer.device)][: layer.pool.numel()].copy_(layer.pool.view(-1), non_blocking=True)

    def drop(self, key: str) -> None:
        """The layer was unloaded: its host pool is released."""
        layer = self.layers.pop(key, None)
        if layer is not None:
            layer.close()


def _device_index(device: Any) -> int:
    import torch  # heavy: only inside the engine's process

    device = torch.device(device)
    if device.type != "cuda":
        return -1  # the engine's experts are on GPUs; a CPU arena only where a test lays one out
    return device.index if device.index is not None else torch.cuda.current_device()


def tensor_header(stc: Any, key: str) -> tuple[str, list[int], int, int]:
    """(file, shape, absolute byte offset, byte size) of an int16 tensor, from ExLlamaV3's parsed safetensors
    headers (SafetensorsCollection.tensor_file_map / file_headers)."""
    filename = stc.tensor_file_map[key]
    header = stc.file_headers[filename]
    entry = header[key]
    begin, end = entry["data_offsets"]
    if entry["dtype"] != "I16" or len(entry["shape"]) != 3 or math.prod(entry["shape"]) * 2 != end - begin:
        raise RuntimeError(f"{key} in {filename}: {entry['dtype']} {entry['shape']} is not an EXL3 trellis")
    return filename, list(entry["shape"]), header["_header_offset"] + begin, end - begin


def read_exactly(handle: Any, offset: int, into: Any) -> None:
    """Fill `into` (a writable buffer) with the file's bytes at `offset`; a short read is an error."""
    view = memoryview(into).cast("B")
    done = 0
    while done < len(view):
        count = os.preadv(handle.fileno(), [view[done:]], offset + done)
        if count <= 0:
            raise RuntimeError(f"{handle.name}: {len(view) - done} bytes missing at offset {offset + done}")
        done += count


class CacheRuntime:
    """Every layer's cache in this process, and its report."""

    def __init__(self, settings: CacheSettings, report: Path, ext: Any) -> None:
        self.settings = settings
        self.report = report
        self.ext = ext
        self.rankings = read_rankings(settings.stats) if settings.stats is not None else {}
        self.host = HostExperts(ext) if settings.experts == "host" else None
        self.layers: dict[str, LayerExpertCache] = {}
        self.skipped: set[str] = set()
        self.lock = threading.Lock()

    def attach(self, mlp: Any) -> LayerExpertCache | None:
        import torch  # heavy: only inside the engine's process

        if mlp.multi_gate is None or mlp.multi_up is None or mlp.multi_down is None:
            # not served through the pointer-table kernels (unquantized, or its experts on the CPU worker)
            self.skipped.add(mlp.key)
            print(f"glm53 expert cache: {mlp.key} has no expert pointer tables; not cached", file=sys.stderr)
            return None
        ranking = self.rankings.get(mlp.key)
        if self.settings.pinned and ranking is None:
            raise BadInput(f"EXPERT_CACHE_STATS {self.settings.stats} has no counts for {mlp.key}")
        host = self.host.layers.get(mlp.key) if self.host is not None else None
        with torch.inference_mode():  # the engine's tables are inference tensors
            cache = LayerExpertCache(mlp, self.settings, ranking or [], self.ext, host)
        with self.lock:
            self.layers[mlp.key] = cache
        return cache

    def detach(self, mlp: Any) -> None:
        cache = self.layers.pop(getattr(mlp, "key", ""), None)
        if cache is not None:
            cache.close()
        if self.host is not None:
            self.host.drop(getattr(mlp, "key", ""))

    def write_report(self) -> dict[str, Any]:
        with self.lock:
            layers = {key: cache.counts() for key, cache in self.layers.items()}
        hits = sum(c["hits"] for c in layers.values())
        misses = sum(c["misses"] for c in layers.values())
        report = {
            "window": self.settings.window,
            "pinned": self.settings.pinned,
            "policy": self.settings.policy,
            "recent": self.settings.recent,
            "half_life": self.settings.half_life,
            "stats": str(self.settings.stats) if self.settings.stats else None,
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else None,
            "layers": layers,
        }
        atomic_write_bytes(self.report, (json.dumps(report, indent=1) + "\n").encode())
        rate = f"{report['hit_rate']:.1%}" if report["hit_rate"] is not None else "-"
        print(f"glm53 expert cache: {len(layers)} layers, {hits} hits, {misses} misses ({rate})", file=sys.stderr)
        return report


def install(settings: CacheSettings, report: Path) -> None:
    """Hook ExLlamaV3 (see the module's docstring) once the program imports it."""

    def hook() -> None:
        # optional: the cache's extension, built ahead beside exllamav3_ext (pkgs/exllamav3/default.nix)
        import glm53_expert_cache  # type: ignore[import-not-found]

        _hook(CacheRuntime(settings, report, glm53_expert_cache))

    after_import("exllamav3", hook)


def _hook(runtime: CacheRuntime) -> None:
    from exllamav3.generator.generator import Generator  # heavy: the engine, inside its own process
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP  # heavy: the engine

    original_init = BlockSparseMLP.__init__
    original_unload = BlockSparseMLP.unload
    original_drained = Generator.on_queue_drained
    host = runtime.host
    if host is not None:
        _hook_loader(host)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        routing_fn = getattr(self, "routing_fn", None)
        if routing_fn is None:
            return
        if host is not None and self.gates and len(self.gates) == len(self.ups) == len(self.downs):
            # the loader reads these experts' trellis into host memory (_hook_loader)
            for part, linears in enumerate((self.gates, self.ups, self.downs)):
                for expert, linear in enumerate(linears):
                    linear.glm53_host_expert = (self, part, expert)

        def routed(bsz: Any, cfg: Any, y: Any, params: dict[str, Any]) -> Any:
            selected, weights = routing_fn(bsz, cfg, y, params)
            served = False
            if selected.shape[0] == 1 and not params.get("autosplit_measure") and selected.is_cuda:
                cache = runtime.layers.get(self.key)
                if cache is None and self.key not in runtime.skipped:
                    # Made at the first decode step, not at load: a deferred load fills the experts' tensors
                    # only after the layer's load returns, so they are read once they hold the checkpoint.
                    cache = runtime.attach(self)
                if cache is not None:
                    cache.resolve(selected)
                    served = True
            if host is not None and not served:
                host.stage(self.key)  # this pass reads the experts' home copies: the layer's, staged
            return selected, weights

        self.routing_fn = routed

    def unload(self: Any) -> None:
        runtime.detach(self)
        original_unload(self)

    def on_queue_drained(self: Any) -> None:
        original_drained(self)
        runtime.write_report()

    BlockSparseMLP.__init__ = init  # type: ignore[method-assign]
    BlockSparseMLP.unload = unload  # type: ignore[method-assign]
    Generator.on_queue_drained = on_queue_drained  # type: ignore[method-assign]


def _hook_loader(host: HostExperts) -> None:
    """EXPERT_CACHE_EXPERTS=host: a routed expert's trellis is read into its layer's host pool, and the engine
    gets a view of the GPU's staging arena in its place (never a GPU copy of its own)."""
    from exllamav3.loader.safetensors import SafetensorsCollection  # heavy: the engine
    from exllamav3.modules.linear import Linear  # heavy: the engine

    original_load_exl3 = Linear.load_exl3
    original_get_tensor = SafetensorsCollection.get_tensor
    loading = threading.local()

    def load_exl3(self: Any, key: str) -> bool:
        target = getattr(self, "glm53_host_expert", None)
        if target is None or self.device is None or str(self.device).startswith("cpu"):
            return bool(original_load_exl3(self, key))
        loading.target = (target, key + ".trellis", self.device)
        try:
            return bool(original_load_exl3(self, key))
        finally:
            loading.target = None

    def get_tensor(self: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        target = getattr(loading, "target", None)
        if target is not None and target[1] == key and key in self.tensor_file_map:
            (mlp, part, expert), _, device = target
            return host.trellis(mlp, part, expert, self, key, device)
        return original_get_tensor(self, key, *args, **kwargs)

    Linear.load_exl3 = load_exl3  # type: ignore[method-assign]
    SafetensorsCollection.get_tensor = get_tensor  # type: ignore[method-assign]


def _stale_extension(origin: str | None) -> str | None:
    """The cache's module file when it was built from sources older than this runner (it lacks
    EXTENSION_MARKER), else None. Read, not imported: importing it loads torch before TabbyAPI chooses torch's
    allocator."""
    if origin is None or not os.path.isfile(origin):
        return None
    with open(origin, "rb") as module:
        return None if EXTENSION_MARKER in module.read() else origin


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glm53.serve.engines.exllamav3.expert_cache",
        description="Run a Python program (TabbyAPI's main.py) with glm53's GPU expert cache in ExLlamaV3 "
        "(settings from EXPERT_CACHE, EXPERT_CACHE_WINDOW, EXPERT_CACHE_PINNED, EXPERT_CACHE_STATS, "
        "EXPERT_CACHE_POLICY, EXPERT_CACHE_RECENT, EXPERT_CACHE_HALF_LIFE).",
    )
    parser.add_argument("--report", type=Path, required=True, help="JSON file for the cache's counts.")
    parser.add_argument("--capture", type=Path, help="Also record ExLlamaV3's routing into this directory.")
    parser.add_argument("program", help="The Python file to run as __main__ (TabbyAPI's main.py).")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="Its arguments.")
    parsed = parser.parse_args(argv)
    try:
        settings = cache_settings(os.environ)
    except BadInput as exc:
        print(f"error: {exc.message}" + (f"\nfix: {exc.fix}" if exc.fix else ""), file=sys.stderr)
        return 2
    # found, not imported: importing it loads torch before TabbyAPI chooses torch's allocator
    spec = importlib.util.find_spec(EXTENSION) if settings is not None else None
    if settings is not None and spec is None:
        print(
            f"error: EXPERT_CACHE=1 and this Python ({sys.executable}) has no {EXTENSION} module\n"
            "fix: build it with pkgs/exllamav3/build_ext.py (`glm53 doctor` says how), or EXPERT_CACHE=0",
            file=sys.stderr,
        )
        return 3
    if spec is not None and (stale := _stale_extension(spec.origin)) is not None:
        print(
            f"error: {stale} was built from older sources than this glm53 (its lookup lacks api "
            f"{EXTENSION_API}: the cache's policies and its freed experts' table entries kept until the next "
            "lookup)\n"
            "fix: rebuild it with pkgs/exllamav3/build_ext.py (`glm53 repro install-engine NEW_DIR` builds both "
            "extensions), or EXPERT_CACHE=0",
            file=sys.stderr,
        )
        return 3
    if settings is not None:
        install(settings, parsed.report)
    if parsed.capture is not None:
        parsed.capture.mkdir(parents=True, exist_ok=True)
        routing.install(parsed.capture)
    program = os.path.abspath(parsed.program)
    sys.argv = [program, *parsed.args]
    sys.path.insert(0, os.path.dirname(program))  # as `python main.py` would: TabbyAPI imports its own packages
    runpy.run_path(program, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
