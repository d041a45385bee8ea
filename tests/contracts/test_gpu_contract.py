"""The contract of a GPU entry, over every file in conf/gpu/: its figures hold together (memory,
bf16 from Ampere on, TFLOPS in order, links, CUDA context and PyTorch's cuBLAS workspace for its
compute capability) and it names where the machine around it comes from."""

from __future__ import annotations

import re

import pytest

from autofit.gpus import load_gpu
from autofit.paths import conf_dir, group_options


@pytest.mark.parametrize("name", group_options("gpu"))
def test_every_shipped_entry_loads_and_holds_together(name: str) -> None:
    gpu = load_gpu(name)
    assert gpu.name == name
    assert 4_000 < gpu.memory_mib < 300_000 and gpu.reserved_mib == 0
    assert re.fullmatch(r"\d+\.\d", gpu.compute_capability)
    major = int(gpu.compute_capability.split(".")[0])
    assert gpu.bf16 == (major >= 8)  # bf16 arrived with Ampere
    assert ("bf16" in gpu.tflops) == gpu.bf16
    assert gpu.tflops["fp16"] >= gpu.tflops["tf32"] >= gpu.tflops["fp32"] > 0
    assert gpu.tflops.get("bf16", gpu.tflops["fp16"]) == gpu.tflops["fp16"]
    assert gpu.memory_bandwidth_gbs > 0 and gpu.peer_link_gbs > 0
    assert 0 < gpu.host_link_gbs <= 64  # PCIe 5.0 x16 is 64 GB/s each way
    assert 400 <= gpu.cuda_context_mib <= 600
    # PyTorch's default cuBLAS workspace: 32 MiB from Hopper on, 8.125 MiB before.
    assert gpu.cublas_workspace_mib == (32 if major >= 9 else 8.125)
    assert gpu.label == name  # a shipped entry, unchanged, carries its own name
    # The machine around it, with where that figure comes from (issue 41 item 8).
    assert gpu.host_memory_gib is not None and 12 <= gpu.host_memory_gib <= 512
    assert gpu.host_memory_basis
    text = (conf_dir() / "gpu" / f"{name}.yaml").read_text()
    source = text.split("\nhost_memory_gib:")[0].rsplit("\n# The machine around it", 1)[1]
    assert "skypilot-catalog" in source or "Survey" in source or "Colab" in source
