"""precision: which dtype the weights are kept in and which dtype the math runs in.

- `fp32`: fp32 weights, fp32 math.
- `fp16`: fp32 master weights, autocast to fp16, dynamic loss scaling (fp16 gradients underflow).
- `bf16`: fp32 master weights, autocast to bf16; no loss scaling (bf16 has fp32's range).
- `bf16_pure`: bf16 weights, gradients and optimizer states, no autocast (torchtune, LitGPT's
  bf16-true, a plain loop on a bf16 model).
- `bf16_autocast`: bf16 weights, gradients and optimizer states under bf16 autocast, as
  accelerate's mixed_precision=bf16 runs a bf16 model (SimpleTuner; kohya's full_bf16): the ops
  autocast keeps in fp32 (norms, softmax, losses) make fp32 outputs, and the activations a step
  keeps are larger than bf16_pure's.

This knob owns the run's dtype policy, decided once before the model exists, from its own value
and the two other knobs that change what the weights are kept in: a LoRA or QLoRA base is frozen
in the 16-bit dtype, and DeepSpeed ZeRO runs the whole model in 16-bit with fp32 master weights
inside its optimizer (its own loss scaling, no autocast).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.families import onetrainer_part
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.precision import language_models
from autofit.knobs.precision.shared import BF16_WEIGHTS
from autofit.knobs.train_mode.shared import FOUR_BIT_MODES
from autofit.knobs.zero_stage import sixteen_bit_block

if TYPE_CHECKING:
    from autofit.gpus import GpuSpec
    from autofit.run_state import DtypePolicy, RunState


BF16_PURE_NOTE = (
    "precision=bf16_pure: create the model in bf16 (weights, gradients and optimizer states in "
    "bf16, no autocast); the launcher's mixed_precision stays 'no'"
)


def dtype_policy(knobs: Mapping[str, Any]) -> DtypePolicy:
    """The run's dtypes from its knobs: the one place they are decided."""
    # lazy: the knobs load without torch (docs/contributing.md)
    import torch

    from autofit.run_state import DtypePolicy

    precision = knobs["precision"]
    bf16 = torch.bfloat16
    frozen = {"fp16": torch.float16, "bf16": bf16, **dict.fromkeys(BF16_WEIGHTS, bf16)}.get(
        precision, torch.float32
    )
    sixteen_bit_model = bool(knobs.get("zero_stage"))  # DeepSpeed keeps the model in 16-bit
    frozen_base = knobs.get("train_mode", "full") != "full"  # LoRA trains adapters on it
    if precision in BF16_WEIGHTS or sixteen_bit_model or frozen_base:
        weights = frozen
    else:
        weights = torch.float32
    autocast_dtypes = {"fp16": torch.float16, "bf16": bf16, "bf16_autocast": bf16}
    autocast = None if sixteen_bit_model else autocast_dtypes.get(precision)
    # fp32 master weights under mixed precision (diffusers' cast_training_params for adapters);
    # bf16 where the weights themselves are; DeepSpeed's 16-bit model keeps its masters inside.
    trained = (
        bf16 if precision in BF16_WEIGHTS else (weights if sixteen_bit_model else torch.float32)
    )
    return DtypePolicy(
        weights=weights,
        frozen=frozen,
        trained=trained,
        autocast=autocast,
        loss_scaling=autocast is torch.float16,
    )


def _loss_scaler(device_type: str) -> Any:
    import torch

    class LossScaler(torch.amp.GradScaler):
        """GradScaler that always applies the update.

        A probe measures the step of a long run, whose gradients are finite almost always. Stock
        GradScaler skips the update while it calibrates its scale in the first steps (fp16
        overflows at the initial scale of 2**16), which would leave the optimizer state
        unallocated and the step short; and a fake tensor cannot say whether it overflowed.
        Fused optimizers take the scale themselves and never reach this method.
        """

        def _maybe_opt_step(
            self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
        ) -> Any:
            return optimizer.step(*args, **kwargs)

    return LossScaler(device_type)


# -- trainers ---------------------------------------------------------------------------------

BF16_AUTOCAST_NOTE = (
    "precision=bf16_autocast: create the model in bf16 (weights, gradients and optimizer states in "
    "bf16); the launcher's bf16 mixed precision runs it under autocast"
)
ACCELERATE = {
    "fp32": say(mixed_precision="no"),
    "fp16": say(mixed_precision="fp16"),
    "bf16": say(mixed_precision="bf16"),
    "bf16_pure": say(note=BF16_PURE_NOTE, mixed_precision="no"),
    "bf16_autocast": say(note=BF16_AUTOCAST_NOTE, mixed_precision="bf16"),
}


def _deepspeed(value: Any, s: Subject) -> Say | Refuse:
    """With ZeRO the probe ran DeepSpeed's own mixed precision: a 16-bit model with fp32 master
    weights in the optimizer (`bf16` / `fp16` blocks). Without ZeRO it ran fp32 weights under
    torch autocast, which DeepSpeed writes as `torch_autocast` (with a GradScaler for fp16); a
    bf16_pure model is bf16 itself, so no block at all."""
    if s.config["zero_stage"]:
        if value not in ("bf16", "fp16"):
            return Refuse(
                "ZeRO runs a 16-bit model with fp32 master weights (precision bf16 or fp16); "
                "autofit measured no other precision with zero_stage >= 1"
            )
        return Say(settings=sixteen_bit_block(value))
    if value in ("bf16", "fp16", "bf16_autocast"):
        dtype = "float16" if value == "fp16" else "bfloat16"
        note = BF16_AUTOCAST_NOTE if value == "bf16_autocast" else ""
        return say(note=note, torch_autocast={"enabled": True, "dtype": dtype})
    if value == "bf16_pure":
        return say(
            note="precision=bf16_pure: create the model in bf16; the config has no precision block"
        )
    return Say()


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    """SimpleTuner's `mixed_precision` is also the dtype the trained weights are kept in
    (mixed_precision=bf16 trains bf16 weights, run under accelerate's bf16 autocast); fp32 master
    weights under autocast exist only through DeepSpeed."""
    if s.config["zero_stage"] and value in ("bf16", "fp16"):
        return say(mixed_precision=value)  # DeepSpeed's 16-bit model, fp32 master weights
    if value == "bf16_autocast":
        return say(mixed_precision="bf16")
    if value == "fp32":
        return say(mixed_precision="no")
    if value == "bf16_pure":
        return Refuse(
            "SimpleTuner runs its bf16 model under accelerate's bf16 autocast, whose fp32 norm and "
            "softmax outputs hold more than the measured run without autocast"
        )
    return Refuse(
        "SimpleTuner keeps the trained weights in its mixed_precision dtype (mixed_precision=bf16 "
        "trains bf16 weights: precision=bf16_autocast); it has no fp32-master-weight mode without "
        "DeepSpeed"
    )


KOHYA: dict[str, Say | Refuse] = {
    "fp32": say(mixed_precision="no", save_precision="float"),
    "fp16": say(mixed_precision="fp16", save_precision="fp16"),
    "bf16": say(mixed_precision="bf16", save_precision="bf16"),
    # bf16 weights, gradients and optimizer states, under accelerate's autocast
    "bf16_autocast": say(mixed_precision="bf16", full_bf16=True, save_precision="bf16"),
    "bf16_pure": Refuse(
        "sd-scripts runs full_bf16 under accelerate's bf16 autocast (precision=bf16_autocast), "
        "whose fp32 norm and softmax outputs hold more than the measured run without autocast"
    ),
}
# sd-scripts' SDXL guide (docs/sdxl_train_network.md at 48d368fa, "Recommended Settings"): under
# fp16 run the VAE in fp32 (--no_half_vae), as SDXL's VAE can make NaNs in fp16.
NO_HALF_VAE = (
    "sd-scripts' SDXL guide asks for --no_half_vae under fp16 (SDXL's VAE can make NaNs in fp16)"
)


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    """With cached latents sd-scripts encodes them before training and moves the VAE to the CPU
    (train_network.py), so the guide's fp32 VAE costs the training step nothing; latents encoded
    every step keep the VAE on the GPU, where fp32 holds more than the measured fp16."""
    words = KOHYA[value]
    if value != "fp16" or s.family != "sdxl" or not isinstance(words, Say):
        return words
    if s.config.get("encoders", "cached") in ("cached", "text"):  # latents cached
        return Say(settings={**words.settings, "no_half_vae": True})
    return Say(
        settings=words.settings,
        warning=f"{NO_HALF_VAE}, which keeps the VAE on the GPU in fp32 when latents are encoded "
        "every step (more than measured): cache them (encoders=cached) to add it at no cost",
    )


def _musubi(value: Any, s: Subject) -> Say | Refuse:
    """musubi-tuner keeps the DiT in its 16-bit dtype and the LoRA weights in fp32 (its network
    dtype) under accelerate's autocast (training/trainer_base.py): autofit's mixed precision. Wan's
    dtype is its checkpoint's (bf16 weights need --mixed_precision bf16, fp16 ones fp16);
    HunyuanVideo's is --dit_dtype (bf16 by default); Qwen-Image's is bf16 always."""
    if value == "bf16":
        return say(**{"--mixed_precision": "bf16"})
    if value == "fp16":
        if s.family == "qwen_image":
            return Say(
                settings={"--mixed_precision": "fp16"},
                warning="musubi-tuner keeps Qwen-Image's DiT in bf16 whatever --mixed_precision "
                "says (qwen_image_train_network.py sets its dit_dtype): the same bytes as the "
                "fp16 weights measured, each layer's cast to fp16 by autocast as it runs",
            )
        if s.family == "hunyuan_video":
            return say(**{"--mixed_precision": "fp16", "--dit_dtype": "float16"})
        return say(
            note="precision=fp16: give --dit an fp16 checkpoint (musubi-tuner trains a Wan DiT "
            "in its checkpoint's dtype and asks --mixed_precision fp16 for fp16 weights)",
            **{"--mixed_precision": "fp16"},
        )
    if value == "fp32":
        return Refuse(
            "musubi-tuner keeps the DiT in its 16-bit dtype whatever --mixed_precision says "
            "(measured: an fp32 model)"
        )
    return Refuse("musubi-tuner keeps LoRA weights in fp32 (measured: bf16 ones)")


KEEPS_FP32_WEIGHTS = (
    "keeps fp32 weights under accelerate's mixed precision; it has no bf16-weight mode"
)


# ai-toolkit 27a03a91 (jobs/process/BaseSDTrainProcess.py): the model loads in train.dtype and
# trains without autocast (its Accelerator has no mixed precision); a LoRA network is forced to
# fp32, and each adapter casts its layer's input to fp32 for its own matmuls
# (toolkit/network_mixins.py), the result back to the layer's dtype. No loss scaling.
AI_TOOLKIT_DTYPES = {"fp32": "fp32", "bf16": "bf16", "bf16_pure": "bf16"}
AI_TOOLKIT_LORA_COPIES = (
    "ai-toolkit runs its bf16 base without autocast and its fp32 LoRA on an fp32 copy of each "
    "adapted layer's input (toolkit/network_mixins.py), where the measured run kept bf16 inputs "
    "under bf16 autocast"
)


def _ai_toolkit(value: Any, s: Subject) -> Say | Refuse:
    mode = s.config.get("train_mode", "full")
    if value == "fp16":
        return Refuse("ai-toolkit trains fp16 without loss scaling or fp32 master weights")
    if mode in ("full", "freeze"):  # the trained weights are the model's own, in train.dtype
        if value in ("fp32", "bf16_pure"):
            return say(**{"train.dtype": AI_TOOLKIT_DTYPES[value]})
        return Refuse(
            "ai-toolkit fine-tunes the model in its train.dtype without autocast: fp32, or bf16 "
            "weights, gradients and optimizer states (precision=bf16_pure)",
            "precision=fp32, bf16_pure",
        )
    if value == "fp32":  # fp32 base and adapters, no autocast: as measured
        return say(**{"train.dtype": "fp32"})
    if value != "bf16":
        return Refuse("ai-toolkit keeps its LoRA weights in fp32 (measured: bf16 ones)")
    if not s.config.get("checkpointing"):
        return Refuse(
            f"{AI_TOOLKIT_LORA_COPIES}: without checkpointing every block keeps those copies "
            "through the backward pass",
            "precision=bf16 with checkpointing=true, or fp32",
        )
    return Say(
        settings={"train.dtype": "bf16"},
        warning=f"{AI_TOOLKIT_LORA_COPIES}: with checkpointing those copies live only within "
        "the block being recomputed, a little more than measured at the peak",
    )


# OneTrainer 23df3832: every part loads in its weight_dtype, a LoRA in lora_weight_dtype, and
# the step runs under torch autocast to train_dtype, fp32 included (modules/util/dtype_util.py
# create_autocast_context); fp16 scales the loss when every trained weight is fp32
# (enable_grad_scaling). A quantized base's dtype is base_precision's or train_mode's words.
ONETRAINER_TRAIN_DTYPES = {"fp32": "FLOAT_32", "fp16": "FLOAT_16", "bf16": "BFLOAT_16", "bf16_autocast": "BFLOAT_16"}  # fmt: skip


def _onetrainer(value: Any, s: Subject) -> Say | Refuse:
    if value not in ONETRAINER_TRAIN_DTYPES:
        return Refuse(
            "OneTrainer runs a 16-bit train_dtype under torch autocast (modules/util/dtype_util.py): "
            "bf16 weights train as precision=bf16_autocast"
        )
    part = onetrainer_part(s.family)
    sixteen_bit = ONETRAINER_TRAIN_DTYPES[value]  # the frozen base's dtype, bf16 weights' too
    trained = "BFLOAT_16" if value == "bf16_autocast" else "FLOAT_32"
    settings: dict[str, Any] = {"train_dtype": ONETRAINER_TRAIN_DTYPES[value]}
    mode = s.config.get("train_mode", "full")
    if mode == "full":
        settings[f"{part}.weight_dtype"] = trained
        return Say(settings=settings)
    settings["lora_weight_dtype"] = trained
    if mode not in FOUR_BIT_MODES and s.config.get("base_precision", "same") == "same":
        settings[f"{part}.weight_dtype"] = sixteen_bit
    return Say(settings=settings)


class Precision(Knob):
    name = "precision"
    depends_on = ("base_precision", "checkpointing", "encoders", "fsdp", "train_mode", "zero_stage")
    default = "bf16"
    help = (
        "weight and math dtypes: fp32 | fp16 (mixed) | bf16 (mixed) | bf16_pure (bf16 weights) | "
        "bf16_autocast (bf16 weights under autocast)"
    )
    values = {
        "fp32": "fp32 weights and fp32 math",
        "fp16": "fp32 master weights under fp16 autocast, with dynamic loss scaling",
        "bf16": "fp32 master weights under bf16 autocast",
        "bf16_pure": "bf16 weights, gradients and optimizer states, no autocast",
        "bf16_autocast": "bf16 weights, gradients and optimizer states, run under bf16 autocast",
    }
    # A trainer told nothing trains in fp32: mixed bf16 must be asked for.
    default_asks_nothing = False
    writes = ("dtypes", "scaler")

    def needless_without_trainer(self, value: Any, searched: tuple[Any, ...]) -> str | None:
        # bf16_autocast runs bf16_pure's model under autocast: never less memory, never faster.
        # It is searched for the trainers that run their bf16 models only that way.
        if value == "bf16_autocast" and "bf16_pure" in searched:
            return (
                "precision=bf16_autocast holds at least what bf16_pure holds at the same speed: "
                "searched only for a trainer that runs bf16 under autocast (simpletuner, kohya, trl)"
            )
        return None

    def needless_on(self, value: Any, searched: tuple[Any, ...], gpu: GpuSpec) -> str | None:
        # fp16 holds what bf16 holds, at its speed, and needs loss scaling (its gradients
        # underflow): the spaces list it for the cards without bf16 (T4, V100, RTX 20xx).
        if value == "fp16" and gpu.bf16 and "bf16" in searched:
            return (
                f"precision=fp16 holds what bf16 holds, at its speed, with loss scaling: searched "
                f"only on GPUs without bf16 ({gpu.display} has it)"
            )
        return None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        gpu = context.gpu
        if value.startswith("bf16") and not gpu.bf16:
            return (
                f"precision={value} needs bf16, which {gpu.display} (compute capability "
                f"{gpu.compute_capability}) does not have; use fp16 or fp32"
            )
        return None

    def prepare(self, run: RunState, value: Any) -> None:
        run.dtypes = dtype_policy(run.knobs)

    def apply(self, run: RunState, value: Any) -> None:
        if run.dtypes.loss_scaling:
            run.scaler = _loss_scaler(run.device.type)

    def forward_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        import torch

        if run.dtypes.autocast is None:
            return None
        # On the CPU backends the CPU autocast runs with CUDA's cast policy installed
        # (autofit/simulator/cuda_autocast.py), so activations get the dtypes a GPU would give.
        return torch.autocast(run.device.type, dtype=run.dtypes.autocast)

    trainers = {
        "accelerate": ACCELERATE,
        "deepspeed": _deepspeed,
        "simpletuner": _simpletuner,
        "kohya": _kohya,
        "sana": {
            "fp32": say(**{"model.mixed_precision": "fp32"}),
            "fp16": say(**{"model.mixed_precision": "fp16"}),
            "bf16": say(**{"model.mixed_precision": "bf16"}),
            "bf16_pure": Refuse(f"Sana's train.py {KEEPS_FP32_WEIGHTS} (model.mixed_precision)"),
            "bf16_autocast": Refuse(
                f"Sana's train.py {KEEPS_FP32_WEIGHTS} (model.mixed_precision)"
            ),
        },
        "diffusers": {
            **{
                value: say(**{"--mixed_precision": ACCELERATE[value].settings["mixed_precision"]})
                for value in ("fp32", "fp16", "bf16")
            },
            **dict.fromkeys(
                BF16_WEIGHTS,
                Refuse(
                    "the diffusers example scripts keep the trained weights in fp32 (LoRA adapters "
                    "too) under --mixed_precision; they have no bf16-weight mode"
                ),
            ),
        },
        "trl": language_models.trl,
        "musubi": _musubi,
        "axolotl": language_models.axolotl,
        "ai_toolkit": _ai_toolkit,
        "torchtune": language_models.torchtune,
        "litgpt": language_models.litgpt,
        "llamafactory": language_models.llamafactory,
        "onetrainer": _onetrainer,
    }
