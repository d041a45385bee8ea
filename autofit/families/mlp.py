"""A tiny multilayer perceptron: the model small enough to count by hand, for tests."""

from __future__ import annotations

from autofit.families.base import Family
from autofit.words import Refuse

MLP = Family(
    name="mlp",
    workload="autofit.workloads.mlp",
    libraries=(),
    loader="diffusers",  # a trainer would load it as a single-file checkpoint of this size
    unit="pixels",
    trainers={
        "diffusers": Refuse("a test model: no trainer's script trains it"),
        "kohya": Refuse("a test model: no trainer's script trains it"),
        "simpletuner": Refuse("a test model: no trainer's script trains it"),
        "sana": Refuse("a test model: no trainer's script trains it"),
        "trl": Refuse("a test model: no trainer's script trains it"),
        "axolotl": Refuse("a test model: no trainer's script trains it"),
        "torchtune": Refuse("a test model: no trainer's script trains it"),
        "litgpt": Refuse("a test model: no trainer's script trains it"),
        "llamafactory": Refuse("a test model: no trainer's script trains it"),
        "musubi": Refuse("a test model: no trainer's script trains it"),
        "ai_toolkit": Refuse("a test model: no trainer's script trains it"),
        "onetrainer": Refuse("a test model: no trainer's script trains it"),
    },
)
