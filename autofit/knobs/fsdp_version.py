"""fsdp_version: which PyTorch FSDP the fsdp knob runs.

- `2` (the default, what autofit measured before this knob): FSDP2, `fully_shard`, per-parameter
  DTensor shards (autofit/emulations/fsdp.py; fsdp_real.py runs `fully_shard` itself).
- `1`: FSDP1, `FullyShardedDataParallel` with flat parameters and `use_orig_params=False`: what
  accelerate's `fsdp_version: 1` (its default until 1.x), the HF Trainer's `fsdp` argument and
  Lightning/LitGPT's FSDPStrategy run. It holds more than FSDP2: the root unit (embedding, final
  norm, head) is never resharded after forward, each unit's padded flat shard, the unsharded flat
  gradient and its padded reduce-scatter copy, the BACKWARD_PRE prefetch of the next unit before
  the current one's gradient is reduced, and with CPU offload every unit's GPU gradient shard
  until backward ends (autofit/emulations/fsdp1.py, which cites torch's source).

The fsdp knob applies either and writes each trainer's FSDP settings for both; this knob only
names the version (and refuses where a trainer runs the other one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject
from autofit.knobs.fsdp.language_models import AXOLOTL_FSDP1, TORCHTUNE_FSDP1
from autofit.knobs.train_mode import FOUR_BIT_MODES

if TYPE_CHECKING:
    from autofit.models import ModelPreset

FSDP2 = "fsdp_version=2"


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    if value == 1:
        return Refuse(
            "autofit writes SimpleTuner's FSDP flags for FSDP2 only (documentation/FSDP2.md)",
            FSDP2,
        )
    return Say()


def _sana(value: Any, s: Subject) -> Say | Refuse:
    # fsdp's own words refuse every FSDP run for Sana (its train.use_fsdp is accelerate's FSDP1
    # with settings autofit has not matched); nothing more to say here.
    return Say()


class FsdpVersion(Knob):
    name = "fsdp_version"
    depends_on = ("fsdp", "train_mode")
    decided_by_trainer = True
    default = 2
    kind = int
    help = "which FSDP the fsdp knob runs: 2 (fully_shard) | 1 (FullyShardedDataParallel, flat parameters)"
    values = {
        2: "FSDP2: torch.distributed.fsdp.fully_shard (accelerate fsdp_version: 2)",
        1: "FSDP1: FullyShardedDataParallel with flat parameters, use_orig_params=False, "
        "transformer-block auto-wrap, backward_prefetch=BACKWARD_PRE, limit_all_gathers "
        "(accelerate fsdp_version: 1, the HF Trainer's fsdp, Lightning's FSDPStrategy)",
    }

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("fsdp", "off") != "off"

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != 1 or context.knobs.get("fsdp", "off") == "off":
            return None
        if context.knobs.get("train_mode") in ("dora", "qdora"):
            return (
                f"fsdp_version=1 with train_mode={context.knobs['train_mode']}: DoRA's magnitude "
                "vectors train beside the frozen base in one unit, which FSDP1's flat parameter "
                "(use_orig_params=False) cannot mix"
            )
        if context.backend in ("cpu", "cuda") and context.knobs.get("train_mode") in FOUR_BIT_MODES:
            return (
                f"fsdp_version=1 with train_mode={context.knobs['train_mode']} on the "
                f"{context.backend} backend: FSDP1 cannot flatten the 4-bit layers' uint8 weights "
                "with their bf16 norms"
            )
        return None

    trainers = {
        # fsdp's block carries it (fsdp_version and the settings of that version).
        "accelerate": lambda v, s: Say(),
        "diffusers": lambda v, s: Say(),
        "simpletuner": _simpletuner,
        "sana": _sana,
        # fsdp refuses these targets itself (DeepSpeed shards with ZeRO; sd-scripts has no FSDP).
        "deepspeed": lambda v, s: Say(),
        "kohya": lambda v, s: Say(),
        "trl": lambda v, s: Say(),
        # fsdp's block is axolotl's FSDP2; its FSDP1 cannot prefetch as measured
        "axolotl": {2: Say(), 1: AXOLOTL_FSDP1},
        "torchtune": {2: Say(), 1: TORCHTUNE_FSDP1},
        # finetune_full's FSDPStrategy is FSDP1; fsdp refuses finetune_lora's sharding itself
        "litgpt": lambda v, s: (
            Say()
            if v == 1 or s.config["train_mode"] != "full"
            else Refuse("LitGPT's finetune_full shards with Lightning's FSDPStrategy, FSDP1")
        ),
        # the accelerate config's fsdp block carries it (fsdp's words)
        "llamafactory": lambda v, s: Say(),
    }
