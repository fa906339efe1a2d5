"""ExLlamaV3's dynamic CPU split held against the engine's own record of a run.

A capture (`tools/exl3-routing-capture.py`, made while ExLlamaV3 1.4.6 generates on a GPU) keeps, for every MoE
layer, the router ids of each forward call it ran and the call's index among the run's forward passes; for every
sweep, the forward pass it came before, whether it ran inline, and the swaps each split layer made; for every
split layer, the placement the engine held at the end. Layers do not all route every call: ExLlamaV3's prefill
stops at the last layer's attention, so the last layer's experts see decode steps only.

`compare_capture` replays the engine's rule over exactly those tokens: each layer's counts take its own calls
before each sweep, the layers take their turns in the engine's order under one swap budget (`sweep_layer`), and
the trigger (`sweep_triggers`) is predicted from the calls and the drains alone. Every comparison is exact:
the swaps of each layer at each sweep, the sweeps' calls, and each layer's final CPU-resident set.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from glm53.errors import BadInput
from glm53.plan.cache.policies import sweep_layer, sweep_triggers
from glm53.plan.routing.traces import RoutingTrace

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

CAPTURE_FORMAT = "glm53-exl3-capture"
CAPTURE_VERSION = 1


@dataclass(frozen=True)
class CapturedLayer:
    """One MoE layer's routing: routes (tokens, top_k) in call order, and each token's forward-pass index."""

    layer: int
    routes: NDArray[np.int16]
    call_of_token: NDArray[np.int64]


@dataclass(frozen=True)
class Exl3Capture:
    experts: int
    interval: int
    hysteresis: float
    floor: float
    max_swaps: int
    calls: int  # forward passes of the run
    drained_after: tuple[int, ...]  # the call after which the generator's queue drained (a job ended)
    layers: tuple[CapturedLayer, ...]  # every MoE layer that routed, in load order
    split_layers: tuple[int, ...]  # split layers in the engine's sweep order (its registry: load order)
    cpu_experts: tuple[int, ...]  # per split layer, the routed experts on the CPU
    sweep_calls: tuple[int, ...]  # the forward pass each recorded sweep came before
    sweep_inline: tuple[bool, ...]
    sweep_swaps: NDArray[np.int64]  # (sweeps, split layers): the engine's swaps
    engine_cpu: NDArray[np.bool_]  # (split layers, experts): the engine's placement at the end
    # Wall seconds of each recorded sweep, the device synchronized before and after (empty: not timed)
    sweep_seconds: tuple[float, ...] = ()


class CapturedLayerResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    layer: int
    tokens: int = Field(description="Tokens this layer routed (its prefill tokens and decode steps).")
    engine_cpu: list[int] = Field(description="Router ids the engine held on the CPU at the end.")
    replay_cpu: list[int]
    agree: bool
    engine_swaps: int
    replay_swaps: int


class CaptureComparison(BaseModel):
    """The replay of ExLlamaV3's rule against the engine's record; `agree` needs every part to be exact."""

    model_config = ConfigDict(frozen=True)

    calls: int
    sweeps: int
    trigger_agrees: bool = Field(description="The sweeps predicted from the calls and drains are the recorded.")
    predicted_sweeps: list[tuple[int, bool]]
    recorded_sweeps: list[tuple[int, bool]]
    swaps_agree: bool = Field(description="Every split layer made the replay's swaps at every sweep.")
    engine_swaps: int
    replay_swaps: int
    layers: list[CapturedLayerResult]
    layers_agreeing: int
    agree: bool
    sweep_seconds: float | None = Field(default=None, description="Wall time of all sweeps, where timed.")
    seconds_per_swap: float | None = Field(
        default=None, description="Least-squares slope of a sweep's time over its swaps, where timed."
    )
    seconds_per_sweep: float | None = Field(default=None, description="That fit's intercept: a sweep's own cost.")


def save_capture(capture: Exl3Capture) -> bytes:
    """The capture as .npz bytes: a JSON header and one routes/calls pair per layer."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    header = {
        "format": CAPTURE_FORMAT,
        "version": CAPTURE_VERSION,
        "experts": capture.experts,
        "interval": capture.interval,
        "hysteresis": capture.hysteresis,
        "floor": capture.floor,
        "max_swaps": capture.max_swaps,
        "calls": capture.calls,
        "drained_after": list(capture.drained_after),
        "layers": [layer.layer for layer in capture.layers],
        "split_layers": list(capture.split_layers),
        "cpu_experts": list(capture.cpu_experts),
        "sweep_calls": list(capture.sweep_calls),
        "sweep_inline": list(capture.sweep_inline),
        **({"sweep_seconds": list(capture.sweep_seconds)} if capture.sweep_seconds else {}),
    }
    arrays: dict[str, Any] = {
        "header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
        "sweep_swaps": capture.sweep_swaps.astype(np.int64),
        "engine_cpu": capture.engine_cpu.astype(np.bool_),
    }
    for layer in capture.layers:
        arrays[f"routes_{layer.layer}"] = layer.routes.astype(np.int16)
        arrays[f"calls_{layer.layer}"] = layer.call_of_token.astype(np.int64)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def load_capture(path: Path) -> Exl3Capture:
    """Read a capture written by `save_capture`; anything else is refused naming the file and what is wrong."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        header = json.loads(bytes(arrays["header"].astype(np.uint8)).decode())
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not a readable {CAPTURE_FORMAT} file ({exc})") from exc
    if not isinstance(header, dict) or header.get("format") != CAPTURE_FORMAT:
        raise BadInput(f"{path}: not a {CAPTURE_FORMAT} file", fix="write one with tools/exl3-routing-capture.py")
    if header.get("version") != CAPTURE_VERSION:
        raise BadInput(f"{path}: {CAPTURE_FORMAT} version {header.get('version')!r}, this reads {CAPTURE_VERSION}")
    try:
        layers = tuple(
            CapturedLayer(int(layer), arrays[f"routes_{layer}"], arrays[f"calls_{layer}"].astype(np.int64))
            for layer in header["layers"]
        )
        capture = Exl3Capture(
            experts=int(header["experts"]),
            interval=int(header["interval"]),
            hysteresis=float(header["hysteresis"]),
            floor=float(header["floor"]),
            max_swaps=int(header["max_swaps"]),
            calls=int(header["calls"]),
            drained_after=tuple(int(c) for c in header["drained_after"]),
            layers=layers,
            split_layers=tuple(int(layer) for layer in header["split_layers"]),
            cpu_experts=tuple(int(k) for k in header["cpu_experts"]),
            sweep_calls=tuple(int(c) for c in header["sweep_calls"]),
            sweep_inline=tuple(bool(i) for i in header["sweep_inline"]),
            sweep_swaps=arrays["sweep_swaps"].astype(np.int64),
            engine_cpu=arrays["engine_cpu"].astype(np.bool_),
            sweep_seconds=tuple(float(seconds) for seconds in header.get("sweep_seconds", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"{path}: {CAPTURE_FORMAT} field missing or malformed ({exc})") from exc
    _check_shapes(path, capture)
    return capture


def _check_shapes(path: Path, capture: Exl3Capture) -> None:
    known = {layer.layer for layer in capture.layers}
    splits, sweeps = len(capture.split_layers), len(capture.sweep_calls)
    problems = [
        *(f"split layer {layer} has no routes" for layer in capture.split_layers if layer not in known),
        *(
            f"layer {layer.layer}: routes {layer.routes.shape} and calls {layer.call_of_token.shape} disagree"
            for layer in capture.layers
            if layer.routes.ndim != 2 or layer.call_of_token.shape != (len(layer.routes),)
        ),
        *(
            f"layer {layer.layer}: a router id outside 0..{capture.experts - 1}"
            for layer in capture.layers
            if layer.routes.size and not (int(layer.routes.min()) >= 0 and int(layer.routes.max()) < capture.experts)
        ),
    ]
    if len(capture.cpu_experts) != splits or len(capture.sweep_inline) != sweeps:
        problems.append("cpu_experts/sweep_inline lengths do not match split_layers/sweep_calls")
    if capture.sweep_seconds and len(capture.sweep_seconds) != sweeps:
        problems.append(f"{len(capture.sweep_seconds)} sweep times for {sweeps} sweeps")
    if capture.sweep_swaps.shape != (sweeps, splits) or capture.engine_cpu.shape != (splits, capture.experts):
        problems.append(f"sweep_swaps {capture.sweep_swaps.shape} / engine_cpu {capture.engine_cpu.shape}")
    if problems:
        raise BadInput(f"{path}: {'; '.join(problems)}")


def _predicted_sweeps(capture: Exl3Capture, first_split_calls: NDArray[np.int64]) -> list[tuple[int, bool]]:
    """The trigger's sweeps, as forward-pass indices: the first split layer ticks once per call it runs."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    ticks = np.unique(first_split_calls)  # the calls the first split layer ran, in order
    # a drain after call d follows the last tick at or before d
    drain_of_tick = {int(np.searchsorted(ticks, d, side="right")) - 1: d for d in capture.drained_after}
    return [
        (int(ticks[tick]), True) if inline else (drain_of_tick[tick - 1] + 1, False)
        for tick, inline in sweep_triggers(len(ticks), capture.interval, drain_of_tick.keys())
    ]


def compare_capture(capture: Exl3Capture) -> CaptureComparison:
    """Replay ExLlamaV3 1.4.6's dynamic split over the captured tokens and compare it with what the engine did."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    by_layer = {layer.layer: layer for layer in capture.layers}
    split = [by_layer[layer] for layer in capture.split_layers]
    experts = capture.experts
    cpu = np.arange(experts)[None, :] >= (experts - np.asarray(capture.cpu_experts))[:, None]
    counts = np.zeros((len(split), experts), dtype=np.float64)
    replay_swaps = np.zeros_like(capture.sweep_swaps)
    counted = [0] * len(split)  # tokens of each layer already in its counts
    for sweep, call in enumerate(capture.sweep_calls):
        for index, layer in enumerate(split):
            # a layer's counts hold its calls before this one (an inline sweep runs before the call is counted)
            upto = int(np.searchsorted(layer.call_of_token, call, side="left"))
            block = layer.routes[counted[index] : upto]
            counts[index] += np.bincount(block.ravel().astype(np.int64), minlength=experts)
            counted[index] = upto
        budget = capture.max_swaps
        for index in range(len(split)):
            if budget <= 0:
                break  # run_pending_swap_sweeps: no turn (and no decay) once the budget is spent
            made = sweep_layer(
                counts[index], cpu[index], hysteresis=capture.hysteresis, floor=capture.floor, budget=budget
            )
            replay_swaps[sweep, index] = made
            budget -= made
    predicted = _predicted_sweeps(capture, split[0].call_of_token) if split else []
    recorded = list(zip(capture.sweep_calls, capture.sweep_inline, strict=True))
    rows = [
        CapturedLayerResult(
            layer=layer.layer,
            tokens=len(layer.routes),
            engine_cpu=np.flatnonzero(capture.engine_cpu[index]).tolist(),
            replay_cpu=np.flatnonzero(cpu[index]).tolist(),
            agree=bool(np.array_equal(capture.engine_cpu[index], cpu[index])),
            engine_swaps=int(capture.sweep_swaps[:, index].sum()),
            replay_swaps=int(replay_swaps[:, index].sum()),
        )
        for index, layer in enumerate(split)
    ]
    trigger_agrees = [(int(c), bool(i)) for c, i in predicted] == recorded
    swaps_agree = bool(np.array_equal(replay_swaps, capture.sweep_swaps))
    agreeing = sum(row.agree for row in rows)
    timing = _swap_timing(capture)
    return CaptureComparison(
        calls=capture.calls,
        sweeps=len(recorded),
        trigger_agrees=trigger_agrees,
        predicted_sweeps=predicted,
        recorded_sweeps=recorded,
        swaps_agree=swaps_agree,
        engine_swaps=int(capture.sweep_swaps.sum()),
        replay_swaps=int(replay_swaps.sum()),
        layers=rows,
        layers_agreeing=agreeing,
        agree=trigger_agrees and swaps_agree and agreeing == len(rows) and bool(rows),
        sweep_seconds=sum(capture.sweep_seconds) if capture.sweep_seconds else None,
        seconds_per_swap=timing[0] if timing else None,
        seconds_per_sweep=timing[1] if timing else None,
    )


def _swap_timing(capture: Exl3Capture) -> tuple[float, float] | None:
    """(seconds per swap, seconds per sweep) fitted to the timed sweeps; None without two distinct swap counts."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    if not capture.sweep_seconds:
        return None
    swaps = capture.sweep_swaps.sum(axis=1).astype(np.float64)
    if len(np.unique(swaps)) < 2:
        return None
    slope, intercept = np.polyfit(swaps, np.asarray(capture.sweep_seconds, dtype=np.float64), 1)
    return float(slope), float(intercept)


def decode_trace(capture: Exl3Capture) -> RoutingTrace:
    """The decode steps of a capture as a glm53 routing trace: the one-token passes every layer routed, in order
    (prefill passes, and the passes a layer skipped, are left out)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    singles = []
    for layer in capture.layers:
        passes, sizes = np.unique(layer.call_of_token, return_counts=True)
        singles.append(passes[sizes == 1])
    steps = singles[0]
    for passes in singles[1:]:
        steps = np.intersect1d(steps, passes)
    if not len(steps):
        raise BadInput("the capture holds no one-token pass that every layer routed: no decode steps to trace")
    routes = np.stack(
        [layer.routes[np.searchsorted(layer.call_of_token, steps)] for layer in capture.layers], axis=1
    ).astype(np.int16)
    return RoutingTrace(
        layers=tuple(layer.layer for layer in capture.layers),
        experts=capture.experts,
        top_k=int(routes.shape[2]),
        routes=routes,
    )
