"""QLoRA's 4-bit base weights: bitsandbytes' NF4 `Linear4bit` on real tensors, its memory layout
(autofit/simulator/nf4_layout.py) on fake ones."""

from __future__ import annotations

import torch
from torch import nn

from autofit.simulator.nf4_layout import Nf4LinearLayout


def quantized_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every tensor a quantized layer keeps: its weight, bias and quantization state."""
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    state = getattr(module.weight, "quant_state", None)
    while state is not None:  # bitsandbytes keeps the nested state inside the outer one
        tensors += [t for t in vars(state).values() if isinstance(t, torch.Tensor)]
        state = getattr(state, "state2", None)
    return tensors


def quantize_linears(
    model: nn.Module, compute_dtype: torch.dtype, fake: bool, device: torch.device
) -> list[nn.Module]:
    """Replace every `nn.Linear` of `model` by a 4-bit NF4 one on `device`; return the new layers.

    As transformers' and diffusers' loaders do, each weight is quantized as it reaches the GPU
    (the 16-bit model is never there whole), and a language model's output head stays 16-bit
    (transformers leaves `lm_head` out of the conversion)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is nn.Linear and module is not head
    ]
    layers = []
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = (
            Nf4LinearLayout(linear, compute_dtype, device)
            if fake
            else _bitsandbytes_layer(linear, compute_dtype, device)
        )
        setattr(parent, child, layer)
        layers.append(layer)
    return layers


def _bitsandbytes_layer(
    linear: nn.Linear, compute_dtype: torch.dtype, device: torch.device
) -> nn.Module:
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(
        linear.in_features, linear.out_features, bias=linear.bias is not None,
        compute_dtype=compute_dtype, quant_type="nf4", compress_statistics=True, device="meta",
    )  # fmt: skip
    layer.weight = bnb.nn.Params4bit(
        linear.weight.detach(), requires_grad=False, quant_type="nf4", compress_statistics=True
    )
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().to(device, copy=True), requires_grad=False)
    return layer.to(device)  # quantizes the weight on its way to the device
