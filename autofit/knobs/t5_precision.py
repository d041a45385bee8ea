"""t5_precision: what the T5-XXL text encoder (Flux's, SD3's) is stored in while it encodes on the
GPU (encoders=online or text).

- `same`: its own dtype (bf16), 9.5 GB.
- `fp8_quanto`, `int8_quanto`: optimum-quanto's own `quantize` and `freeze` over its linear
  layers (autofit/techniques/quantization.py, `quanto_quantize`), float8 e4m3 or int8 values with a 16-bit
  scale per row, half the bytes; each matmul dequantizes its weight. As ai-toolkit loads it
  (2024: `quantize(text_encoder_2, weights=qfloat8)`; `quantize_te` since): the 16-bit encoder
  built on the GPU, then quantized there layer by layer (its whole 16-bit size sits there once,
  while it loads). SimpleTuner's `text_encoder_N_precision` names the same quantization.

Only the T5 encoder: the CLIP encoders beside it stay in their own dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.base_precision import QUANTO, QUANTO_LIBRARIES
from autofit.models import ModelPreset

if TYPE_CHECKING:
    from autofit.run_state import RunState

ON_GPU = ("online", "text")  # the encoders values that hold the text encoders on the GPU


def t5_encoder(preset: ModelPreset) -> str | None:
    """The companion name of the preset's T5 encoder, if it has one."""
    for name, spec in preset.companions.items():
        if isinstance(spec, Mapping) and spec.get("kind") == "t5_encoder":
            return name
    return None


def _simpletuner(value: Any, s: Subject) -> Say:
    name = t5_encoder(s.preset)
    if value == "same" or name is None:
        return Say()
    return say(**{f"{name}_precision": value.replace("_", "-")})


def _ai_toolkit(value: Any, s: Subject) -> Say | Refuse:
    """ai-toolkit quantizes T5 when `quantize_te` says (its default: what `quantize` says), with
    the base's `qtype` (the flux and chroma loaders at 27a03a91): said both ways."""
    if value == "same":
        return say(**{"model.quantize_te": False})
    base = s.config.get("base_precision", "same")
    if base not in ("same", value):
        return Refuse(
            f"ai-toolkit quantizes T5 with the base's qtype (base_precision={base})",
            f"t5_precision=same, {base}" if base in QUANTO else "t5_precision=same",
        )
    settings: dict[str, Any] = {"model.quantize_te": True}
    if base == "same":  # the qtype is then T5's alone
        settings["model.qtype"] = QUANTO[value]
    return Say(settings=settings)


class T5Precision(Knob):
    name = "t5_precision"
    depends_on = ("base_precision", "encoders")
    default = "same"
    help = (
        "the T5-XXL text encoder on the GPU: same (its bf16) | fp8_quanto, int8_quanto "
        "(optimum-quanto, as ai-toolkit's and SimpleTuner's quantized text encoders)"
    )
    values = {
        "same": "the T5 encoder in its own dtype",
        "fp8_quanto": "the T5 encoder's linear weights quantized by optimum-quanto to float8 "
        "with a 16-bit scale per row (ai-toolkit's qfloat8, SimpleTuner's fp8-quanto)",
        "int8_quanto": "as fp8_quanto in int8 (SimpleTuner's int8-quanto)",
    }
    per_sample_memory = False
    after = ("encoders",)

    def libraries(self, value: Any) -> tuple[str, ...]:
        return () if value == "same" else QUANTO_LIBRARIES

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("encoders", "cached") in ON_GPU and t5_encoder(preset) is not None

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "same" if value != "same" else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "same":
            return None
        if t5_encoder(context.model) is None:
            return f"t5_precision={value} quantizes a T5 text encoder, which {context.model.name} does not have"
        encoders = context.knobs.get("encoders", "cached")
        if encoders not in ON_GPU:
            return f"t5_precision={value} quantizes the T5 encoder on the GPU: encoders={encoders} leaves it off; use encoders=online or text"
        return None

    def apply(self, run: RunState, value: Any) -> None:
        if value == "same":
            return
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.techniques.quantization import quanto_quantize

        encoder = run.companions[t5_encoder(run.preset)]  # type: ignore[index]
        _, kept = quanto_quantize(encoder, QUANTO[value], None)  # built on the GPU
        # its quantized weights, and the one-number scales each quanto layer registers
        run.tag([*kept, *encoder.buffers()], "parameters")

    trainers = {
        "simpletuner": _simpletuner,
        "kohya": lambda v, s: (
            Say()
            if v == "same"
            else Refuse(
                "sd-scripts casts T5 to float8 without a scale (fp8_base, or an fp8 checkpoint), "
                "not quanto's weights with a scale per row"
            )
        ),
        "diffusers": lambda v, s: (
            Say()
            if v == "same"
            else Refuse("the diffusers example scripts load the text encoders in the weight dtype")
        ),
        "ai_toolkit": _ai_toolkit,
        # OneTrainer stores a text encoder in its weight_dtype (the layout writes the companion's)
        "onetrainer": lambda v, s: (
            Say()
            if v == "same"
            else Refuse(
                "OneTrainer quantizes a text encoder to its own float8 (FLOAT_8, one scale per "
                "layer) or bitsandbytes' int8, not optimum-quanto's"
            )
        ),
    }
