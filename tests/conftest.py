"""GPU tests carry the `cuda` marker and are skipped on machines without CUDA; each test gets
back the torch.nn.functional.linear it started with."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _undo_deepspeeds_linear_override() -> Iterator[None]:
    """DeepSpeed's zero.Init replaces torch.nn.functional.linear with its ZeRO-3 linear "for the
    rest of the process" (its own log line). A probe owns its process; a test does not, and under
    autocast that linear casts a weight at every use instead of once, which changes what later
    tests in the same process measure."""
    import torch

    linear = torch.nn.functional.linear
    yield
    torch.nn.functional.linear = linear


@pytest.fixture(autouse=True)
def _undo_the_process_groups_environment() -> Iterator[None]:
    """A real DeepSpeed or FSDP probe joins a process group of one, setting RANK, LOCAL_RANK and
    WORLD_SIZE for its engine (autofit/knobs/zero_stage.py). A probe owns its process; a test
    does not, and a trainer a later test launches (TRL's train.py) inherits them and waits for
    a rendezvous that never comes."""
    import os

    saved = {key: os.environ.get(key) for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
