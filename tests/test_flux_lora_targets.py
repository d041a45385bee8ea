"""Flux's LoRA target sets that take the blocks' every linear (all_linear, ai-toolkit's) and one
block list only (single_blocks, sd-scripts' train_blocks=single): which modules PEFT adapts, what
the pass keeps, and each trainer's words."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from helpers import spec

from autofit.backends import cpu, simulate
from autofit.knobs import REGISTRY, defaults
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset


def _tiny(backend: str = "simulate", **knobs: Any):
    """Flux.1-dev's blocks at width 32: two double-stream and two single-stream blocks."""
    probe = spec(
        "flux_dev", backend=backend, batch_size=1, resolution=256, train_mode="lora",
        precision="bf16_pure", **knobs,
    )  # fmt: skip
    model = copy.deepcopy(probe.model)
    model["architecture"].update(
        num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=64, pooled_projection_dim=32, axes_dims_rope=[4, 6, 6],
    )  # fmt: skip
    model["inputs"].update(text_dim=64, pooled_dim=32, t5_tokens=16)
    return dataclasses.replace(probe, model=model)


def _adapted(run: Any) -> set[str]:
    return {
        name.rsplit(".lora_A", 1)[0]
        for name, _ in run.model.named_parameters()
        if ".lora_A." in name
    }


def test_single_blocks_adapt_the_single_stream_blocks_only() -> None:
    run, log = simulate.trace(_tiny(lora_targets="single_blocks"))
    adapted = _adapted(run)
    assert adapted == {
        f"single_transformer_blocks.{i}.{m}"
        for i in range(2)
        for m in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out", "norm.linear")
    }
    # nothing before the single blocks trains, so the double blocks keep nothing for backward
    _, preset_log = simulate.trace(_tiny())
    assert (
        log.peak_report().breakdown["activations"]
        < (preset_log.peak_report().breakdown["activations"])
    )
    _, real = cpu.trace(_tiny("cpu", lora_targets="single_blocks"))
    assert real.peak_report() == log.peak_report()


def test_all_linear_adds_the_norms_and_the_single_blocks_own() -> None:
    adapted = _adapted(simulate.trace(_tiny(lora_targets="all_linear"))[0])
    for module in ("transformer_blocks.0.norm1.linear", "transformer_blocks.1.ff.net.2",
                   "single_transformer_blocks.1.proj_mlp", "single_transformer_blocks.0.norm.linear"):  # fmt: skip
        assert module in adapted


def test_words() -> None:
    preset = load_preset("flux_dev")
    config = {**defaults(), "train_mode": "lora", "lora_targets": "single_blocks"}
    knob, subject = REGISTRY["lora_targets"], Subject(config, preset)
    kohya = knob.express("kohya", "single_blocks", subject)
    assert isinstance(kohya, Say) and kohya.settings == {"network_args": ["train_blocks=single"]}
    for vocabulary in ("diffusers", "simpletuner"):
        assert isinstance(knob.express(vocabulary, "single_blocks", subject), Refuse)
    assert isinstance(knob.express("kohya", "all_linear", subject), Refuse)
