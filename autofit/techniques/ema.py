"""EMA: an exponential moving average of the trainable weights, updated after every step.

- `off`: none.
- `gpu`: the average lives on the GPU beside the weights (one more copy of them) and is updated
  there by one fused kernel.
- `cpu`: the average lives in host memory; each update copies the weights over the host link and
  runs on the host CPU, as trainers' `ema_device=cpu` does.

The copy counts as optimizer state in the breakdown: per-parameter state the training keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun

DECAY = 0.9999


class Ema(Technique):
    knob = Knob(
        "ema",
        "off",
        "an EMA copy of the trainable weights: off | gpu | cpu",
        choices=("off", "gpu", "cpu"),
    )
    per_sample_memory = False

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "gpu" if value == "cpu" else None

    def after_build(self, run: TrainingRun, value: Any) -> None:
        import torch

        if value == "off":
            return
        params = run.trainable_parameters()
        if value == "gpu":
            shadow = [p.detach().clone() for p in params]
            if run.tracker:
                for tensor in shadow:
                    run.tracker.tag(tensor, "optimizer_state")

            def update() -> None:
                torch._foreach_lerp_(shadow, [p.detach() for p in params], 1 - DECAY)

        else:
            shadow = [run.to_host(p) for p in params]

            def update() -> None:
                for average, param in zip(shadow, params, strict=True):
                    weights = run.to_host(param)
                    with run.host():
                        average.lerp_(weights, 1 - DECAY)
                    run.traffic.host_compute_bytes += 3 * average.numel() * average.element_size()

        run.after_step.append(update)
