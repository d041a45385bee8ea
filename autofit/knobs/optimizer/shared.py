"""What optimizer's knob and its trainers' words both read."""

from __future__ import annotations

# Why a trainer's own optimizer settings cannot name it: PEFT builds it from the model, in code.
LORAFA_IN_CODE = (
    "LoRA-FA is PEFT's create_lorafa_optimizer(model, ...), built in code from the PEFT model"
)
