"""base_precision: what the frozen base of a LoRA run is stored in.

- `same`: the run's frozen dtype (its 16-bit dtype under mixed precision).
- `fp8`: every linear and 2-D convolution weight of the trained model's base in float8 e4m3,
  upcast to the compute dtype layer by layer for its own matmul (kohya's `fp8_base`, OneTrainer's
  FLOAT_8 weights, diffusers' layerwise casting): half the base's bytes, at the price of one
  cast per layer per pass. The math stays 16-bit, so no GPU generation is ruled out; what the
  upcast copies cost is in autofit/techniques/quantization.py.

- `int8_sdnq`, `int8_sdnq_hadamard`: SimpleTuner's `int8-sdnq` base (and with
  `sdnq_use_hadamard`): SD.Next's SDNQ quantizer run as SimpleTuner runs it (autofit/
  techniques/quantization.py, `sdnq_base`), int8 weights with an fp32 scale per 32 (1.125 bytes a weight) and
  int8 matmuls; the Hadamard variant rotates each group of 128 inputs. SDNQ's own code on fake
  and real tensors; it skips the layers its own skip lists name.
- `fp8wo_torchao`: SimpleTuner's `fp8wo-torchao` base: torchao's `Float8WeightOnlyConfig` over
  the linear layers SimpleTuner's filter keeps (in and out features multiples of 16), float8 e4m3
  values with an fp32 scale per output row (autofit/techniques/quantization.py, `torchao_float8_base`),
  torchao's own code on fake and real tensors. Each matmul dequantizes its weight to the compute
  dtype and keeps that copy for the input's gradient, as the `fp8` cast does.
- `int8_quanto`, `fp8_quanto`: SimpleTuner's `int8-quanto` and `fp8-quanto` bases: optimum-
  quanto's own code (autofit/techniques/quantization.py, `quanto_base`) over the linear and 2-D convolution
  layers SimpleTuner does not exclude for the family, int8 or float8 e4m3 values with a 16-bit
  scale per output row, each matmul dequantizing its weight; quanto's linear function keeps every
  quantized layer's input for backward, which a frozen 16-bit layer does not. ai-toolkit's
  `quantize: true` is quanto's qfloat8 too, over every layer.
- `fp8_torchao`: SimpleTuner's `fp8-torchao` base: torchao's
  `Float8DynamicActivationFloat8WeightConfig`, e4m3 weights with one fp32 scale each, each
  layer's input quantized to float8 by torchao's code (autograd keeps what that saves) for a
  float8 matmul, which needs compute capability 8.9 or more; trained through a stand-in for
  SimpleTuner's autograd function around the matmul (autofit/techniques/torchao_float8.py).

Like QLoRA's quantizing loader, the base is built in host memory and each weight cast on its way
to the GPU: the 16-bit model never sits there whole. The companions (text encoders, VAE) keep
their own dtype. The base of a LoRA or a LyCORIS run.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.families import ai_toolkit, onetrainer, onetrainer_part, simpletuner
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.techniques.quanto_excluded import QUANTO_EXCLUDED

if TYPE_CHECKING:
    from autofit.run_state import RunState

NOT_FP8 = "base_precision=same"
SDNQ = ("int8_sdnq", "int8_sdnq_hadamard")  # SDNQ's int8 base, plain and Hadamard-rotated
# torchao's float8 bases: weight-only, and with float8 activations and matmuls
TORCHAO = ("fp8wo_torchao", "fp8_torchao")
# optimum-quanto's bases, by SimpleTuner's name, with the quanto qtype each is
QUANTO = {"int8_quanto": "qint8", "fp8_quanto": "qfloat8"}
# What quanto's quantization imports: its Marlin kernels' modules are imported at the first
# quantization and build permutation tables at import, so they are imported first, out of the
# step's memory.
QUANTO_LIBRARIES = ("optimum.quanto", "optimum.quanto.tensor.weights.marlin")
FLOAT8_MATMULS = (8, 9)  # the compute capability torchao's float8 matmuls need (Ada, Hopper)
FROZEN_BASE_MODES = ("lora", "lycoris")  # the train_mode values whose frozen base this stores


def _library(value: str) -> str:
    return "torchao" if value in TORCHAO else "quanto"


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    if value == "same":
        return Say()
    if value in SDNQ:
        return Refuse(
            "sd-scripts stores a base in fp8 at most (fp8_base), not in SDNQ's int8", NOT_FP8
        )
    if value in TORCHAO or value in QUANTO:
        kind = "quanto's int8" if value == "int8_quanto" else f"{_library(value)}'s float8"
        return Refuse(
            f"sd-scripts' fp8_base casts each weight to float8 without a scale, not {kind} with "
            "a scale per row",
            "base_precision=same, fp8",
        )
    # fp8_base_unet keeps the text encoders in 16-bit, as measured; fp8_base alone would cast
    # them too when they run online.
    return say(fp8_base=True, fp8_base_unet=True)


def _musubi(value: Any, s: Subject) -> Say | Refuse:
    """--fp8_base alone casts the DiT to float8 e4m3 without a scale (its norms and embeddings
    too, a little less than the measured linears alone: training/trainer_base.py, Wan's
    load_wan_model); --fp8_scaled (Wan's and Qwen-Image's) quantizes the blocks' linears with a scale per 64
    weights, which no value of autofit's is."""
    if value == "same":
        return Say()
    if value == "fp8":
        return say(**{"--fp8_base": True})
    return Refuse(
        "musubi-tuner's --fp8_base casts the DiT to float8 without a scale and its --fp8_scaled "
        "scales blocks of 64 weights; neither is this base",
        "base_precision=same, fp8",
    )


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    # Its quanto, SDNQ and TorchAO bases by the libraries' own code (its fp8-native, another
    # float8 matmul, is not modelled); a plain float8 cast is none of them.
    if value in SDNQ:
        hadamard = {"sdnq_use_hadamard": True} if value == "int8_sdnq_hadamard" else {}
        return say(base_model_precision="int8-sdnq", **hadamard)
    if value == "fp8":
        return Refuse(
            "SimpleTuner's float8 bases keep a scale per row (quanto's fp8-quanto keeps each "
            "layer's input for backward), not a plain cast",
            "base_precision=same, fp8_quanto, fp8wo_torchao",
        )
    word = "no_change" if value == "same" else value.replace("_", "-")
    model = simpletuner(s.family)
    if model is not None and word in model.refused_bases:
        return Refuse(
            f"SimpleTuner's {model.model_family} model refuses base_model_precision={word}"
        )
    return say(base_model_precision=word)


def _ai_toolkit(value: Any, s: Subject) -> Say | Refuse:
    """ai-toolkit's `quantize: true` runs optimum-quanto over the transformer with its `qtype`
    (qfloat8 unless told), `quantize_kwargs` going to its quantize() as they are
    (toolkit/util/quantize.py at 27a03a91): the layers autofit keeps in 16 bits are its
    `exclude`. It is said both ways: its examples turn it on."""
    if value == "same":
        return say(**{"model.quantize": False})
    model = ai_toolkit(s.family)
    if model is not None and not model.quantizes:
        return Refuse(
            f"ai-toolkit's {model.arch} loader keeps the base in train.dtype (it quantizes "
            "transformer models only)",
            NOT_FP8,
        )
    if value not in QUANTO:
        return Refuse(
            "ai-toolkit's float8 base is quanto's qfloat8 (fp8_quanto), its int8 quanto's qint8; "
            "its torchao and own quantizers are not this base",
            "base_precision=same, int8_quanto, fp8_quanto",
        )
    settings: dict[str, Any] = {"model.quantize": True, "model.qtype": QUANTO[value]}
    excluded = QUANTO_EXCLUDED.get(s.family)
    if excluded:
        settings["model.quantize_kwargs"] = {"exclude": list(excluded)}
    return Say(settings=settings)


def _onetrainer(value: Any, s: Subject) -> Say | Refuse:
    """OneTrainer's FLOAT_8 weights (modules/module/quantized/LinearFp8.py at 23df3832): float8
    e4m3 with one scale per layer, upcast to the compute dtype for each matmul, over every
    nn.Linear its quantization layer filter keeps (an empty filter: all). A 16-bit base's dtype
    is precision's words."""
    if value == "same":
        return Say()
    model = onetrainer(s.family)
    if value == "fp8" and model is not None and not model.fp8_matches:
        return Refuse(
            "OneTrainer's FLOAT_8 replaces the linear layers only and keeps the UNet's "
            "convolutions in 16 bits (modules/util/quantization_util.py), where autofit measured "
            "both in float8",
            NOT_FP8,
        )
    if value != "fp8":
        return Refuse(
            "OneTrainer's quantized bases are its own float8 with a scale per layer (FLOAT_8), "
            "bitsandbytes' INT_8 and NF4, W8A8 and GGUF, not SDNQ's, torchao's or quanto's",
            "base_precision=same, fp8",
        )
    part = onetrainer_part(s.family)
    return say(
        **{
            f"{part}.weight_dtype": "FLOAT_8",
            # every linear layer, as measured (its presets keep the blocks' only)
            "quantization.layer_filter": "",
            "quantization.layer_filter_preset": "full",
        }
    )


class BasePrecision(Knob):
    name = "base_precision"
    depends_on = ("swap_blocks", "train_mode", "zero_stage")
    default = "same"
    help = (
        "the frozen base under LoRA or LyCORIS: same (the run's dtype) | fp8 (float8, upcast per "
        "layer) | int8_sdnq, int8_sdnq_hadamard (SimpleTuner's int8-sdnq, by SDNQ) | "
        "fp8wo_torchao, fp8_torchao (SimpleTuner's fp8wo-torchao and fp8-torchao, by torchao) | "
        "int8_quanto, fp8_quanto (SimpleTuner's int8-quanto and fp8-quanto, by optimum-quanto)"
    )
    values = {
        "same": "the frozen base in the run's own dtype",
        "fp8": "the frozen base's linear and convolution weights stored in float8 e4m3 and cast "
        "to the compute dtype per layer, just before its matmul",
        "int8_sdnq": "the frozen base's linear weights quantized by SDNQ as SimpleTuner's "
        "int8-sdnq does (int8, an fp32 scale per 32 weights, int8 matmuls)",
        "int8_sdnq_hadamard": "as int8_sdnq, each group of 128 inputs Hadamard-rotated first "
        "(SimpleTuner's sdnq_use_hadamard)",
        "fp8wo_torchao": "the frozen base's linear weights quantized by torchao's "
        "Float8WeightOnlyConfig as SimpleTuner's fp8wo-torchao does (float8 e4m3, an fp32 scale "
        "per output row, dequantized for each matmul)",
        "int8_quanto": "the frozen base's linear and convolution weights quantized by "
        "optimum-quanto to int8 with a 16-bit scale per row, as SimpleTuner's int8-quanto does "
        "(each layer's input kept for backward, the weight dequantized for each matmul)",
        "fp8_quanto": "as int8_quanto in float8 e4m3 (SimpleTuner's fp8-quanto, ai-toolkit's "
        "quantize: true)",
        "fp8_torchao": "the frozen base's linear weights and each layer's input in float8 by "
        "torchao's Float8DynamicActivationFloat8WeightConfig, float8 matmuls, as SimpleTuner's "
        "fp8-torchao trains (a GPU of compute capability 8.9 or more)",
    }
    per_sample_memory = False
    reads = ("dtypes",)

    def libraries(self, value: Any) -> tuple[str, ...]:
        # sdnq through the module that sets SDNQ_USE_TORCH_COMPILE first; sdnq imports
        # transformers and bitsandbytes at its own import
        if value in SDNQ:
            return ("autofit.techniques.sdnq_eager", "transformers", "bitsandbytes")
        if value in QUANTO:
            return QUANTO_LIBRARIES
        return ("torchao",) if value in TORCHAO else ()

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # a cast (or a dequantization) per layer per pass buys it
        return "same" if value != "same" else None

    def applies(self, config: Any, preset: Any) -> bool:
        return config.get("train_mode", "full") in FROZEN_BASE_MODES

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "same":
            return None
        mode = context.knobs.get("train_mode", "full")
        if mode not in FROZEN_BASE_MODES:
            what = {"qlora": "has a 4-bit base already", "qdora": "has a 4-bit base already",
                    "full": "has no frozen base"}.get(mode, "is measured with a 16-bit base only")  # fmt: skip
            return f"base_precision={value} stores a LoRA run's frozen base: train_mode={mode} {what}; use train_mode=lora"
        if context.knobs.get("zero_stage"):
            return f"base_precision={value}: DeepSpeed ZeRO keeps the whole model in its 16-bit dtype; use zero_stage=0"
        if value == "fp8_torchao" and context.gpu.capability < FLOAT8_MATMULS:
            return f"base_precision=fp8_torchao runs float8 matmuls, which need compute capability 8.9 or more; {context.gpu.display} has {context.gpu.compute_capability}; use fp8wo_torchao"
        if (value in TORCHAO or value in QUANTO) and context.knobs.get("swap_blocks"):
            return f"base_precision={value} with swap_blocks: {_library(value)}'s weights streamed between host and GPU are not modelled"
        return None

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value == "same":
            return None
        return run.built_on_host()  # cast on the way to the GPU (apply)

    def apply(self, run: RunState, value: Any) -> None:
        if value == "same":
            return
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.run_state import move_to_device
        from autofit.techniques.quantization import (
            float8_layers,
            quanto_base,
            sdnq_base,
            torchao_float8_base,
        )

        if value in TORCHAO or value in SDNQ or value in QUANTO:  # a library's, on the device
            if value in TORCHAO:
                weights, kept = torchao_float8_base(run, dynamic=value == "fp8_torchao")
            elif value in SDNQ:
                weights, kept = sdnq_base(run, hadamard=value == "int8_sdnq_hadamard")
            else:
                weights, kept = quanto_base(run, QUANTO[value])
            move_to_device(run, run.model, skip={id(w) for w in weights})
            run.tag(kept, "parameters")
            return
        layers = float8_layers(run.model, run.dtypes.autocast or run.dtypes.weights, run)
        cast = {id(t) for layer in layers for t in layer.parameters()}
        move_to_device(run, run.model, skip=cast)
        run.tag([t for layer in layers for t in layer.parameters()], "parameters")

    trainers = {
        "kohya": _kohya,
        "simpletuner": _simpletuner,
        "sana": lambda v, s: (
            Say() if v == "same" else Refuse("Sana's train.py has no quantized base", NOT_FP8)
        ),
        "diffusers": lambda v, s: (
            Say()
            if v == "same"
            else Refuse(
                "the diffusers example scripts store the base in the 16-bit weight dtype "
                "(their --do_fp8_training is float8 compute through torchao, another run)",
                NOT_FP8,
            )
        ),
        "musubi": _musubi,
        "ai_toolkit": _ai_toolkit,
        "onetrainer": _onetrainer,
    }
