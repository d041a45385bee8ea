"""train_mode: which weights train.

- `full`: every weight of the model trains.
- `lora`: the model's weights are frozen in 16-bit (its half dtype under mixed precision) and
  LoRA adapters of rank `lora_rank` on the preset's target modules train, through peft; under
  mixed precision the adapters are fp32, as the diffusers scripts cast them.
- `qlora`: as `lora`, on a base whose linear layers are quantized to 4-bit NF4 with double
  quantization through bitsandbytes (a stand-in with the same layout on fake tensors).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.lora_targets import target_modules
from autofit.trainers import DIFFUSERS_SCRIPTS, KOHYA_SCRIPTS, diffusers_script

if TYPE_CHECKING:
    from autofit.run_state import RunState


# -- trainers ---------------------------------------------------------------------------------


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    if value == "qlora":
        return Refuse(
            "sd-scripts quantizes a base model to fp8 at most (fp8_base), not to 4-bit NF4"
        )
    if value == "full" or s.family not in KOHYA_SCRIPTS:
        return Say()  # the full fine-tune script (the family's check refuses other families)
    # autofit trains the denoiser's adapters only
    return say(network_module=KOHYA_SCRIPTS[s.family].network, network_train_unet_only=True)


def _diffusers(value: Any, s: Subject) -> Say | Refuse:
    if diffusers_script(s.family, value) is not None:
        return Say()  # which script runs is the layout's
    offered = ", ".join(mode for family, mode in DIFFUSERS_SCRIPTS if family == s.family)
    return Refuse(f"the diffusers examples train {s.family} only as: {offered or 'nothing'}")


SANA_FULL_ONLY = Refuse(
    "Sana's train.py trains the whole model; for LoRA use target=diffusers "
    "(train_dreambooth_lora_sana.py, which Sana's own train_lora.sh runs)"
)


class TrainMode(Knob):
    name = "train_mode"
    default = "full"
    help = "which weights train: full | lora | qlora (4-bit base)"
    values = {
        "full": "every weight of the model trains",
        "lora": "LoRA adapters on the frozen 16-bit model (fp32 adapters under mixed precision)",
        "qlora": "LoRA adapters on a 4-bit NF4 base (bitsandbytes, double quantization)",
    }
    per_sample_memory = False
    reads = ("dtypes",)
    after = ("base_precision",)  # its adapters wrap the base's layers as that knob stores them

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != "full" and not context.model.lora_targets:
            return f"train_mode={value} needs the modules LoRA adapts, which {context.model.name} does not list"
        return None

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value != "qlora":
            return None
        # The 16-bit base is built in host memory and each weight quantized on its way to the
        # GPU (apply), as a quantizing loader does: it never sits there whole.
        return run.built_on_host()

    def apply(self, run: RunState, value: Any) -> None:
        if value == "full":
            return
        import torch
        from peft import LoraConfig, inject_adapter_in_model

        from autofit.run_state import default_dtype, move_to_device, set_logical_numel

        model = run.model
        model.requires_grad_(False)
        if value == "qlora":
            from autofit.quantization import quantize_linears, quantized_tensors

            compute = run.dtypes.autocast or run.dtypes.weights
            layers = quantize_linears(
                model, compute if compute != torch.float32 else torch.bfloat16, run.fake, run.device
            )
            quantized = {id(t) for layer in layers for t in quantized_tensors(layer)}
            for layer in layers:  # param_count counts weights, not the bytes packing them
                set_logical_numel(layer.weight, layer.in_features * layer.out_features)
            move_to_device(run, model, skip=quantized)
            for layer in layers:
                run.tag(quantized_tensors(layer), "parameters")
        rank = run.knobs["lora_rank"]
        targets = target_modules(run.knobs["lora_targets"], run.preset)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets)
        # Adapters are created in the base's dtype (peft would move them there anyway).
        with default_dtype(run.dtypes.weights), run.device:
            inject_adapter_in_model(config, model)
        for param in model.parameters():
            if param.requires_grad and param.dtype != run.dtypes.trained:
                param.data = param.data.to(run.dtypes.trained)  # diffusers' cast_training_params
        run.tag([p for p in model.parameters() if p.requires_grad], "parameters")

    trainers = {
        "simpletuner": {
            "full": say(model_type="full", base_model_precision="no_change"),
            # the base's precision under LoRA: base_precision's words
            "lora": say(model_type="lora", lora_type="standard"),
            # QLoRA: the base's linear layers in bitsandbytes NF4, the rest in bf16, as measured.
            "qlora": say(
                model_type="lora",
                lora_type="standard",
                base_model_precision="nf4-bnb",
                base_model_default_dtype="bf16",
            ),
        },
        "kohya": _kohya,
        "sana": {"full": Say(), "lora": SANA_FULL_ONLY, "qlora": SANA_FULL_ONLY},
        "diffusers": _diffusers,
    }
