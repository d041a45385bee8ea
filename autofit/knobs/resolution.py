"""resolution: the square image side in pixels, or the sequence length in tokens of a language
model. Unset, it is the model's native size; the search varies it over the space's list."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.families import REGISTRY, diffusers_script
from autofit.knobs.base import Knob, Refuse, Say, Subject, say


def _diffusers(value: Any, s: Subject) -> Any:
    script = diffusers_script(s.family, s.config["train_mode"])
    if script is not None and script.kind == "controlnet":
        return say(**{"--resolution": value})  # it resizes and center-crops to the square always
    return say(**{"--resolution": value, "--center_crop": True})


def _llamafactory(value: Any, s: Subject) -> Say | Refuse:
    """LLaMA-Factory cuts each example to cutoff_len tokens and pads a batch to its longest row, to
    a multiple of 8 (train/sft/workflow.py pad_to_multiple_of=8): full rows are the measured ones."""
    if value % 8:
        longer = -(-value // 8) * 8
        return Refuse(
            f"LLaMA-Factory pads each batch to a multiple of 8 tokens (pad_to_multiple_of=8), so "
            f"its rows of cutoff_len={value} run {longer} long",
            "resolution a multiple of 8",
        )
    return say(cutoff_len=value)


class Resolution(Knob):
    name = "resolution"
    depends_on = ("train_mode", "validation", "validation_resolution")
    default = None
    default_means = "the model's native size"
    help = (
        "square image side in pixels, or sequence length in tokens for language models "
        "(null: the model's native size)"
    )
    kind = int
    minimum = 1
    default_asks_nothing = False
    reach = "pass"  # the batch's size; but a validation pass may render at it (below)

    def only_in_the_pass(self, knobs: Mapping[str, Any]) -> bool:
        # A validation pass at the training resolution renders at it after training.
        return (
            knobs.get("validation", "off") == "off"
            or knobs.get("validation_resolution", "training") == "native"
        )

    def means(self, value: Any, subject: Subject) -> str:
        if REGISTRY[subject.family].unit == "tokens":
            return f"sequences of {value} tokens"
        return f"{value}x{value} pixel images (or buckets of at most {value}x{value} pixels)"

    # kohya's resolution is its dataset's (the layout writes dataset.toml and its buckets).
    trainers = {
        "simpletuner": lambda v, s: say(resolution=v, resolution_type="pixel_area"),
        "sana": lambda v, s: say(**{"data.image_size": v, "model.image_size": v}),
        "diffusers": _diffusers,
        "trl": lambda v, s: say(max_length=v),  # every sample cut (or packed) to it
        "llamafactory": _llamafactory,
        "axolotl": lambda v, s: Say(
            # one example per row padded to sequence_len: the probe's full rows every step;
            # axolotl 0.19 warns that packing under SDPA and bf16 before Hopper can lose the loss
            # (utils/schemas/config.py check_sample_packing_w_sdpa_bf16)
            settings={"sequence_len": v, "sample_packing": False, "pad_to_sequence_len": True},
            warning="axolotl pads each example to sequence_len, so transformers hands SDPA a "
            "padding mask (batch x sequence x sequence booleans) the measured full rows had none of",
        ),
        # torchtune 0.6.1's tokenizers cut each example to max_seq_len and padded_collate_sft pads
        # a batch to its longest: rows of at most the measured length, no mask (SDPA is_causal).
        # Packed rows would be full, but run flex attention with a block mask (not measured).
        "torchtune": lambda v, s: say(**{"tokenizer.max_seq_len": v, "dataset.packed": False}),
        # litgpt 0.5.13 cuts each example to max_seq_length and pads a micro-batch to its longest
        # one (data/base.py get_sft_collate_fn): the measured full rows are its longest batch.
        "litgpt": lambda v, s: say(**{"train.max_seq_length": v}),
    }
