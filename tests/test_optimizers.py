"""Each optimizer's state follows its real layout: `simulate` (fake tensors, stand-ins where the
library cannot run on them) reports the same optimizer-state bytes as a real CPU step."""

from __future__ import annotations

import pytest
import torch
from helpers import spec
from torch._subclasses.fake_tensor import FakeTensorMode

from autofit.backends import cpu, simulate
from autofit.emulations.bnb_layout import Blockwise8bitLayout
from autofit.simulator.tracker import MemoryTracker, round_allocation
from autofit.techniques.optimizers.adamw_bf16 import AdamWBF16, stochastic_round_to_bf16

REAL_ON_CPU = ["adamw", "adamw8bit", "adafactor", "came", "lion", "lion8bit", "adamw_bf16", "sgd"]


@pytest.mark.parametrize("optimizer", REAL_ON_CPU)
def test_simulated_optimizer_state_equals_a_real_step(optimizer: str) -> None:
    precision = "bf16_pure" if optimizer == "adamw_bf16" else "bf16"
    probe = spec("tiny_sana", batch_size=2, optimizer=optimizer, precision=precision)
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.live_bytes("optimizer_state") == real.live_bytes("optimizer_state") > 0
    assert fake.live_bytes("parameters") == real.live_bytes("parameters")


def _state_bytes(optimizer: str, precision: str = "bf16") -> tuple[int, int]:
    run, tracker = simulate.trace(
        spec("tiny_sana", batch_size=1, optimizer=optimizer, precision=precision)
    )
    return tracker.live_bytes("optimizer_state"), tracker.live_bytes("parameters")


def test_eight_bit_adam_holds_about_two_bytes_per_parameter() -> None:
    """tiny_sana's weights are fp32 (mixed precision): AdamW keeps 8 bytes of state per
    parameter, 8-bit AdamW 2 bytes plus block scales on large tensors, and fp32 states on the
    small ones (under bitsandbytes' min_8bit_size of 4096 elements)."""
    run, _ = simulate.trace(spec("tiny_sana", batch_size=1, optimizer="adamw8bit"))
    expected = 2 * 1024  # the two quantization maps, 256 fp32 each
    for p in run.trainable_parameters():
        n = p.numel()
        if n < 4096:
            expected += 2 * round_allocation(4 * n)
        else:
            expected += 2 * round_allocation(n) + 2 * round_allocation(4 * -(-n // 256))
    state, params = _state_bytes("adamw8bit")
    assert state == expected
    adamw_state, _ = _state_bytes("adamw")
    assert state < adamw_state


def test_lion_and_sgd_keep_one_state_adafactor_factors_it() -> None:
    adamw, params = _state_bytes("adamw")
    lion, _ = _state_bytes("lion")
    sgd, _ = _state_bytes("sgd")
    adafactor, _ = _state_bytes("adafactor")
    assert lion == sgd == params  # one state like each fp32 parameter
    assert adafactor < lion  # factored second moments, no first moment


def test_paged_state_of_large_tensors_is_not_gpu_memory() -> None:
    tracker = MemoryTracker(device_type="meta")
    with FakeTensorMode(), tracker:
        big = torch.nn.Parameter(torch.zeros(512, 512))  # 262,144 elements: paged
        small = torch.nn.Parameter(torch.zeros(64, 128))  # 8,192 elements: 8-bit, not paged
        for p in (big, small):
            p.grad = torch.zeros_like(p)
        optimizer = Blockwise8bitLayout([big, small], states=2, paged=True, host=tracker.host)
        optimizer.step()
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    tracker.tag(value, "optimizer_state")
    counted = tracker.live_bytes("optimizer_state")
    small_states = 2 * 8192 + 2 * round_allocation(4 * 32)
    big_scales = 2 * round_allocation(4 * 1024)
    assert counted == 2 * 1024 + small_states + big_scales  # no byte of the big tensor's states


def test_adamw_bf16_rounds_stochastically_and_keeps_bf16_states() -> None:
    torch.manual_seed(0)
    target = torch.zeros(100_000, dtype=torch.bfloat16)
    stochastic_round_to_bf16(torch.full((100_000,), 1.0 + 2**-10), target)
    # 1 + 2^-10 lies an eighth of the way from 1 to the next bf16 (1 + 2^-7): an eighth round up.
    share_up = (target > 1).float().mean().item()
    assert 0.11 < share_up < 0.14
    p = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    p.grad = torch.full_like(p, 0.1)
    optimizer = AdamWBF16([p], lr=1e-3)
    optimizer.step()
    assert optimizer.state[p]["exp_avg"].dtype == torch.bfloat16
    assert p.dtype == torch.bfloat16 and (p < 1).any()


def test_invalid_combinations_say_why() -> None:
    from autofit.gpus import load_gpu
    from autofit.knobs import invalid_reason
    from autofit.models import load_preset

    knobs = spec("tiny_sana", optimizer="adamw_bf16").knobs
    reason = invalid_reason(knobs, load_gpu("a40"), load_preset("tiny_sana"), "simulate")
    assert reason and "bf16_pure" in reason
    knobs = spec("tiny_sana", optimizer="paged_adamw8bit").knobs
    assert "cuda" in invalid_reason(knobs, load_gpu("a40"), load_preset("tiny_sana"), "cpu")
    assert invalid_reason(knobs, load_gpu("a40"), load_preset("tiny_sana"), "simulate") is None
