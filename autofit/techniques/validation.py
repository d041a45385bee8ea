"""Validation: a validation image after training, with the training state still resident.

Trainers render validation images every so often in the middle of training: the weights,
optimizer state and whatever else training keeps stay on the GPU while the inference pipeline's
denoiser step runs (classifier-free guidance doubles its batch) and the VAE decodes the latents
at the training resolution. A run can fit its training steps and still run out of memory here;
then the probe is `oom` in phase `validation`. With cached encoders the VAE is loaded onto the GPU
for the pass and dropped after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class Validation(Technique):
    knob = Knob(
        "validation", "off", "a validation pass after training: off | on", choices=("off", "on")
    )
    per_sample_memory = False

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "on" and "vae" not in context.model.companions:
            return f"validation=on decodes with the model's VAE, which {context.model.name} does not list"
        return None

    def after_training(self, run: TrainingRun, value: Any) -> None:
        if value != "on":
            return
        import torch

        from autofit.workloads.companions import build_companion

        with run.in_phase("validation"), torch.no_grad():
            vae = run.companions.get("vae")
            if vae is None:
                with run.device:
                    vae = build_companion(run.preset.companions["vae"]).eval()
            run.model.eval()
            try:
                with run.forward_contexts():
                    run.workload.validate(run, vae)
            finally:
                run.model.train()
