"""frames: the length of each training clip of a video model, in frames.

Unset, it is the model's native clip length (its preset's `inputs.frames`: 81 for Wan, 129 for
HunyuanVideo). A video VAE compresses the first frame alone and each following
`temporal_downsample` frames into one latent frame, so a clip is 1, 1 + k, 1 + 2k, ... frames
(k = 4 for Wan's and HunyuanVideo's: 1, 5, 9, ..., 81), as the video trainers' frame buckets are.
Activations grow with the latent frames times the pixels, and attention with their square: the
length is as much a run's size as its resolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.families import REGISTRY
from autofit.knobs.base import Knob, ProbeContext, Say, Subject
from autofit.models import ModelPreset


def native_frames(preset: ModelPreset) -> int:
    return int(preset.inputs["frames"])


def clip_frames(knobs: Mapping[str, Any], preset: ModelPreset) -> int:
    """The frames of each clip a run of a video model trains on."""
    value = knobs.get("frames")
    return native_frames(preset) if value is None else int(value)


def latent_frames(frames: int, preset: ModelPreset) -> int:
    """The latent frames a clip of `frames` frames encodes to: the first alone, then each
    `temporal_downsample` together."""
    return 1 + (frames - 1) // int(preset.inputs["temporal_downsample"])


def clip_refusal(value: int, preset: ModelPreset) -> str | None:
    """Why clips of `value` frames cannot be trained on `preset`, in one line, or None."""
    if not REGISTRY[preset.family].video:
        video = [name for name, family in REGISTRY.items() if family.video]
        return (
            f"frames={value} is for video models ({', '.join(video)}); "
            f"{preset.name} trains on {'sequences' if preset.unit == 'tokens' else 'images'}"
        )
    step = int(preset.inputs["temporal_downsample"])
    if (value - 1) % step:
        below = 1 + (value - 1) // step * step
        return (
            f"frames={value} is not valid for {preset.name}: its VAE encodes the first frame "
            f"and then {step} at a time, so a clip is 1 + {step}k frames (try {below} or "
            f"{below + step})"
        )
    return None


class Frames(Knob):
    name = "frames"
    depends_on = ()
    default = None
    default_means = "the model's native clip length"
    help = (
        "frames per training clip of a video model (null: the model's native length, 81 for "
        "Wan, 129 for HunyuanVideo)"
    )
    kind = int
    minimum = 1
    # Unset, an image or language model has no clips, and the trainers that train none of the
    # video families need not be told; a video trainer's export says its clip length itself.
    default_asks_nothing = True
    reach = "pass"  # the batch's size, as resolution is

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        return None if value is None else clip_refusal(value, context.model)

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # The answer is at the longest clip that fits (autofit/search/pareto.py): a shorter one
        # matters only at the batches the next longer one searched cannot fit, as a memory-saving
        # setting does, and is searched after it.
        if value is None:
            return None
        longer = sorted(v for v in searched if v is not None and v > value)
        return longer[0] if longer else None

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return REGISTRY[preset.family].video

    def means(self, value: Any, subject: Subject) -> str:
        if not REGISTRY[subject.family].video:
            return "images, not clips"
        return f"clips of {clip_frames({'frames': value}, subject.preset)} frames"

    # musubi-tuner's clip length is its dataset's target_frames (the export writes dataset.toml).
    trainers = {"musubi": lambda v, s: Say()}
