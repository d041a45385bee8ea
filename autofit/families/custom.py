"""A user's own model: `model=custom model.entry=package.module:function` (docs/models.md)."""

from __future__ import annotations

from autofit.families.base import Family
from autofit.words import Refuse

OWN_CODE = Refuse(
    "a user's own model has no trainer's script; export it to accelerate, deepspeed or hydra"
)

CUSTOM = Family(
    name="custom",
    workload="autofit.workloads.custom",
    libraries=None,  # the user's code may import anything
    loader="diffusers",
    unit=None,  # `resolution` means whatever the model's make_batch makes of it
    companions=None,
    trainers={
        "diffusers": OWN_CODE,
        "kohya": OWN_CODE,
        "simpletuner": OWN_CODE,
        "sana": OWN_CODE,
        "trl": OWN_CODE,
        "axolotl": OWN_CODE,
        "torchtune": OWN_CODE,
        "litgpt": OWN_CODE,
        "llamafactory": OWN_CODE,
        "musubi": OWN_CODE,
        "ai_toolkit": OWN_CODE,
        "onetrainer": OWN_CODE,
    },
)
