"""validation_resolution: the size a validation pass (on, reload or offload) renders at.

- `training`: the training resolution, as SimpleTuner's validation_resolution and kohya's sample
  prompts are usually set.
- `native`: the model's native resolution: the diffusers pipelines' default size, at which the
  diffusers example scripts render (they pass no height or width), whatever they train at.

The denoiser step and the VAE decode of a validation image grow with its pixels, so a run that
trains at 512 px can fit its steps and run out of memory rendering at 1024.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.families import diffusers_script
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject


def validation_pixels(knobs: Mapping[str, Any], native: int) -> int:
    """The side, in pixels, the validation pass renders at."""
    if knobs.get("validation_resolution", "training") == "native":
        return native
    return int(knobs["resolution"])


def _diffusers(value: Any, s: Subject) -> Say | Refuse | None:
    if s.config.get("validation", "off") == "off":
        return Say()
    script = diffusers_script(s.family, s.config["train_mode"])
    if script is None:
        return None  # no script trains this: train_mode says so
    if validation_pixels(s.config, s.preset.resolution) != s.preset.resolution:
        return Refuse(
            f"{script.file} renders its validation at the pipeline's default "
            f"{s.preset.resolution} px (validation_resolution=native)"
        )
    return Say()


def _sana(value: Any, s: Subject) -> Say | Refuse:
    if value == "native" and s.config["resolution"] != s.preset.resolution:
        return Refuse("Sana's train.py renders its validation at the training image size")
    return Say()


class ValidationResolution(Knob):
    name = "validation_resolution"
    depends_on = ("resolution", "train_mode", "validation")
    default = "training"
    help = "the size validation renders at: training | native (the model's, the pipelines' default)"
    values = {
        "training": "validation images at the training resolution",
        "native": "validation images at the model's native resolution",
    }
    per_sample_memory = False
    reach = "outside_pass"  # it runs after training

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != self.default and context.knobs.get("validation", "off") == "off":
            return f"validation_resolution={value} sizes a validation pass: it needs validation on, reload or offload"
        return None

    def applies(self, config: Mapping[str, Any], preset: Any) -> bool:
        return config.get("validation", "off") != "off"

    trainers = {
        # Their validation size is written from validation_pixels by the validation knob.
        "simpletuner": lambda value, s: Say(),
        "kohya": lambda value, s: Say(),
        "sana": _sana,
        "diffusers": _diffusers,
    }
