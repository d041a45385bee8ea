"""The shipped GPU table and model presets."""

from __future__ import annotations

import pytest

from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.paths import group_options

REQUIRED_GPUS = [
    "a40", "a100_40", "a100_80", "h100_80", "h200", "l40s", "l4", "a10g", "rtx3090", "rtx4090",
    "rtx5090", "t4", "v100_16", "v100_32",
    # issue 14: the cards people train on at home and the ones they rent
    "rtx2080ti", "rtx3060_12", "rtx3070", "rtx3080_10", "rtx3080_12", "rtx3090ti", "rtx4060_8",
    "rtx4060ti_16", "rtx4070_12", "rtx4070tisuper_16", "rtx4080_16", "rtx5080", "rtx_a4000",
    "rtx_a5000", "rtx_a6000", "rtx6000_ada", "l40", "h100_pcie", "b200",
]  # fmt: skip


def test_the_required_gpu_entries_are_shipped() -> None:
    # What each entry must hold is tests/test_gpus.py's contract, run over every shipped entry.
    assert not set(REQUIRED_GPUS) - set(group_options("gpu"))


def test_reference_figures() -> None:
    a40 = load_gpu("a40")
    assert (a40.tflops["bf16"], a40.memory_bandwidth_gbs) == (149.7, 696)
    assert load_gpu("h100_80").tflops["bf16"] == 989.4


def test_every_preset_loads() -> None:
    for name in group_options("model"):
        preset = load_preset(name)
        assert preset.name == name
        preset.check_resolution(preset.resolution)


@pytest.mark.parametrize("space", ["default", "quick"])
def test_every_shipped_space_loads_for_every_preset(space: str) -> None:
    from autofit.search.space import load_space

    for name in group_options("model"):
        if name == "custom":
            continue
        loaded = load_space(space, load_preset(name))
        assert loaded.knobs and loaded.target_resolution in loaded.resolutions


def test_a_family_section_replaces_the_common_values_for_that_family_only() -> None:
    from autofit.search.space import load_space

    flux = load_space("default", load_preset("flux_dev"))
    sana = load_space("default", load_preset("sana_1600m"))
    llama = load_space("default", load_preset("llama3_8b"))
    assert flux.knobs["train_mode"] == ("lora", "full") and flux.knobs["swap_blocks"][-1] == 35
    assert "train_mode" not in sana.knobs and "swap_blocks" not in sana.knobs
    assert sana.knobs["optimizer"] != flux.knobs["optimizer"]
    assert "qlora" in llama.knobs["train_mode"]
    assert llama.resolutions == (2048, 4096)  # x0.5 and x1 of 4096 tokens
