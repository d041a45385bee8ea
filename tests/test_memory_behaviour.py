"""Physics the simulated peak must obey: more batch never needs less memory, and checkpointing
keeps fewer activations. The large-model cases run Sana 1600M's widths with two of its blocks:
the same tensors, a tenth of the step."""

from __future__ import annotations

import pytest
from helpers import spec, with_blocks

from autofit.backends import simulate


@pytest.mark.long
def test_peak_never_decreases_with_batch_size() -> None:
    peaks = [simulate.measure(spec("tiny_sana", batch_size=b)).peak_bytes for b in range(1, 9)]
    assert peaks == sorted(peaks)
    assert peaks[-1] > peaks[0]


def test_allocated_peak_never_decreases_with_batch_size_on_sana_1600m() -> None:
    peaks = [
        simulate.measure(with_blocks(spec("sana_1600m", batch_size=b, resolution=256), 2))
        for b in (1, 2, 4)
    ]
    peaks = [p.peak_allocated_bytes for p in peaks]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def test_checkpointing_lowers_the_activation_part() -> None:
    # Configurations whose peak falls in forward or backward, where activations are live.
    tiny = [spec("tiny_sana", batch_size=4, resolution=64, checkpointing=c) for c in (False, True)]
    sana = [
        with_blocks(spec("sana_1600m", batch_size=2, resolution=1024, checkpointing=c), 2)
        for c in (False, True)
    ]
    for without, with_it in (tiny, sana):
        plain, ckpt = simulate.measure(without), simulate.measure(with_it)
        assert ckpt.tensor_breakdown["activations"] < plain.tensor_breakdown["activations"]
        assert ckpt.peak_allocated_bytes < plain.peak_allocated_bytes
        # The weights and the optimizer do not change.
        assert ckpt.tensor_breakdown["parameters"] == plain.tensor_breakdown["parameters"]
        assert ckpt.tensor_breakdown["optimizer_state"] == plain.tensor_breakdown["optimizer_state"]
        # Recomputation costs time.
        assert ckpt.step_time_s > plain.step_time_s


def test_optimizer_state_follows_the_update_rule() -> None:
    run, adamw = simulate.trace(spec("tiny_sana", optimizer="adamw", precision="fp32"))
    _, sgd = simulate.trace(spec("tiny_sana", optimizer="sgd", precision="fp32"))
    params = adamw.peak_report().breakdown["parameters"]
    tensors = len(list(run.model.parameters()))
    # AdamW: two moments like each parameter and a 0-d fp32 step counter (512 B) per tensor.
    assert adamw.peak_report().breakdown["optimizer_state"] == 2 * params + 512 * tensors
    # SGD with momentum: one buffer like each parameter.
    assert sgd.peak_report().breakdown["optimizer_state"] == params


def test_pure_bf16_halves_the_weights() -> None:
    mixed = simulate.measure(with_blocks(spec("sana_1600m", resolution=256, precision="bf16"), 2))
    pure = simulate.measure(
        with_blocks(spec("sana_1600m", resolution=256, precision="bf16_pure"), 2)
    )
    ratio = pure.tensor_breakdown["parameters"] / mixed.tensor_breakdown["parameters"]
    assert abs(ratio - 0.5) < 0.001
    assert (
        abs(
            pure.tensor_breakdown["optimizer_state"] / mixed.tensor_breakdown["optimizer_state"]
            - 0.5
        )
        < 0.001
    )
