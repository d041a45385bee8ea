"""Physics the simulated peak must obey: more batch never needs less memory, and checkpointing
keeps fewer activations."""

from __future__ import annotations

from helpers import spec

from autofit.backends import simulate


def test_peak_never_decreases_with_batch_size() -> None:
    peaks = [simulate.measure(spec("tiny_sana", batch_size=b)).peak_bytes for b in range(1, 9)]
    assert peaks == sorted(peaks)
    assert peaks[-1] > peaks[0]


def test_allocated_peak_never_decreases_with_batch_size_on_sana_1600m() -> None:
    peaks = [
        simulate.measure(spec("sana_1600m", batch_size=b, resolution=256)).peak_allocated_bytes
        for b in (1, 2, 4)
    ]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def test_checkpointing_lowers_the_activation_part() -> None:
    # Configurations whose peak falls in forward or backward, where activations are live.
    for model, batch, resolution in (("tiny_sana", 4, 64), ("sana_1600m", 1, 1024)):
        plain = simulate.measure(spec(model, batch_size=batch, resolution=resolution))
        ckpt = simulate.measure(
            spec(model, batch_size=batch, resolution=resolution, checkpointing=True)
        )
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
    mixed = simulate.measure(spec("sana_1600m", resolution=256, precision="bf16"))
    pure = simulate.measure(spec("sana_1600m", resolution=256, precision="bf16_pure"))
    ratio = pure.tensor_breakdown["parameters"] / mixed.tensor_breakdown["parameters"]
    assert abs(ratio - 0.5) < 0.001
    assert (
        abs(
            pure.tensor_breakdown["optimizer_state"] / mixed.tensor_breakdown["optimizer_state"]
            - 0.5
        )
        < 0.001
    )
