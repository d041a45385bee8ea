"""Encoders: whether the frozen text encoders and VAE sit on the GPU and run every step.

- `cached`: latents and text embeddings were computed beforehand (trainers' caching); only the
  trained model is on the GPU.
- `online`: the companions of the preset (text encoder, VAE) sit on the GPU in their own dtype
  and encode every batch without gradients, as a trainer that does not cache runs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun

ENCODERS = ("text_encoder", "vae")


class Encoders(Technique):
    knob = Knob(
        "encoders",
        "cached",
        "frozen text encoders and VAE: cached (precomputed) | online (on the GPU)",
        choices=("cached", "online"),
    )

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        missing = [name for name in ENCODERS if name not in context.model.companions]
        if value == "online" and missing:
            return f"encoders=online needs the model's {' and '.join(missing)}, which {context.model.name} does not list"
        return None

    def after_build(self, run: TrainingRun, value: Any) -> None:
        if value != "online":
            return
        from autofit.workloads.companions import build_companion

        for name in ENCODERS:
            with run.device:
                run.add_companion(name, build_companion(run.preset.companions[name]))
        knobs, workload = run.knobs, run.workload

        def encoded_batch() -> dict[str, Any]:
            raw = workload.make_raw_batch(knobs["batch_size"], knobs["resolution"], run.device)
            return workload.encode(raw, run.companions, run.param_dtype)

        run.batch_source = encoded_batch
