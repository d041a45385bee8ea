"""A frozen base stored in fewer bytes than it computes in.

- QLoRA's 4-bit base: bitsandbytes' NF4 `Linear4bit` on real tensors, its memory layout
  (autofit/emulations/nf4_layout.py) on fake ones.
- An fp8 base (kohya's `fp8_base`): each frozen linear and
  convolution weight stored in float8 e4m3 and upcast to the compute dtype for its own matmul, as
  torch autocast upcasts kohya's fp8 weights. The upcast copy is an ordinary tensor: the matmul
  saves it for the input's gradient, so without gradient checkpointing every layer's 16-bit copy
  lives until its backward; with checkpointing only the recomputed block's do. Real float8
  storage on every backend (a CPU build casts float8 too); no GPU needs fp8 arithmetic for it.
- SimpleTuner's int8 SDNQ base (`int8-sdnq`): SD.Next's quantizer (the sdnq library) run as
  SimpleTuner runs it, on fake and real tensors alike (`sdnq_base`).
- SimpleTuner's quanto bases (`int8-quanto`, `fp8-quanto`): optimum-quanto's own `quantize` and
  `freeze` over the layers SimpleTuner leaves to it, on fake and real tensors (`quanto_base`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from typing import Any

import torch
from torch import nn

from autofit.emulations.nf4_layout import Nf4LinearLayout
from autofit.techniques.quanto_excluded import QUANTO_EXCLUDED
from autofit.techniques.torchao_float8 import (
    make_float8_matmuls_trainable,
    target_has_float8_matmuls,
)

FP8 = torch.float8_e4m3fn


class Float8Linear(nn.Linear):
    """A frozen `nn.Linear` whose weight is kept in float8 and upcast for each forward."""

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype, device: torch.device) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a full weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = compute_dtype
        self.weight = _float8(linear.weight, device)
        self.bias = _frozen_copy(linear.bias, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight.to(self.compute_dtype), self.bias)


class Float8Conv2d(nn.Conv2d):
    """A frozen `nn.Conv2d` whose weight is kept in float8 and upcast for each forward."""

    def __init__(self, conv: nn.Conv2d, compute_dtype: torch.dtype, device: torch.device) -> None:
        nn.Module.__init__(self)
        for name in (
            "in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
            "transposed", "output_padding", "groups", "padding_mode",
            "_reversed_padding_repeated_twice",
        ):  # fmt: skip
            setattr(self, name, getattr(conv, name))
        self.compute_dtype = compute_dtype
        self.weight = _float8(conv.weight, device)
        self.bias = _frozen_copy(conv.bias, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight.to(self.compute_dtype), self.bias)


def _float8(weight: torch.Tensor, device: torch.device) -> nn.Parameter:
    # Cast on the host, then moved: the 16-bit weight never reaches the GPU.
    return nn.Parameter(weight.detach().to(FP8).to(device), requires_grad=False)


def _frozen_copy(bias: torch.Tensor | None, device: torch.device) -> nn.Parameter | None:
    if bias is None:
        return None
    return nn.Parameter(bias.detach().to(device, copy=True), requires_grad=False)


def float8_layers(model: nn.Module, compute_dtype: torch.dtype, run: Any) -> list[nn.Module]:
    """Replace every linear and 2-D convolution of `model` (a language model's output head
    excepted, as for QLoRA) by its float8 counterpart on the run's device, or in host memory
    where the run keeps the layer there (a swapped block); return the new layers."""
    kinds = {nn.Linear: Float8Linear, nn.Conv2d: Float8Conv2d}

    def make(name: str, layer: nn.Module) -> nn.Module:
        if run.stays_on_host(name):
            with run.host():
                return kinds[type(layer)](layer, compute_dtype, run.host_device)
        return kinds[type(layer)](layer, compute_dtype, run.device)

    return _replace(model, tuple(kinds), make)


def _replace(model: nn.Module, kinds: tuple[type, ...], make: Any) -> list[nn.Module]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) in kinds and module is not head
    ]
    layers = []
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = make(name, module)
        setattr(parent, child, layer)
        layers.append(layer)
    return layers


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
    return _replace(
        model,
        (nn.Linear,),
        lambda _name, linear: (
            Nf4LinearLayout(linear, compute_dtype, device)
            if fake
            else _bitsandbytes_layer(linear, compute_dtype, device)
        ),
    )


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


def subclass_parts(weight: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a quantized weight (a tensor subclass: SDNQ's, torchao's) holds."""
    names, _ = weight.__tensor_flatten__()
    return [getattr(weight, name) for name in names]


# SimpleTuner's int8-sdnq as its quantisation.py sets it (bghira/SimpleTuner, helpers/training/
# quantisation.py, _sdnq_model): int8 weights with a scale per 32 of them, int8 matmuls (its
# default wherever SDNQ compiles, which a GPU with Triton does), static quantization with
# stochastic rounding, dequantized through fp32; the Hadamard variant rotates groups of 128.
SDNQ_INT8 = {
    "weights_dtype": "int8", "quantized_matmul_dtype": "int8", "group_size": 32,
    "hadamard_group_size": 128, "svd_rank": 32, "svd_steps": 2, "use_svd": False,
    "use_quantized_matmul": True, "use_static_quantization": True,
    "use_stochastic_rounding": True, "dequantize_fp32": True, "non_blocking": False,
    "add_skip_keys": True,
}  # fmt: skip


def sdnq_base(run: Any, hadamard: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The trained model's base quantized by SDNQ to int8 as SimpleTuner quantizes it, each weight
    quantized on the run's device as it loads (SimpleTuner's quantize_via=accelerator); returns
    the quantized weights and the tensors they keep (their int8 values and scales).

    SDNQ compiles its (de)quantization with torch.compile where it can; autofit runs it eagerly on
    every backend (SDNQ_USE_TORCH_COMPILE=0, read when sdnq is first imported): compiling fuses its
    temporaries, which the eager code holds a moment longer, and leaves the stored layout and what
    its autograd functions save for backward as they are."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    # lazy: SDNQ is optional, and sdnq_eager imports it (with diffusers and transformers)
    from autofit.techniques.sdnq_eager import sdnq_training_post_load_quant

    skipped = [".proj_out"] if run.preset.family == "flux" else []  # SimpleTuner's, for Flux
    model = sdnq_training_post_load_quant(
        run.model, **SDNQ_INT8, use_hadamard=hadamard,
        use_grad_ckpt=bool(run.knobs.get("checkpointing", False)),
        modules_to_not_convert=skipped, quantization_device=run.device,
        return_device=run.device,
    )  # fmt: skip
    assert model is run.model  # quantized in place
    weights, kept = [], []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if weight is not None and is_traceable_wrapper_subclass(weight):
            weight.requires_grad_(False)
            weights.append(weight)
            kept += subclass_parts(weight)
    return weights, kept


def simpletuner_torchao_layer(module: nn.Module) -> bool:
    """The layers SimpleTuner's TorchAO precisions quantize (helpers/training/quantisation,
    `_torchao_filter_fn`): every `nn.Linear` whose in and out features are multiples of 16."""
    return (
        type(module) is nn.Linear and module.in_features % 16 == 0 and module.out_features % 16 == 0
    )


def torchao_float8_base(run: Any, dynamic: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The trained model's base as SimpleTuner's TorchAO float8 precisions store it, torchao's
    own code on fake and real tensors over the layers `simpletuner_torchao_layer` keeps, each
    moved to the run's device and quantized there (SimpleTuner quantizes on the accelerator):

    - `dynamic=False`, its fp8wo-torchao: `Float8WeightOnlyConfig`, float8 e4m3 values with an
      fp32 scale per output row, the weight dequantized to the compute dtype for each matmul;
    - `dynamic=True`, its fp8-torchao: `Float8DynamicActivationFloat8WeightConfig`, e4m3 values
      with one fp32 scale per weight, each input quantized to float8 for a float8 matmul, trained
      through autofit/techniques/torchao_float8.py.

    Returns the quantized weights, with the biases moved beside them, and the tensors they keep."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    from torchao.quantization import quantize_
    from torchao.quantization.quant_api import (
        Float8DynamicActivationFloat8WeightConfig,
        Float8WeightOnlyConfig,
    )

    if dynamic:
        make_float8_matmuls_trainable()
    weights: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []
    for _name, module in list(run.model.named_modules()):
        if not simpletuner_torchao_layer(module):
            continue
        for param in module.parameters(recurse=False):
            param.data = param.data.to(run.device, copy=True)
        if dynamic:
            with target_has_float8_matmuls():
                quantize_(module, Float8DynamicActivationFloat8WeightConfig())
        else:
            quantize_(module, Float8WeightOnlyConfig())
        weight = module.weight
        assert is_traceable_wrapper_subclass(weight), "torchao left a layer unquantized"
        weight.requires_grad_(False)
        weights.append(weight)
        kept += subclass_parts(weight)
        if module.bias is not None:
            weights.append(module.bias)
            kept.append(module.bias)
    return weights, kept


@contextmanager
def _empty_modules_assigned() -> Iterator[None]:
    """quanto builds each quantized layer on the meta device and moves it with `to_empty`, whose
    fake parameters torch swaps in place, which autofit's tracker (it holds a weak reference to
    every tensor) forbids: the empty tensors are assigned instead, as `to_empty` does for real
    ones. Only the placeholders quanto overwrites at once take this path."""

    def to_empty(module: nn.Module, *, device: Any, recurse: bool = True) -> nn.Module:
        for child in module.modules() if recurse else [module]:
            for key, value in child._parameters.items():
                if value is not None:
                    empty = torch.empty_like(value, device=device)
                    child._parameters[key] = nn.Parameter(empty, value.requires_grad)
            for key, value in child._buffers.items():
                if value is not None:
                    child._buffers[key] = torch.empty_like(value, device=device)
        return module

    original = nn.Module.to_empty
    nn.Module.to_empty = to_empty  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.to_empty = original  # type: ignore[method-assign]


def quanto_base(run: Any, qtype_name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The trained model's base quantized by optimum-quanto as SimpleTuner's `<qtype>-quanto`
    precisions quantize it (`quantize(model, weights=..., exclude=...)`, then `freeze`), layer by
    layer on the run's device as each loads; returns the quantized weights, with the biases
    beside them, and the tensors they keep (their 8-bit values and a 16-bit scale per row).

    quanto's linear function keeps every quantized layer's input for backward, whether or not
    its weight trains (`QuantizedLinearFunction.save_for_backward(input, other)`), which a frozen
    16-bit layer does not; on a CUDA build with its extension compiled an fp8 weight may be
    Marlin-packed, the same bytes."""
    excluded = QUANTO_EXCLUDED.get(run.preset.family, ())
    return quanto_quantize(run.model, qtype_name, run.device, excluded)


def quanto_quantize(
    model: nn.Module,
    qtype_name: str,
    device: torch.device | None,
    excluded: tuple[str, ...] = (),
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every linear and 2-D convolution of `model` (but those `excluded` names) quantized by
    optimum-quanto's `quantize` and `freeze`, one layer at a time: each layer's weights first
    copied to `device` from the host-built model (None: quantized where they are, on the GPU
    already); returns the quantized weights and biases, and the tensors they keep."""
    from optimum.quanto import freeze, qtypes, quantize
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    weights: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []
    for name, module in list(model.named_modules()):
        if type(module) not in (nn.Linear, nn.Conv2d) or any(fnmatch(name, p) for p in excluded):
            continue
        for param in module.parameters(recurse=False) if device is not None else ():
            param.data = param.data.to(device, copy=True)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        with _empty_modules_assigned():
            quantize(parent, weights=qtypes[qtype_name], include=child)
        layer = getattr(parent, child)
        freeze(layer)
        assert is_traceable_wrapper_subclass(layer.weight), "quanto left a layer unquantized"
        layer.weight.requires_grad_(False)
        weights.append(layer.weight)
        kept += subclass_parts(layer.weight)
        if layer.bias is not None:
            weights.append(layer.bias)
            kept.append(layer.bias)
    return weights, kept
