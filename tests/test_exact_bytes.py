"""The allocated peak of a small MLP trained with AdamW, counted by hand, to the byte.

tiny_mlp: per token, Linear(64 -> 256) + ReLU + Linear(256 -> 64), MSE against a random target,
fp32, fused AdamW. At 64 px it sees T = 64 tokens. Every block the CUDA allocator hands out is a
multiple of 512 bytes.
"""

from __future__ import annotations

import pytest
from helpers import spec

from autofit.gpus import load_gpu
from autofit.probe.runner import run_probe
from autofit.records.probe import Outcome

F32 = 4
T, IN, HIDDEN, OUT = 64, 64, 256, 64


def r(nbytes: int) -> int:
    """Rounded up to the CUDA allocator's 512-byte granularity."""
    return -(-nbytes // 512) * 512


def by_hand(batch: int) -> dict[str, int]:
    """What is live at the peak: the second step's backward, just as ReLU's backward (the
    threshold_backward kernel) returns the gradient before the ReLU."""
    params = [HIDDEN * IN * F32, HIDDEN * F32, OUT * HIDDEN * F32, OUT * F32]  # W1, b1, W2, b2
    parameters = sum(r(p) for p in params)
    # Fused AdamW: exp_avg and exp_avg_sq like each parameter, and a 0-d fp32 step per parameter.
    optimizer_state = 2 * parameters + len(params) * r(F32)
    # Live since the forward pass: the batch (x and y), ReLU's output (saved by ReLU and by the
    # second Linear), and the loss, whose 0-d result keeps mse_loss's unreduced buffer alive.
    x, y = r(batch * T * IN * F32), r(batch * T * OUT * F32)
    relu_out = r(batch * T * HIDDEN * F32)
    loss = r(batch * T * OUT * F32)
    activations = x + y + relu_out + loss
    # Backward so far: the second Linear's weight and bias gradients are done ...
    gradients = r(OUT * HIDDEN * F32) + r(OUT * F32)
    # ... and in flight: the loss's seed gradient (0-d), the gradient w.r.t. ReLU's output, and
    # threshold_backward's result. The MSE gradient and the prediction are already freed.
    temporaries = r(F32) + r(batch * T * HIDDEN * F32) + r(batch * T * HIDDEN * F32)
    return {
        "parameters": parameters,
        "gradients": gradients,
        "optimizer_state": optimizer_state,
        "activations": activations,
        "temporaries": temporaries,
    }


@pytest.mark.long
@pytest.mark.parametrize("backend", ["cpu", "simulate"])
@pytest.mark.parametrize("batch", [2, 4])
def test_mlp_adamw_peak_is_exact(backend: str, batch: int) -> None:
    expected = by_hand(batch)
    result = run_probe(
        spec("tiny_mlp", backend=backend, batch_size=batch, precision="fp32", optimizer="adamw")
    )
    assert result.outcome is Outcome.OK, result.error
    assert result.phase == "backward"
    workspace = load_gpu("a40").cublas_workspace_bytes  # CUDA counts it as allocated, so do we
    assert result.peak_allocated_bytes == sum(expected.values()) + workspace
    breakdown = dict(result.breakdown)
    overhead = breakdown.pop("overhead")
    assert breakdown == expected
    assert overhead == result.peak_bytes - sum(expected.values())
    assert result.param_count == HIDDEN * IN + HIDDEN + OUT * HIDDEN + OUT
