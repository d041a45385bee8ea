"""A model built on the host for a real run draws its random weights from a tile: the asked-for
distribution, the same storages, at the speed of a copy (autofit/host_init.py)."""

from __future__ import annotations

import torch

from autofit.host_init import TILE, tiled_random_init
from autofit.simulator.tracker import MemoryTracker


def test_large_host_tensors_get_the_asked_for_distribution_and_small_ones_draw_their_own() -> None:
    original = torch.Tensor.normal_
    with tiled_random_init():
        weight = torch.empty(3000, 1000, dtype=torch.bfloat16)
        torch.nn.init.normal_(weight, mean=0.5, std=0.02)
        spread = torch.empty(TILE + 12345)
        spread.uniform_(-2.0, 3.0)
        linear = torch.nn.Linear(2048, 1024)  # reset_parameters: kaiming_uniform_ of 2 M weights
        small = torch.empty(1000)
        small.normal_()
    assert torch.Tensor.normal_ is original  # restored on the way out
    assert weight.dtype == torch.bfloat16
    values = weight.float()
    assert abs(values.mean().item() - 0.5) < 1e-3 and abs(values.std().item() - 0.02) < 1e-3
    assert not torch.equal(weight[0], weight[1])  # the tile's period is longer than a row
    assert spread.min() >= -2.0 and spread.max() < 3.0 and abs(spread.mean().item() - 0.5) < 0.01
    bound = 1 / 2048**0.5  # kaiming_uniform_(a=sqrt(5)) on 2048 inputs
    assert linear.weight.abs().max() <= bound and linear.weight.std() > bound / 2
    # a small tensor draws its own numbers, not the tile's first thousand
    with tiled_random_init():
        again = torch.empty(1000)
        again.normal_()
    assert not torch.equal(small, again)


def test_the_fill_holds_no_memory_a_tracker_counts() -> None:
    """The tile is numpy's and its scaled copy a temporary counted nowhere: a tracked build on
    the host holds exactly its weights, as a drawn one does."""
    held = {}
    for tiled in (False, True):
        tracker = MemoryTracker(device_type="cpu")
        with tracker, tracker.host(), tiled_random_init() if tiled else torch.no_grad():
            layer = torch.nn.Linear(4096, 1024, bias=False)
            held[tiled] = (tracker.host_sizes[:], tracker.sizes[:])
        del layer
    assert held[True] == held[False]
    assert sum(held[True][0]) >= 4096 * 1024 * 4 and held[True][1] == []
