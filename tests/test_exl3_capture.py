"""The replay of ExLlamaV3's dynamic CPU split against the engine's own record of two GPU runs.

The captures (tests/fixtures/exl3-capture, README there) were recorded while ExLlamaV3 1.4.6 generated on an
H200, two by the generation tool and one while TabbyAPI served requests (`glm53 serve --capture-routing`): each
layer's routing, each sweep's forward pass and swaps per layer, and the final placement.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest

from glm53.errors import BadInput
from glm53.plan.cache.engine_cost import (
    SWAP_OVERHEAD_SECONDS,
    SWEEP_SECONDS,
    SWEEP_TURN_EXPERT_SECONDS,
    SWEEP_TURN_SECONDS,
)
from glm53.plan.cache.policies import _sweep_points, sweep_triggers
from glm53.plan.cache.recommend import candidates
from glm53.plan.exllamav3.capture import CapturedLayer, compare_capture, load_capture, save_capture

CAPTURES = Path(__file__).parent / "fixtures" / "exl3-capture"


@pytest.mark.parametrize(
    ("name", "paths"),
    [
        ("inline-sweeps", {True}),
        ("drained-sweeps", {False}),
        ("served-sweeps", {True, False}),
        ("timed-sweeps", {True}),
        ("timed-many-swaps", {True}),
    ],
)
def test_the_replay_is_what_the_engine_did(name: str, paths: set[bool]) -> None:
    capture = load_capture(CAPTURES / f"{name}.npz")
    result = compare_capture(capture)
    assert result.trigger_agrees and result.swaps_agree and result.agree
    assert result.layers_agreeing == len(result.layers) == 5
    assert {flag for _, flag in result.recorded_sweeps} == paths  # which paths of the trigger each run took
    assert all(row.engine_swaps > 0 for row in result.layers)  # placement moved in every split layer
    # ExLlamaV3's prefill stops at the last layer's attention: the last layer routed decode steps only
    tokens = {row.layer: row.tokens for row in result.layers}
    assert tokens[7] < tokens[3] == tokens[6]


@pytest.mark.parametrize(
    ("name", "swaps_move"), [("inline-sweeps", True), ("drained-sweeps", True), ("served-sweeps", False)]
)
def test_a_sweep_one_pass_late_is_caught(name: str, swaps_move: bool) -> None:
    """A sweep one pass late is a wrong trigger; where the counts are small it also moves the swaps (in the
    served run 2,048-token prompts dominate them, and one decode token more rarely changes the order)."""
    capture = load_capture(CAPTURES / f"{name}.npz")
    late = dataclasses.replace(capture, sweep_calls=tuple(call + 1 for call in capture.sweep_calls))
    result = compare_capture(late)
    assert not result.trigger_agrees and not result.agree
    assert result.swaps_agree is not swaps_move


def test_the_engine_counts_prompt_tokens() -> None:
    """Counting decode steps only (what a decode-step trace holds) does not reproduce the engine."""
    capture = load_capture(CAPTURES / "inline-sweeps.npz")
    passes, sizes = np.unique(capture.layers[0].call_of_token, return_counts=True)
    prompts = passes[sizes > 1].tolist()  # passes of more than one token: the prefills
    assert prompts
    decode_only = tuple(
        CapturedLayer(
            layer.layer,
            layer.routes[~np.isin(layer.call_of_token, prompts)],
            layer.call_of_token[~np.isin(layer.call_of_token, prompts)],
        )
        for layer in capture.layers
    )
    result = compare_capture(dataclasses.replace(capture, layers=decode_only))
    assert not result.swaps_agree and result.layers_agreeing < len(result.layers)


def test_a_capture_survives_a_save_and_load(tmp_path: Path) -> None:
    capture = load_capture(CAPTURES / "drained-sweeps.npz")
    path = tmp_path / "again.npz"
    path.write_bytes(save_capture(capture))
    assert compare_capture(load_capture(path)) == compare_capture(capture)


def test_timed_sweeps_give_the_cost_of_a_swap_and_survive_a_save(tmp_path: Path) -> None:
    """Sweep times (the recorder's, device synchronized around each) fitted over the sweeps' swaps: the slope is
    what a swap costs, the intercept what a sweep costs with none."""
    capture = load_capture(CAPTURES / "inline-sweeps.npz")
    assert compare_capture(capture).seconds_per_swap is None  # recorded before sweeps were timed
    swaps = capture.sweep_swaps.sum(axis=1)
    timed = dataclasses.replace(capture, sweep_seconds=tuple(0.004 + 0.0021 * float(n) for n in swaps))
    path = tmp_path / "timed.npz"
    path.write_bytes(save_capture(timed))
    result = compare_capture(load_capture(path))
    assert result.agree and result.sweep_seconds == pytest.approx(sum(timed.sweep_seconds))
    assert result.seconds_per_swap == pytest.approx(0.0021) and result.seconds_per_sweep == pytest.approx(0.004)


def test_a_swap_costs_what_the_cost_model_charges_for_its_overhead() -> None:
    """Two runs with every sweep timed on the GPU (the fixture's experts are 39 KB, so what a swap costs there is
    its overhead): the replay still equals the engine, and the fitted seconds per swap are the cost model's."""
    swaps, seconds = [], []
    for name in ("timed-sweeps", "timed-many-swaps"):
        capture = load_capture(CAPTURES / f"{name}.npz")
        assert compare_capture(capture).agree and len(capture.sweep_seconds) == len(capture.sweep_calls)
        swaps += capture.sweep_swaps.sum(axis=1)[1:].tolist()  # the first sweep of a run warms up
        seconds += list(capture.sweep_seconds[1:])
    slope, _ = np.polyfit(swaps, seconds, 1)
    assert slope == pytest.approx(SWAP_OVERHEAD_SECONDS, rel=0.05)


def test_the_setting_recommended_on_most_shapes_is_replayed_exactly() -> None:
    """The setting the recommendation chooses on most of the targets' shapes (interval 32, hysteresis 4, no
    floor, a sweep's cap lifted to 1,024), run by the engine on the GPU: every sweep, swap and final placement
    as the replay has them."""
    capture = load_capture(CAPTURES / "recommended-setting.npz")
    result = compare_capture(capture)
    assert result.agree and result.trigger_agrees and result.layers_agreeing == 5
    assert result.engine_swaps == result.replay_swaps > 0
    setting = (capture.interval, capture.hysteresis, capture.floor, capture.max_swaps)
    assert setting == (32, 4.0, 0.0, 1024)
    assert any(
        (c.interval, c.hysteresis, c.floor, c.max_swaps) == setting
        for c in candidates("exllamav3")
        if c.family == "exl3-dynamic"
    )


def _sweep_seconds(layers: int, experts: int) -> float:
    return SWEEP_SECONDS + layers * (SWEEP_TURN_SECONDS + SWEEP_TURN_EXPERT_SECONDS * experts)


def test_a_sweep_costs_what_the_cost_model_charges_for_it() -> None:
    """The engine's own sweep functions timed on the GPU machine over 1 to 42 layers of 16 to 256 experts
    (tools/exl3-sweep-cost.py, sweep-cost.json): the cost model's fit is within 10% of every median. And the
    fixture's sweeps without a swap, timed while ExLlamaV3 generated (timed-no-swaps.npz, default floor 8, which
    16 experts never clear), cost what the fit says for its 5 split layers of 16, within a factor of 2 (there the
    synchronize also waits for the GPU's queued work)."""
    measured = json.loads((CAPTURES / "sweep-cost.json").read_text())["sweeps"]
    assert {(row["layers"], row["experts"]) for row in measured} >= {(42, 256), (5, 16)}
    for row in measured:
        assert _sweep_seconds(row["layers"], row["experts"]) == pytest.approx(row["median_s"], rel=0.1)
    capture = load_capture(CAPTURES / "timed-no-swaps.npz")
    assert compare_capture(capture).agree and not capture.sweep_swaps.any()
    in_situ = float(np.median(capture.sweep_seconds))
    assert 0.5 < in_situ / _sweep_seconds(len(capture.split_layers), capture.experts) < 2


def _rewritten(tmp_path: Path, header_change: dict[str, object], drop: str | None = None) -> Path:
    with np.load(CAPTURES / "inline-sweeps.npz") as data:
        arrays = {name: data[name] for name in data.files if name != drop}
    header = json.loads(bytes(arrays["header"]).decode())
    header.update(header_change)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path = tmp_path / "capture.npz"
    path.write_bytes(buffer.getvalue())
    return path


@pytest.mark.parametrize(
    ("change", "drop", "message"),
    [
        ({"format": "glm53-routing-trace"}, None, "not a glm53-exl3-capture file"),
        ({"version": 2}, None, "version 2"),
        ({}, "routes_5", "routes_5"),
        ({"split_layers": [3, 4, 5, 6, 9]}, None, "split layer 9 has no routes"),
        ({"experts": 4}, None, "a router id outside 0..3"),
        ({"sweep_calls": [1, 2]}, None, "lengths do not match"),
        ({"interval": "often"}, None, "malformed"),
        ({"sweep_seconds": [0.1, 0.2]}, None, "2 sweep times for 18 sweeps"),
    ],
)
def test_a_malformed_capture_is_refused_naming_the_file(
    tmp_path: Path, change: dict[str, object], drop: str | None, message: str
) -> None:
    path = _rewritten(tmp_path, change, drop)
    with pytest.raises(BadInput, match=message) as caught:
        load_capture(path)
    assert str(path) in str(caught.value)


def test_a_file_that_is_not_an_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "capture.npz"
    path.write_text("routes\n")
    with pytest.raises(BadInput, match="not a readable glm53-exl3-capture file"):
        load_capture(path)


def test_the_trigger_of_one_token_steps_is_the_general_trigger() -> None:
    for steps, interval, generation in [(40, 3, None), (200, 4, 50), (90, 2, 7)]:
        drains = None if generation is None else set(range(generation - 1, steps, generation))
        assert _sweep_points(steps, interval, generation) == sweep_triggers(steps, interval, drains)
    # drains after passes 4 and 9 only: a pending sweep waits for them
    assert sweep_triggers(10, 2, {4, 9}) == [(5, False), (10, False)]
