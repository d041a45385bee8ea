"""offload_activations=attention: SimpleTuner's attention activation offload, run for real on the
CPU and on fake tensors, alone and inside checkpointed blocks and segments."""

from __future__ import annotations

from typing import Any

import pytest
from test_checkpoint_interval import EVERY, tiny_sd3

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset

ATTENTION = {"offload_activations": "attention"}
SEGMENTS = {**EVERY, "checkpoint_interval": 2, "checkpoint_stride": 3}


@pytest.mark.parametrize("knobs", [{}, EVERY, SEGMENTS], ids=["unchecked", "every", "segments"])
def test_fake_and_real_hold_the_same_bytes(knobs: dict[str, Any]) -> None:
    fake_run, fake = simulate.trace(tiny_sd3(**knobs, **ATTENTION))
    real_run, real = cpu.trace(tiny_sd3("cpu", **knobs, **ATTENTION))
    assert fake.peak == real.peak
    assert fake.peak_report().breakdown == real.peak_report().breakdown
    assert fake_run.traffic.link_bytes > 0 and real_run.traffic.link_bytes > 0


def _activations(**knobs: Any) -> int:
    _, log = simulate.trace(tiny_sd3(**knobs))
    return log.peak_report().breakdown["activations"]


@pytest.mark.parametrize("knobs", [{}, EVERY, SEGMENTS], ids=["unchecked", "every", "segments"])
def test_what_the_attention_saves_waits_on_the_host(knobs: dict[str, Any]) -> None:
    """Whether a block is checkpointed or not, what its attention saves is on the host between
    forward and backward; in a checkpointed block the attention's hooks are innermost, so
    backward brings back what forward copied, and the recomputation copies it out again."""
    assert _activations(**knobs, **ATTENTION) < _activations(**knobs)
    unchecked, _ = simulate.trace(tiny_sd3(**ATTENTION))
    every, _ = simulate.trace(tiny_sd3(**EVERY, **ATTENTION))
    assert every.traffic.link_bytes > unchecked.traffic.link_bytes  # copied out twice, back once


def _reason(model: str, **knobs: Any) -> str | None:
    config = {**defaults(), **ATTENTION, **knobs}
    return invalid_reason(config, load_gpu("a40"), load_preset(model), "simulate")


def test_only_where_simpletuner_offloads_attention() -> None:
    assert _reason("sd35_medium") is None
    assert _reason("flux_dev") is None
    assert _reason("sana_1600m") == (
        "offload_activations=attention: SimpleTuner offloads attention activations of sd3, flux, "
        "chroma, flux_kontext, not of the sana family"
    )
    assert _reason("sd35_medium", fsdp="full_shard") == (
        "offload_activations=attention with fsdp=full_shard is not modelled"
    )


def test_simpletuner_says_it_and_the_others_refuse() -> None:
    config = {**defaults(), **ATTENTION}
    subject = Subject(config, load_preset("sd35_medium"))
    knob = REGISTRY["offload_activations"]
    said = knob.express("simpletuner", "attention", subject)
    assert isinstance(said, Say)
    assert said.settings == {"gradient_checkpointing_offload_attention": True}
    for vocabulary in ("kohya", "diffusers", "sana", "trl"):
        assert isinstance(knob.express(vocabulary, "attention", subject), Refuse)


def test_the_second_attention_of_dual_attention_blocks_is_offloaded_too() -> None:
    """SD3.5 Medium's first blocks have a second attention (attn2): its saves go too."""
    import copy
    import dataclasses

    probe = tiny_sd3(**ATTENTION)
    dual = copy.deepcopy(probe.model)
    dual["architecture"]["dual_attention_layers"] = [0, 1, 2]
    single_run, _ = simulate.trace(probe)
    dual_run, _ = simulate.trace(dataclasses.replace(probe, model=dual))
    assert dual_run.traffic.link_bytes > single_run.traffic.link_bytes
