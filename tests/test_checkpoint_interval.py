"""checkpoint_interval and checkpoint_stride: SimpleTuner's checkpointing every N blocks, in
segments (SD3, Flux) or block by block (Sana), and torchtitan's every N-th layer of a language
model, run for real on the CPU and on fake tensors."""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any

import pytest
from helpers import assert_refused, spec, tiny_llama, with_blocks

from autofit.backends import cpu, simulate
from autofit.knobs import REGISTRY, defaults
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset
from autofit.run_state import RunState

EVERY = {"checkpointing": True}


def tiny_sd3(backend: str = "simulate", **knobs: Any):
    """SD3.5 Medium's blocks (joint attention, the last one context-only) at width 32, six of
    them, no dual attention: each block's activations the same size."""
    probe = spec("sd35_medium", backend=backend, batch_size=2, resolution=256, **knobs)
    model = copy.deepcopy(probe.model)
    model["architecture"].update(
        num_layers=6, num_attention_heads=2, attention_head_dim=16, joint_attention_dim=64,
        caption_projection_dim=32, pooled_projection_dim=32, dual_attention_layers=[],
        sample_size=32, pos_embed_max_size=32,
    )  # fmt: skip
    model["inputs"].update(text_dim=64, pooled_dim=32, t5_tokens=16)
    return dataclasses.replace(probe, model=model)


def tiny_sana(backend: str = "simulate", **knobs: Any):
    probe = spec("tiny_sana", backend=backend, batch_size=2, **knobs)
    model = copy.deepcopy(probe.model)
    model["architecture"]["num_layers"] = 4
    return dataclasses.replace(probe, model=model)


def four_layer_llama(backend: str = "simulate", **knobs: Any):
    return with_blocks(tiny_llama(backend, **knobs), 4)


def block_calls(probe, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times each block ran in a real run's steps on the CPU (forward, and again for a
    checkpointed block's recomputation)."""
    counts: collections.Counter[int] = collections.Counter()
    plain = RunState.checkpoint

    def counting(self: RunState, block: Any, *args: Any, **kwargs: Any) -> Any:
        if not counts:
            for i, member in enumerate(self.model.transformer_blocks):
                member.register_forward_pre_hook(lambda m, a, i=i: counts.update([i]))
            counts.update([-1])
        return plain(self, block, *args, **kwargs)

    monkeypatch.setattr(RunState, "checkpoint", counting)
    cpu.trace(probe)
    del counts[-1]
    return [counts[i] for i in sorted(counts)]


@pytest.mark.parametrize(
    ("probe", "knobs", "twice"),
    [
        # two steps: a checkpointed block runs four times, an unchecked one twice
        (tiny_sd3, {"checkpoint_interval": 2}, [1, 1, 1, 1, 1, 1]),
        (tiny_sd3, {"checkpoint_interval": 2, "checkpoint_stride": 3}, [1, 1, 0, 1, 1, 0]),
        (tiny_sana, {"checkpoint_interval": 2}, [1, 0, 1, 0]),
        (tiny_sana, {"checkpoint_interval": 2, "checkpoint_stride": 3}, [1, 1, 0, 1]),
    ],
)
def test_the_blocks_simpletuner_checkpoints_are_recomputed_and_no_others(
    probe, knobs: dict[str, int], twice: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = block_calls(probe("cpu", **EVERY, **knobs), monkeypatch)
    assert calls == [4 if t else 2 for t in twice]


@pytest.mark.parametrize(("interval", "checked"), [(1, [0, 1, 2, 3]), (2, [1, 3]), (3, [2])])
def test_a_language_model_checkpoints_every_nth_layer_counted_from_one(
    interval: int, checked: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchtitan's selective layer checkpointing: layers N-1, 2N-1, ... of a real run on the CPU
    go through the checkpoint (transformers' layers hand it their forward bound to the layer),
    the others run as they are."""
    seen: list[int] = []
    plain = RunState.checkpoint_call

    def recording(self: RunState, block: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(list(self.model.model.layers).index(block.args[0]))
        return plain(self, block, *args, **kwargs)

    monkeypatch.setattr(RunState, "checkpoint_call", recording)
    cpu.trace(four_layer_llama("cpu", **EVERY, checkpoint_interval=interval))
    assert sorted(set(seen)) == checked
    assert len(seen) == 2 * len(checked)  # two steps


@pytest.mark.parametrize(
    ("probe", "knobs"),
    [
        (tiny_sd3, {}),
        (tiny_sd3, {"checkpoint_interval": 2}),
        (tiny_sd3, {"checkpoint_interval": 2, "checkpoint_stride": 3}),
        (tiny_sd3, {"checkpoint_interval": 6}),
        (tiny_sana, {"checkpoint_interval": 2}),
        (four_layer_llama, {"checkpoint_interval": 2}),
        (four_layer_llama, {"checkpoint_interval": 4}),
    ],
)
def test_fake_and_real_hold_the_same_bytes(probe, knobs: dict[str, int]) -> None:
    _, fake = simulate.trace(probe(**EVERY, **knobs))
    _, real = cpu.trace(probe("cpu", **EVERY, **knobs))
    assert fake.peak == real.peak
    assert fake.peak_report().breakdown == real.peak_report().breakdown


def _activations(**knobs: Any) -> int:
    _, log = simulate.trace(tiny_sd3(**knobs))
    return log.peak_report().breakdown["activations"]


def test_a_segment_keeps_its_blocks_activations_at_once() -> None:
    """Backward recomputes a whole segment before its first gradient: at the peak N blocks'
    activations live together where checkpointing every block holds one; the whole model in one
    segment holds all of them, as checkpointing nothing does, less the blocks' saved inputs."""
    every = _activations(**EVERY)
    two = _activations(**EVERY, checkpoint_interval=2)
    three = _activations(**EVERY, checkpoint_interval=3)
    assert every < two < three
    assert three - two == pytest.approx(two - every, rel=0.05)  # one block's worth each
    whole = _activations(**EVERY, checkpoint_interval=6)
    assert whole <= _activations(checkpointing=False)


def test_unchecked_blocks_between_segments_keep_what_they_save() -> None:
    """Interval 1 of stride 2 checkpoints every other block; the others keep their activations
    from forward to backward, more than every block checkpointed, less than none."""
    every = _activations(**EVERY)
    halves = _activations(**EVERY, checkpoint_interval=2, checkpoint_stride=4)
    none = _activations(checkpointing=False)
    assert every < halves < none


RULES = [
    ({"checkpoint_interval": 2}, "sd35_medium", "checkpoint_interval=2 needs checkpointing=true"),
    ({**EVERY, "checkpoint_interval": 2}, "sdxl", "checkpoint_interval=2: the sdxl family checkpoints every block; an interval exists for "),
    ({**EVERY, "checkpoint_interval": 2, "checkpoint_stride": 4}, "llama3_8b", "checkpoint_stride=4: a language model's every-N-th-layer checkpointing (torchtitan's) has no stride; valid: 0"),
    ({**EVERY, "checkpoint_stride": 4}, "sd35_medium", "checkpoint_stride=4 needs checkpoint_interval above 1"),
    ({**EVERY, "checkpoint_interval": 3, "checkpoint_stride": 2}, "sd35_medium", "checkpoint_stride=2 is less than checkpoint_interval=3; valid: 0, or 3 and more"),
    ({**EVERY, "checkpoint_interval": 2, "swap_blocks": 4}, "sd35_medium", "checkpoint_interval=2 with swap_blocks: SimpleTuner falls back"),
]  # fmt: skip


@pytest.mark.parametrize(("knobs", "model", "reason"), RULES)
def test_rules_name_the_value_and_what_is_valid(
    knobs: dict[str, Any], model: str, reason: str
) -> None:
    assert_refused(knobs, model, reason)


def test_simpletuner_says_interval_and_stride_others_refuse() -> None:
    config = {**defaults(), **EVERY, "checkpoint_interval": 2, "checkpoint_stride": 4}
    subject = Subject(config, load_preset("sd35_medium"))
    interval, stride = REGISTRY["checkpoint_interval"], REGISTRY["checkpoint_stride"]
    said = interval.express("simpletuner", 2, subject)
    assert isinstance(said, Say) and said.settings == {"gradient_checkpointing_interval": 2}
    said = stride.express("simpletuner", 4, subject)
    assert isinstance(said, Say) and said.settings == {"gradient_checkpointing_segment_stride": 4}
    for vocabulary in ("kohya", "diffusers"):
        refused = interval.express(vocabulary, 2, subject)
        assert isinstance(refused, Refuse) and "checkpoint_interval" in refused.why
    llama = Subject(config, load_preset("llama3_8b"))
    refused = interval.express("trl", 2, llama)
    assert isinstance(refused, Refuse) and "checkpoints every layer" in refused.why
    sana = Subject(config, load_preset("sana_1600m"))
    refused = interval.express("sana", 2, sana)
    assert isinstance(refused, Refuse) and refused.offers == "checkpoint_interval=1"
    # every block, or checkpointing off, asks nothing of any trainer
    for vocabulary in ("simpletuner", "kohya", "diffusers", "sana", "trl"):
        assert interval.express(vocabulary, 1, subject) == Say()
