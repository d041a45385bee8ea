"""Train mode: which weights train.

- `full`: every weight of the model trains.
- `lora`: the model's weights are frozen in 16-bit (its half dtype under mixed precision) and
  LoRA adapters of rank `lora_rank` on the preset's target modules train, through peft; under
  mixed precision the adapters are fp32, as the diffusers scripts cast them.
- `qlora`: as `lora`, on a base whose linear layers are quantized to 4-bit NF4 with double
  quantization through bitsandbytes (a stand-in with the same layout on fake tensors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class TrainMode(Technique):
    knob = Knob(
        "train_mode",
        "full",
        "which weights train: full | lora | qlora (4-bit base)",
        choices=("full", "lora", "qlora"),
    )
    per_sample_memory = False

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != "full" and not context.model.lora_targets:
            return f"train_mode={value} needs the modules LoRA adapts, which {context.model.name} does not list"
        return None

    def before_build(self, run: TrainingRun, value: Any) -> None:

        if value != "full":  # the frozen base is kept in 16-bit under mixed precision
            run.param_dtype = run.frozen_dtype
        if value == "qlora":
            # The 16-bit base is built in host memory and each weight quantized on its way to
            # the GPU (after_build), as a quantizing loader does: it never sits there whole.
            run.build_contexts += [run.host_device, run.host()]

    def after_build(self, run: TrainingRun, value: Any) -> None:
        if value == "full":
            return
        import torch

        from autofit.training import default_dtype

        model = run.model
        model.requires_grad_(False)
        if value == "qlora":
            from autofit.quantization import quantize_linears, quantized_tensors

            compute = run.autocast_dtype or run.param_dtype
            layers = quantize_linears(
                model, compute if compute != torch.float32 else torch.bfloat16, run.fake, run.device
            )
            quantized = {id(t) for layer in layers for t in quantized_tensors(layer)}
            for layer in layers:  # param_count counts weights, not the bytes packing them
                run.full_numel[layer.weight] = layer.in_features * layer.out_features
            _move_to_device(run, model, skip=quantized)
            if run.tracker:
                for layer in layers:
                    for tensor in quantized_tensors(layer):
                        run.tracker.tag(tensor, "parameters")
        from peft import LoraConfig, inject_adapter_in_model

        rank = run.knobs["lora_rank"]
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=run.preset.lora_targets)
        # Adapters are created in the base's dtype (peft would move them there anyway).
        with default_dtype(run.param_dtype), run.device:
            inject_adapter_in_model(config, model)
        for param in model.parameters():
            if param.requires_grad and run.autocast_dtype is not None:
                param.data = (
                    param.data.float()
                )  # diffusers' cast_training_params under mixed precision
        if run.tracker:
            for param in model.parameters():
                if param.requires_grad:
                    run.tracker.tag(param, "parameters")


class LoraRank(Technique):
    knob = Knob(
        "lora_rank", 16, "rank of the LoRA adapters (train_mode=lora or qlora)", kind=int, minimum=1
    )
    per_sample_memory = False


def _move_to_device(run: TrainingRun, model: Any, skip: set[int]) -> None:
    """The rest of a host-built model (embeddings, norms, the output head) copied to the device
    as it loads; not host-link traffic of the step."""
    for module in model.modules():
        for _name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in skip:
                param.data = param.data.to(run.device, copy=True)
                if run.tracker:
                    run.tracker.tag(param, "parameters")
        for name, buffer in list(module.named_buffers(recurse=False)):
            if id(buffer) not in skip:
                module._buffers[name] = moved = buffer.to(run.device, copy=True)
                if run.tracker:
                    run.tracker.tag(moved, "parameters")
