"""Encoders: whether the frozen text encoders and VAE sit on the GPU and run every step.

- `cached`: latents and text embeddings were computed beforehand (trainers' caching); only the
  trained model is on the GPU, unless the family's trainer leaves some companions there anyway
  (`Workload.resident_when_cached`).
- `online`: the companions of the preset (its text encoders and VAE) sit on the GPU in their own
  dtype and encode every batch without gradients, as a trainer that does not cache runs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class Encoders(Technique):
    knob = Knob(
        "encoders",
        "cached",
        "frozen text encoders and VAE: cached (precomputed) | online (on the GPU)",
        choices=("cached", "online"),
    )

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "online" and "vae" not in context.model.companions:
            return f"encoders=online needs the model's text encoders and VAE, which {context.model.name} does not list"
        return None

    def after_build(self, run: TrainingRun, value: Any) -> None:
        online = value == "online"
        names = list(run.preset.companions) if online else run.workload.resident_when_cached
        if not names:
            return
        from autofit.workloads.companions import build_companion

        # online: each in its own dtype; left resident by the trainer: in the weight dtype
        dtype = None if online else run.frozen_dtype
        for name in names:
            with run.device:
                run.add_companion(name, build_companion(run.preset.companions[name], dtype))
        if not online:
            return
        knobs, workload = run.knobs, run.workload

        def encoded_batch() -> dict[str, Any]:
            raw = workload.make_raw_batch(knobs["batch_size"], knobs["resolution"], run.device)
            return workload.encode(raw, run.companions, run.param_dtype)

        run.batch_source = encoded_batch
