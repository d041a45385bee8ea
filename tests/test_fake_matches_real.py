"""The simulator allocates what a real step allocates: the `simulate` backend (fake tensors) and
the `cpu` backend (real tensors) record the same allocations, in the same order, with the same
sizes and categories, for every precision, optimizer and checkpointing setting on the tiny models.
"""

from __future__ import annotations

import itertools

import pytest
from helpers import spec

from autofit.backends import cpu, simulate


def canonical(events: list[int]) -> list[int]:
    """The log with each run of consecutive frees sorted. Storages released together (autocast
    clearing its cast cache, say) go in hash-map order, which differs between runs; the allocator
    ends up in the same state whatever the order within such a run."""
    out: list[int] = []
    run: list[int] = []
    for event in events:
        if event < 0:
            run.append(event)
            continue
        out.extend(sorted(run))
        run = []
        out.append(event)
    return out + sorted(run)


CASES = list(
    itertools.product(
        ["tiny_mlp", "tiny_sana"],
        ["fp32", "fp16", "bf16", "bf16_pure"],
        [False, True],
        ["adamw", "sgd"],
    )
)


@pytest.mark.parametrize("model,precision,checkpointing,optimizer", CASES)
def test_simulated_allocations_equal_real_ones(
    model: str, precision: str, checkpointing: bool, optimizer: str
) -> None:
    probe = spec(
        model, batch_size=2, precision=precision, checkpointing=checkpointing, optimizer=optimizer
    )
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.sizes == real.sizes
    assert canonical(fake.events) == canonical(real.events)
    assert fake.categories == real.categories
    assert fake.peak_report() == real.peak_report()
