"""adapter_dtype: the dtype PEFT gives the adapters of `train_mode=peft` on a 16-bit model.

- `fp32`: PEFT's default, `get_peft_model(model, config)` with `autocast_adapter_dtype=True`: on
  a bf16 or fp16 model the adapters are upcast to fp32, so their parameters, gradients and
  optimizer states are fp32, and every adapted layer casts its input to fp32 for them (a copy
  that backward keeps where the adapter's weight trains on it).
- `model`: `get_peft_model(model, config, autocast_adapter_dtype=False)`, as PEFT's own
  MetaMathQA benchmark runs the experiments that ask for it: the adapters stay in the model's
  dtype, half the bytes and no input casts.

An fp32 model's adapters are fp32 either way. It sets what PEFT's entry point does, so it applies
to `train_mode=peft` only (`train_mode=lora` builds its adapters in the run's trained dtype,
which `precision` sets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.knobs.base import Knob, ProbeContext, Say, Subject
from autofit.knobs.peft_config import OWN_NETWORKS, PEFT_MODE, unread_by
from autofit.models import ModelPreset


def _peft_file_only(who: str) -> Any:
    def words(value: Any, s: Subject) -> Any:
        # PEFT's default is what any trainer running get_peft_model gets; the other value is a
        # PEFT file's run, which none of the export targets reads
        return Say() if value == "fp32" else unread_by(who)

    return words


class AdapterDtype(Knob):
    name = "adapter_dtype"
    depends_on = ("train_mode",)
    default = "fp32"
    help = (
        "train_mode=peft's adapters on a 16-bit model: fp32 (PEFT's autocast_adapter_dtype=True) "
        "| model (autocast_adapter_dtype=False: the model's dtype)"
    )
    values = {
        "fp32": "get_peft_model's default autocast_adapter_dtype=True: the adapters of a 16-bit "
        "model upcast to fp32, each adapted layer's input cast to fp32 for them",
        "model": "get_peft_model(..., autocast_adapter_dtype=False): the adapters in the model's "
        "own dtype",
    }
    reads = ("dtypes",)

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("train_mode", "full") == PEFT_MODE

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "fp32" if value == "model" else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        mode = context.knobs.get("train_mode", "full")
        if value != self.default and mode != PEFT_MODE:
            return (
                f"adapter_dtype={value} is get_peft_model's autocast_adapter_dtype, for "
                f"train_mode=peft; train_mode={mode} builds its adapters in the dtype precision "
                "sets"
            )
        return None

    trainers = {vocabulary: _peft_file_only(who) for vocabulary, who in OWN_NETWORKS}
