"""`RealLayoutFakeMode`, the fake mode of simulated steps, allocates what the real CPU kernels
allocate for the ops whose meta functions differ (autofit/simulator/kernel_outputs.py), byte for
byte, and nothing more."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from autofit.simulator.kernel_outputs import RealLayoutFakeMode
from autofit.simulator.tracker import MemoryTracker

LOSSES = {
    "mse": lambda x, y: F.mse_loss(x, y),
    "smooth_l1": lambda x, y: F.smooth_l1_loss(x, y),
    "huber": lambda x, y: F.huber_loss(x, y, delta=0.5),
    "mse_none": lambda x, y: F.mse_loss(x, y, reduction="none").sum(),
}


def _step(loss_name: str, mode: str) -> tuple[MemoryTracker, tuple[int, ...], int]:
    """A loss on a transposed (non-contiguous) input and its backward, tracked: the allocation
    log, the input gradient's strides and the loss's storage bytes."""
    with ExitStack() as stack:
        if mode == "fake":
            stack.enter_context(FakeTensorMode())
        elif mode == "real_layout_fake":
            stack.enter_context(RealLayoutFakeMode())
        tracker = stack.enter_context(
            MemoryTracker(device_type="cpu" if mode == "real" else "meta")
        )
        x = torch.empty(48, 40).t().requires_grad_()  # (40, 48), strides (1, 40)
        y = torch.empty(40, 48)
        loss = LOSSES[loss_name](x, y)
        loss_bytes = loss.untyped_storage().nbytes()
        loss.backward()
        assert x.grad is not None
        strides = x.grad.stride()
    return tracker, strides, loss_bytes


def _log(tracker: MemoryTracker) -> list[int]:
    return [tracker.sizes[e] if e >= 0 else -tracker.sizes[~e] for e in tracker.events]


@pytest.mark.parametrize("loss_name", sorted(LOSSES))
def test_real_layout_fake_mode_allocates_as_the_real_kernels(loss_name: str) -> None:
    real, real_strides, real_bytes = _step(loss_name, "real")
    fake, fake_strides, fake_bytes = _step(loss_name, "real_layout_fake")
    assert _log(fake) == _log(real)
    assert fake.peak == real.peak
    assert (fake_strides, fake_bytes) == (real_strides, real_bytes)


@pytest.mark.parametrize("loss_name", ["mse", "smooth_l1", "huber"])
def test_plain_fake_tensors_allocate_otherwise(loss_name: str) -> None:
    """What the fixes are for: without them the fake log is not the real one."""
    real, _, real_bytes = _step(loss_name, "real")
    plain, _, plain_bytes = _step(loss_name, "fake")
    assert _log(plain) != _log(real)
    if (
        loss_name != "huber"
    ):  # huber_loss's own kernel reduces into a scalar; only its backward differs
        assert (plain_bytes, real_bytes) == (4, 40 * 48 * 4)  # the unreduced float32 buffer


def test_the_fix_applies_to_ops_from_outside_only() -> None:
    """Ops the fix itself runs (an empty buffer, its resize) are fake and reach no fix again;
    outside any op the mode's depth is back to zero."""
    mode = RealLayoutFakeMode()
    with mode:
        loss = F.mse_loss(torch.empty(8, 8), torch.empty(8, 8))
    assert mode._depth == 0
    assert type(loss).__name__ == "FakeTensor"
    assert loss.untyped_storage().nbytes() == 8 * 8 * 4


def test_a_draw_of_one_number_is_made_for_real_so_a_branch_on_it_runs() -> None:
    """PEFT's LoHa branches on `torch.rand(1) > module_dropout`: the fake mode draws that number
    from the CPU's generator, as the real step does, and carries its value; a larger draw, or one
    for another device, stays fake, as does anything computed from it with fake tensors."""
    torch.manual_seed(7)
    real = torch.rand(1).item()
    torch.manual_seed(7)
    with RealLayoutFakeMode():
        drawn = torch.rand(1)
        assert drawn.constant is not None and drawn.item() == real
        assert bool(drawn > 0.0)
        assert torch.rand(3).constant is None
        assert torch.rand(1, device="meta").constant is None
        assert (drawn * torch.empty(2)).constant is None
    with FakeTensorMode(), pytest.raises(DataDependentOutputException):
        bool(torch.rand(1) > 0.0)
