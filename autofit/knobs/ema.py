"""ema: an exponential moving average of the trainable weights, updated after every step.

- `off`: none.
- `gpu`: the average lives on the GPU beside the weights (one more copy of them) and is updated
  there by one fused kernel.
- `cpu`: the average lives in host memory; each update copies the weights over the host link and
  runs on the host CPU, as trainers' `ema_device=cpu` does.

The copy counts as optimizer state in the breakdown: per-parameter state the training keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.families import diffusers_script
from autofit.knobs.base import Knob, Refuse, Say, Subject, say

if TYPE_CHECKING:
    from autofit.run_state import RunState

DECAY = 0.9999


def _diffusers(value: Any, s: Subject) -> Say | Refuse | None:
    script = diffusers_script(s.family, s.config["train_mode"])
    if script is None:
        return None  # no script trains this: train_mode says so
    if value == "off":
        return Say()
    if value == "gpu" and script.ema:
        return say(**{"--use_ema": True})
    where = "on the GPU only (--use_ema)" if script.ema else "none"
    return Refuse(f"{script.file} keeps an EMA copy {where}")


class Ema(Knob):
    name = "ema"
    depends_on = ("train_mode",)
    default = "off"
    help = "an EMA copy of the trainable weights: off | gpu | cpu"
    values = {
        "off": "no EMA copy of the weights",
        "gpu": "an EMA copy of the trained weights on the GPU",
        "cpu": "an EMA copy of the trained weights in host memory, updated there",
    }
    per_sample_memory = False
    reach = "outside_pass"  # the copy is made and updated after the update
    writes = ("after_step",)
    after = ("train_mode", "swap_blocks")  # it copies the weights that train, where they live

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "gpu" if value == "cpu" else None

    def apply(self, run: RunState, value: Any) -> None:
        import torch

        if value == "off":
            return
        params = run.trainable_parameters()
        if value == "gpu":
            shadow = [p.detach().clone() for p in params]
            run.tag(shadow, "optimizer_state")

            def update() -> None:
                torch._foreach_lerp_(shadow, [p.detach() for p in params], 1 - DECAY)

        else:
            # Pinned: SimpleTuner (ema_device=cpu, as exported) moves the average back to the
            # host after each update with .to("cpu", non_blocking=True), which pins the copy.
            with run.host(pinned=True):
                shadow = [run.to_host(p) for p in params]

            def update() -> None:
                for average, param in zip(shadow, params, strict=True):
                    weights = run.to_host(param)
                    with run.host():
                        average.lerp_(weights, 1 - DECAY)
                    run.traffic.host_compute_bytes += 3 * average.numel() * average.element_size()

        run.after_step = update

    trainers = {
        "simpletuner": {
            "off": say(use_ema=False),
            "gpu": say(use_ema=True, ema_device="accelerator"),
            "cpu": say(use_ema=True, ema_device="cpu"),
        },
        "kohya": {
            "off": Say(),
            "gpu": Refuse("sd-scripts keeps no EMA copy of the weights"),
            "cpu": Refuse("sd-scripts keeps no EMA copy of the weights"),
        },
        "sana": {
            "off": Say(),
            "gpu": Refuse("Sana's train config has no switch for an EMA copy of the weights"),
            "cpu": Refuse("Sana's train config has no switch for an EMA copy of the weights"),
        },
        "diffusers": _diffusers,
        # ai-toolkit's ExponentialMovingAverage (toolkit/ema.py at 27a03a91) clones the trained
        # parameters where they are, on the GPU; its examples turn it on, so off is said too.
        "ai_toolkit": {
            "off": say(**{"train.ema_config": {"use_ema": False}}),
            "gpu": say(**{"train.ema_config": {"use_ema": True, "ema_decay": 0.99}}),
            "cpu": Refuse("ai-toolkit keeps its EMA copy beside the trained weights, on the GPU"),
        },
        # OneTrainer's EMAModuleWrapper (modules/module/EMAModule.py at 23df3832) clones the
        # trained parameters to the GPU or the host and updates them parameter by parameter,
        # every ema_update_step_interval steps: every step, as measured.
        "onetrainer": {
            "off": say(ema="OFF"),
            "gpu": say(ema="GPU", ema_update_step_interval=1),
            "cpu": say(ema="CPU", ema_update_step_interval=1),
        },
    }
