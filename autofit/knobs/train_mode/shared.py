"""What train_mode's knob and its trainers' words both read."""

from __future__ import annotations

from autofit.knobs.base import Refuse
from autofit.knobs.peft_config import unread_by

FOUR_BIT_MODES = ("qlora", "qdora")  # adapters on a 4-bit NF4 base
DORA_MODES = ("dora", "qdora")


def NO_PEFT_FILE(trainer: str) -> Refuse:  # noqa: N802 (a refusal, as the constants above)
    return Refuse(f"{unread_by(trainer).why} (its own LoRA: train_mode=lora)")


def NO_LYCORIS_FILE(trainer: str) -> Refuse:  # noqa: N802 (a refusal, as the constants above)
    return Refuse(
        f"{trainer} does not read SimpleTuner's lycoris_config (its own LoRA: train_mode=lora)"
    )
