"""ExLlamaV3's routing, recorded inside the engine's own process while it serves or generates.

`glm53 serve --capture-routing DIR` starts TabbyAPI as
    PYTHON -m glm53.serve.engines.exllamav3.routing --out DIR -- TABBYAPI/main.py --config RUN_DIR/config.yml
which installs the recorder and then runs TabbyAPI's main.py as `__main__`, unchanged.

The hooks, on ExLlamaV3 1.4.6 (499890c), are installed on its classes as soon as the program imports
`exllamav3` (not before: TabbyAPI sets torch's allocator before it imports torch), so before any model exists:
- `BlockSparseMLP.__init__`: each MoE layer's `routing_fn` (modules/block_sparse_mlp.py:604-609, called at
  :1017, before the split's map kernel rewrites the ids in place) is wrapped to copy the router ids of every
  forward call, except the autosplit measuring passes made while loading (`params["autosplit_measure"]`);
- `block_sparse_mlp_cpu.run_pending_swap_sweeps` (its callers, `_split_swap_tick` and
  `Generator.on_queue_drained`, look it up by name when they run): wrapped to note the forward pass each
  sweep came before, whether it ran inline, and the swaps each split layer made;
- `Generator.on_queue_drained`: after it (and any sweep it ran), the pass is noted as a drain and the files are
  written: DIR/routing.npz (the decode steps, a glm53 routing trace) and, where the dynamic split runs,
  DIR/capture.npz (`glm53.plan.exllamav3.capture`, with the engine's placement at that moment). Both are replaced
  atomically at every drain, so a server stopped while idle leaves a complete record.

The first MoE layer to route runs in every forward pass (prefill stops at the last layer's attention, never
before the first), so its calls number the passes. Only torch and ExLlamaV3 are imported here, and only when the
recorder is installed.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from glm53.errors import BadInput
from glm53.fsutil import atomic_write_bytes
from glm53.plan.cache.policies import INLINE_SWEEP_INTERVALS, SWAP_FLOOR, SWAP_HYSTERESIS, SWAP_INTERVAL, SWAP_MAX
from glm53.plan.exllamav3.capture import CapturedLayer, Exl3Capture, decode_trace, save_capture
from glm53.plan.exllamav3.expert_cache import module_layer
from glm53.plan.routing.traces import write_trace

CAPTURE_NAME = "capture.npz"
TRACE_NAME = "routing.npz"


def _swap_settings() -> tuple[int, float, float, int]:
    """Interval, hysteresis, floor and swap cap, read as block_sparse_mlp_cpu.py reads them: from the
    environment, at the moment they apply."""

    def number(name: str, default: float) -> float:
        return float(os.environ.get(name, default))

    return (
        int(number("EXL3_MOE_CPU_SWAP_INTERVAL", SWAP_INTERVAL)),
        number("EXL3_MOE_CPU_SWAP_HYST", SWAP_HYSTERESIS),
        number("EXL3_MOE_CPU_SWAP_FLOOR", SWAP_FLOOR),
        int(number("EXL3_MOE_CPU_SWAP_MAX", SWAP_MAX)),
    )


class RoutingRecorder:
    """What the engine routed and how its dynamic split moved, gathered from the hooks."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.first: str | None = None  # the key of the first MoE layer to route: its calls number the passes
        self.passes = 0
        self.calls: dict[str, list[Any]] = {}  # key -> router ids per call, on the host (numpy)
        # key -> copies on the device, in stream order (no sync per layer); moved to `calls` at the next drain
        self.on_device: dict[str, list[Any]] = {}
        self.call_index: dict[str, list[int]] = {}
        self.experts: dict[str, int] = {}
        self.registry: list[Any] = []  # ExLlamaV3's sweep registry (load order), seen at the first sweep
        self.sweep_calls: list[int] = []
        self.sweep_inline: list[bool] = []
        self.sweep_swaps: list[dict[str, int]] = []
        self.sweep_seconds: list[float] = []
        self.drained_after: list[int] = []
        self.settings: tuple[int, float, float, int] | None = None

    def routed(self, key: str, experts: int, selected: Any) -> None:
        with self.lock:
            if self.first is None:
                self.first = key
            if key == self.first:
                self.passes += 1
            self.on_device.setdefault(key, []).append(selected.detach().clone())
            self.call_index.setdefault(key, []).append(self.passes - 1)
            self.experts[key] = experts

    def swept(self, infer_params: Any, sweep: Callable[[Any], None]) -> None:
        pending = bool(getattr(infer_params, "moe_cpu_swap_pending", False))
        registry = list(getattr(infer_params, "moe_cpu_swap_modules", None) or [])
        settings = _swap_settings()
        interval = settings[0]
        # _split_swap_tick sweeps inline only once its ticks reach 4 x interval, inside the first split layer's
        # submit of a pass that has routed but is not yet counted; a drained sweep runs between passes
        inline = bool(registry) and registry[0]._swap_tick_count >= INLINE_SWEEP_INTERVALS * interval
        before = [module._split_map.clone() for module in registry]
        if pending:
            _synchronize()  # the sweep's own time: the queued forward work finished first
        started = time.perf_counter()
        sweep(infer_params)
        if not pending:
            return
        _synchronize()
        seconds = time.perf_counter() - started
        with self.lock:
            self.registry = registry
            self.settings = settings
            self.sweep_calls.append(self.passes - 1 if inline else self.passes)
            self.sweep_inline.append(inline)
            self.sweep_seconds.append(seconds)
            self.sweep_swaps.append(
                {
                    module.key: int((module._split_map != old).sum().item()) // 2
                    for module, old in zip(registry, before, strict=True)
                }
            )

    def drained(self, infer_params: Any) -> None:
        with self.lock:
            if self.first is None:
                return
            self.drained_after.append(self.passes - 1)
            if not self.registry:
                self.registry = list(getattr(infer_params, "moe_cpu_swap_modules", None) or [])
            for key, copies in self.on_device.items():
                self.calls.setdefault(key, []).extend(copy.cpu().numpy() for copy in copies)
                copies.clear()
            try:
                self.write()
            except BadInput as exc:  # a record that cannot be written must not stop the server
                print(f"glm53 routing capture: {exc}", file=sys.stderr, flush=True)

    def capture(self) -> Exl3Capture:
        import numpy as np  # heavy: only inside the engine's process

        ran = sorted(self.calls, key=module_layer)
        layers = tuple(
            CapturedLayer(
                module_layer(key),
                np.concatenate(self.calls[key]).astype(np.int16),
                np.repeat(np.array(self.call_index[key], dtype=np.int64), [int(t.shape[0]) for t in self.calls[key]]),
            )
            for key in ran
        )
        split = [module for module in self.registry if module.key in self.calls]
        experts = self.experts[ran[0]]
        interval, hysteresis, floor, max_swaps = self.settings or _swap_settings()
        return Exl3Capture(
            experts=experts,
            interval=interval,
            hysteresis=hysteresis,
            floor=floor,
            max_swaps=max_swaps,
            calls=self.passes,
            drained_after=tuple(self.drained_after),
            layers=layers,
            split_layers=tuple(module_layer(module.key) for module in split),
            cpu_experts=tuple(experts - int(module.cpu_split_first) for module in split),
            sweep_calls=tuple(self.sweep_calls),
            sweep_inline=tuple(self.sweep_inline),
            sweep_swaps=np.array(
                [[row.get(module.key, 0) for module in split] for row in self.sweep_swaps], dtype=np.int64
            ).reshape(len(self.sweep_swaps), len(split)),
            engine_cpu=np.array(
                [module._split_map.cpu().numpy() >= int(module.cpu_split_first) for module in split], dtype=np.bool_
            ).reshape(len(split), experts),
            sweep_seconds=tuple(self.sweep_seconds),
        )

    def write(self) -> None:
        """Both files, each replaced atomically; the trace once a decode step has been routed."""
        capture = self.capture()
        if capture.split_layers:
            atomic_write_bytes(self.out / CAPTURE_NAME, save_capture(capture))
        write_trace(self.out / TRACE_NAME, decode_trace(capture))


def _synchronize() -> None:
    """Wait for the device's queued work, where the engine runs on CUDA (torch is already loaded by then)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then` right after the package `name` is first imported, by whoever imports it.

    TabbyAPI chooses torch's allocator (PYTORCH_ALLOC_CONF) before it imports torch, so the recorder must not
    import torch (which ExLlamaV3 does) any earlier than TabbyAPI itself does. TabbyAPI also asks
    `importlib.util.find_spec("exllamav3")` whether it is installed (common/optional_dependencies.py) without
    importing it, so the finder stays until the package really executes."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then
        self.searching = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self.searching:
            return None
        self.searching = True  # the search below asks every finder again, this one included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                self.then()

        loader.exec_module = exec_module
        return spec


def after_import(package: str, then: Callable[[], None]) -> None:
    """Run `then` now if `package` is imported already, else right after the program first imports it."""
    if package in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(package, then))


def install(out: Path) -> RoutingRecorder:
    """Hook ExLlamaV3's classes (see the module's docstring) once it is imported; every model built afterwards
    is recorded."""
    recorder = RoutingRecorder(out)
    after_import("exllamav3", lambda: _hook(recorder))
    return recorder


def _hook(recorder: RoutingRecorder) -> None:
    from exllamav3.generator.generator import Generator  # heavy: the engine, inside its own process
    from exllamav3.modules import block_sparse_mlp_cpu  # heavy: the engine
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP  # heavy: the engine

    original_init = BlockSparseMLP.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        routing_fn = getattr(self, "routing_fn", None)
        if routing_fn is None:
            return

        def recorded(bsz: Any, cfg: Any, y: Any, params: dict[str, Any]) -> Any:
            selected, weights = routing_fn(bsz, cfg, y, params)
            if not params.get("autosplit_measure"):
                recorder.routed(self.key, int(self.num_experts), selected)
            return selected, weights

        self.routing_fn = recorded

    original_sweep = block_sparse_mlp_cpu.run_pending_swap_sweeps
    original_drained = Generator.on_queue_drained

    def on_queue_drained(self: Any) -> None:
        original_drained(self)
        recorder.drained(self.model.config.infer_params)

    BlockSparseMLP.__init__ = init  # type: ignore[method-assign]
    block_sparse_mlp_cpu.run_pending_swap_sweeps = lambda infer_params: recorder.swept(infer_params, original_sweep)
    Generator.on_queue_drained = on_queue_drained  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glm53.serve.engines.exllamav3.routing",
        description="Run a Python program (TabbyAPI's main.py) with ExLlamaV3's routing recorded into --out.",
    )
    parser.add_argument("--out", type=Path, required=True, help="Directory for routing.npz and capture.npz.")
    parser.add_argument("program", help="The Python file to run as __main__ (TabbyAPI's main.py).")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="Its arguments.")
    parsed = parser.parse_args(argv)
    args = parsed.args
    parsed.out.mkdir(parents=True, exist_ok=True)
    install(parsed.out)
    program = os.path.abspath(parsed.program)
    sys.argv = [program, *args]
    sys.path.insert(0, os.path.dirname(program))  # as `python main.py` would: TabbyAPI imports its own packages
    runpy.run_path(program, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
