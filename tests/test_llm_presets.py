"""The language-model presets: what LoRA adapts exists as linear layers, and the mixture of
experts runs on fake tensors as on real ones (transformers 5.23's Qwen3-MoE, grouped GEMMs)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from helpers import spec
from torch._subclasses.fake_tensor import FakeTensorMode

from autofit.backends import cpu, simulate
from autofit.models import ModelPreset, load_preset
from autofit.paths import group_options
from autofit.records.probe import ProbeSpec
from autofit.workloads import workload_for

LLMS = [n for n in group_options("model") if n != "custom" and load_preset(n).family == "llm"]


def r(nbytes: int) -> int:
    """Rounded up to the CUDA allocator's 512-byte granularity."""
    return -(-nbytes // 512) * 512


def one_block(name: str) -> torch.nn.Module:
    """The preset's model with one transformer block, on fake tensors."""
    data = load_preset(name).to_dict()
    data["architecture"] = copy.deepcopy(data["architecture"])
    data["architecture"]["config"]["num_hidden_layers"] = 1
    preset = ModelPreset.from_dict(data)
    workload = workload_for(preset)
    with FakeTensorMode(allow_non_fake_inputs=True):
        return workload.build_model(torch.bfloat16)


@pytest.mark.parametrize("name", LLMS)
def test_every_lora_target_is_a_linear_layer_of_the_model(name: str) -> None:
    """PEFT's target_modules adapt nn.Linear layers by name; a name that matches none (an MoE's
    fused experts) would leave the adapters off or fail."""
    linear = {
        path.rsplit(".", 1)[-1]
        for path, module in one_block(name).named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    assert set(load_preset(name).lora_targets) <= linear


def test_the_experts_are_fused_3d_parameters_that_lora_targets_leave_alone() -> None:
    model = one_block("qwen3_30b_a3b")
    config = load_preset("qwen3_30b_a3b").architecture["config"]
    experts = model.model.layers[0].mlp.experts
    assert not any(isinstance(m, torch.nn.Linear) for m in experts.modules())
    assert experts.gate_up_proj.shape == (
        config["num_experts"], 2 * config["moe_intermediate_size"], config["hidden_size"]
    )  # fmt: skip
    assert experts.down_proj.dim() == 3
    assert not set(load_preset("qwen3_30b_a3b").lora_targets) & {"gate_up_proj", "down_proj"}


TINY_MOE = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_experts": 8, "num_experts_per_tok": 2,
}  # fmt: skip


def tiny_moe(**knobs: object) -> ProbeSpec:
    probe = spec("qwen3_30b_a3b", batch_size=2, resolution=64, **knobs)
    arch = copy.deepcopy(probe.model["architecture"])
    arch["config"].update(TINY_MOE)
    return dataclasses.replace(probe, model={**probe.model, "architecture": arch})


@pytest.mark.parametrize("precision", ["bf16_pure", "fp32", "bf16"])
def test_the_moe_step_on_fake_tensors_holds_what_the_real_one_does(precision: str) -> None:
    """fp32 and autocast too, which torch's meta kernel for the grouped GEMM refuses: the fake
    step takes each expert's equal share. What the real step holds beyond it at the peak is the
    int32 offsets of each MoE layer (one per expert), which torch's grouped GEMM keeps for its
    backward and the batched GEMM standing in for it does not need."""
    probe = tiny_moe(precision=precision)
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    layers, experts = TINY_MOE["num_hidden_layers"], TINY_MOE["num_experts"]
    assert real.peak - fake.peak == layers * r(experts * 4)


def test_equal_shares_compute_what_the_grouped_gemm_computes_for_balanced_routing() -> None:
    from transformers.integrations.moe import _grouped_mm

    from autofit.workloads.llm import equal_share_grouped_mm

    experts, share, width, out = 4, 3, 8, 12  # fp32 rows of 16-byte multiples, as the kernel needs
    rows = torch.randn(experts * share, width)
    weight = torch.randn(experts, width, out)
    balanced = torch.arange(1, experts + 1, dtype=torch.int32) * share
    expected = _grouped_mm(rows, weight, balanced)
    assert torch.allclose(equal_share_grouped_mm(rows, weight, balanced), expected, atol=1e-6)
    # Rows that do not divide evenly come back as many as went in.
    assert equal_share_grouped_mm(rows[:-1], weight, balanced).shape == (experts * share - 1, out)


@pytest.mark.parametrize("targets", ["mlp", "all_linear"])
def test_a_mixture_of_experts_refuses_lora_on_its_fused_experts(targets: str) -> None:
    from autofit.gpus import load_gpu
    from autofit.knobs import completed, invalid_reason

    reason = invalid_reason(
        completed({"train_mode": "lora", "lora_targets": targets}),
        load_gpu("a40"),
        load_preset("qwen3_30b_a3b"),
        "simulate",
    )
    assert reason is not None and "fused 3-D parameters" in reason and "\n" not in reason
