"""zero3_*: what ZeRO-3 keeps gathered beside the weight in use, in elements, at DeepSpeed's
defaults: how far ahead it prefetches (`stage3_prefetch_bucket_size`), how many elements may be
gathered at once before it stops prefetching (`stage3_max_live_parameters`), how soon a weight
must be used again to stay gathered (`stage3_max_reuse_distance`), and how small a weight is kept
gathered throughout (`stage3_param_persistence_threshold`).

The `cpu` and `cuda` backends hand them to DeepSpeed; the emulation follows its parameter
coordinator (autofit/emulations/zero_gather.py). zero_stage's DeepSpeed block writes them
(its `live_parameters`), for the probe and for every export that carries a DeepSpeed config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.knobs.base import Knob, ProbeContext, Say, Subject
from autofit.models import ModelPreset
from autofit.units import value as text


class Zero3Setting(Knob):
    """One of ZeRO-3's `stage3_*` settings (`key`), in elements; meaningful with zero_stage=3 only."""

    key: str
    depends_on = ("zero_stage",)
    kind = int
    minimum = 0
    per_sample_memory = False  # weights, whatever the batch

    def means(self, value: Any, subject: Subject) -> str:
        return f"DeepSpeed's {self.key}: {text(value)} elements"

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("zero_stage", 0) == 3

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != self.default and context.knobs.get("zero_stage", 0) != 3:
            return f"{self.name}={text(value)} is ZeRO-3's {self.key}: it needs zero_stage=3"
        return None

    # zero_stage's DeepSpeed block writes it, in the JSON these trainers take. Trainers that
    # build DeepSpeed's config from their own few settings have no words: they run the default,
    # and refuse another value (one's own code under accelerate is told, in a note).
    # in the DeepSpeed JSON each of these targets writes
    trainers = {
        "deepspeed": lambda v, s: Say(),
        "simpletuner": lambda v, s: Say(),
        "axolotl": lambda v, s: Say(),
        "torchtune": lambda v, s: Say(),  # zero_stage refuses torchtune's ZeRO itself
        "llamafactory": lambda v, s: Say(),
    }


class Zero3PrefetchBucket(Zero3Setting):
    name = "zero3_prefetch_bucket"
    key = "stage3_prefetch_bucket_size"
    default = 50_000_000
    help = "ZeRO-3: elements of weights prefetched ahead of the module in use (0: none)"


class Zero3MaxLiveParams(Zero3Setting):
    name = "zero3_max_live_params"
    key = "stage3_max_live_parameters"
    default = 1_000_000_000
    help = "ZeRO-3: elements gathered at once beyond which it prefetches no more"


class Zero3MaxReuseDistance(Zero3Setting):
    name = "zero3_max_reuse_distance"
    key = "stage3_max_reuse_distance"
    default = 1_000_000_000
    help = "ZeRO-3: a weight used again within this many elements of weights stays gathered"


class Zero3PersistenceThreshold(Zero3Setting):
    name = "zero3_persistence_threshold"
    key = "stage3_param_persistence_threshold"
    default = 100_000
    help = "ZeRO-3: weights of at most this many elements stay gathered all step"


ZERO3_SETTINGS = (
    Zero3PrefetchBucket(),
    Zero3MaxLiveParams(),
    Zero3MaxReuseDistance(),
    Zero3PersistenceThreshold(),
)
