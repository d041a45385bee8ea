"""The `cuda` backend on a real GPU. Skipped without CUDA (see conftest.py)."""

from __future__ import annotations

import pytest
from helpers import spec

from autofit.probe.runner import run_probe
from autofit.records.probe import Outcome

pytestmark = pytest.mark.cuda


def test_a_real_step_is_measured_by_the_allocator() -> None:
    result = run_probe(spec("tiny_sana", backend="cuda", batch_size=2))
    assert result.outcome is Outcome.OK, result.error
    assert result.backend == "cuda"
    assert result.throughput_estimated is False
    assert result.samples_per_s > 0
    assert result.peak_reserved_bytes >= result.peak_allocated_bytes > 0
    assert sum(result.breakdown.values()) == result.peak_bytes
    assert result.breakdown["parameters"] > 0 and result.breakdown["optimizer_state"] > 0
    assert "device" in result.versions


def test_auto_runs_on_the_gpu_when_it_holds_the_target() -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    target = "l4" if total >= 23034 * 2**20 else "t4"
    result = run_probe(spec("tiny_mlp", gpu=target, backend="auto", precision="fp16"))
    assert result.backend == "cuda"


def test_a_smaller_target_is_emulated_by_capping_memory() -> None:
    # 1.6 B parameters with fp32 AdamW state need ~26 GB: a 16 GB T4 cannot hold them.
    result = run_probe(
        spec("sana_1600m", gpu="t4", backend="cuda", precision="fp16", resolution=512)
    )
    assert result.outcome is Outcome.OOM
    assert result.phase in ("setup", "forward", "backward", "optimizer")


def test_out_of_memory_names_the_phase_it_ran_out_in() -> None:
    # Sana 600M's weights and AdamW state fit a T4; batch 16 at 1024 px does not: the step runs out.
    result = run_probe(spec("sana_600m", gpu="t4", backend="cuda", precision="fp16", batch_size=16))
    assert result.outcome is Outcome.OOM
    assert result.phase in ("forward", "backward")
