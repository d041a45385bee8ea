"""Which weights train, group by group: freeze tuning (the last blocks in full, the rest frozen)
and DoRA (LoRA with a trained magnitude per output feature), counted in bytes on small models, the
same on fake tensors as on real ones, and each rule in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import spec, with_blocks

from autofit.backends import cpu, simulate
from autofit.export import TARGETS
from autofit.export.base import Refused
from autofit.export.point import StudyPoint
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.models import load_preset
from autofit.simulator.tracker import CATEGORIES, round_allocation

F32 = 4
GPU = load_gpu("a40")


def _bytes(tensors: Any) -> int:
    return sum(round_allocation(t.numel() * t.element_size()) for t in tensors)


def _live_at_phase(tracker: Any, phase: str, category: str) -> int:
    """Bytes of `category` live just before the last step's `phase` began."""
    start = [index for index, name in tracker.phase_changes if name == phase][-1]
    wanted = CATEGORIES.index(category)
    live = tracker.live_at(start - 1)  # the phase's first event is its own
    return sum(tracker.sizes[a] for a in live if tracker.categories[a] == wanted)


def _same_allocations(probe: Any) -> None:
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.sizes == real.sizes
    assert fake.categories == real.categories
    assert fake.peak_report() == real.peak_report()


# --- freeze tuning --------------------------------------------------------------------------------


def _freeze(layers: int, blocks: int = 2, **knobs: Any) -> Any:
    probe = spec("tiny_sana", batch_size=2, train_mode="freeze", trainable_layers=layers, **knobs)
    return with_blocks(probe, blocks) if blocks != 2 else probe


@pytest.mark.parametrize("layers", [1, 2])
def test_freeze_holds_gradients_and_optimizer_state_for_exactly_its_blocks(layers: int) -> None:
    run, tracker = simulate.trace(_freeze(layers))
    blocks = list(run.model.transformer_blocks)
    trained = [p for block in blocks[len(blocks) - layers :] for p in block.parameters()]
    assert run.trainable_parameters() == trained
    # Under mixed precision the trained blocks are fp32 master weights, the rest stays bf16.
    assert {p.dtype for p in trained} == {torch.float32}
    assert {p.dtype for p in run.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    # One fp32 gradient per trained weight when the update starts ...
    assert _live_at_phase(tracker, "optimizer", "gradients") == _bytes(trained)
    # ... and fused AdamW's two moments and a 0-d step per trained weight after it.
    assert tracker.live_bytes("optimizer_state") == 2 * _bytes(trained) + len(trained) * 512


@pytest.mark.slow
def test_freeze_keeps_no_activations_of_the_frozen_blocks_before_the_trained_ones() -> None:
    """Six blocks: each trained block keeps the same activations, the frozen ones before it
    none, since no gradient flows into them. With checkpointing each trained block keeps only its
    input (128 tokens x width 32 in fp32), and the frozen blocks not even that."""

    def kept(layers: int, checkpointing: bool) -> int:
        _, tracker = simulate.trace(_freeze(layers, blocks=6, checkpointing=checkpointing))
        return _live_at_phase(tracker, "backward", "activations")

    plain = [kept(n, False) for n in (2, 3, 4)]
    assert plain[1] - plain[0] == plain[2] - plain[1] > 0
    block_input = round_allocation(2 * 64 * 32 * F32)  # batch x tokens x width
    checkpointed = [kept(n, True) for n in (1, 2, 3)]
    assert checkpointed[1] - checkpointed[0] == checkpointed[2] - checkpointed[1] == block_input


@pytest.mark.parametrize("checkpointing", [False, True])
def test_freeze_allocates_on_fake_tensors_what_it_allocates_for_real(checkpointing: bool) -> None:
    _same_allocations(_freeze(1, checkpointing=checkpointing))


def test_trainable_layers_above_the_block_count_is_one_line_naming_the_count() -> None:
    llama = load_preset("llama3_8b")
    knobs = {**defaults(), "train_mode": "freeze", "trainable_layers": 40}
    reason = invalid_reason(knobs, GPU, llama, "simulate")
    assert reason == "trainable_layers=40 is more than the 32 blocks of llama3_8b"
    flux = load_preset("flux_dev")  # 19 double-stream and 38 single-stream blocks
    assert invalid_reason({**knobs, "trainable_layers": 57}, GPU, flux, "simulate") is None
    assert "the 57 blocks of flux_dev" in invalid_reason(
        {**knobs, "trainable_layers": 58}, GPU, flux, "simulate"
    )
    # Outside freeze tuning the count means nothing and is never checked.
    assert invalid_reason({**knobs, "train_mode": "full"}, GPU, llama, "simulate") is None


def test_freeze_rules_are_one_line_each() -> None:
    knobs = {**defaults(), "train_mode": "freeze"}
    sdxl = load_preset("sdxl")
    assert invalid_reason(knobs, GPU, sdxl, "simulate") == (
        "train_mode=freeze trains the model's last blocks, which sdxl does not list"
    )
    flux = load_preset("flux_dev")
    assert invalid_reason({**knobs, "swap_blocks": 4}, GPU, flux, "simulate") == (
        "train_mode=freeze trains the last blocks, which swap_blocks keeps in host memory; "
        "use swap_blocks=0"
    )
    fp8 = invalid_reason({**knobs, "base_precision": "fp8"}, GPU, flux, "simulate")
    assert fp8 is not None and "\n" not in fp8 and "train_mode=freeze" in fp8


def test_fewer_trained_blocks_save_memory_over_more_and_freeze_over_full() -> None:
    layers, mode = REGISTRY["trainable_layers"], REGISTRY["train_mode"]
    assert layers.saves_memory_over(1, (1, 2, 4)) == 2
    assert layers.saves_memory_over(2, (1, 2, 4)) == 4
    assert layers.saves_memory_over(4, (1, 2, 4)) is None
    assert mode.saves_memory_over("freeze", ("full", "freeze")) == "full"
    assert mode.saves_memory_over("freeze", ("lora", "freeze")) is None
    assert mode.saves_memory_over("dora", ("lora", "dora")) is None  # DoRA holds more
    # Both change what each sample keeps: the search does not share their slopes.
    assert layers.per_sample_memory and mode.per_sample_memory


# --- DoRA -----------------------------------------------------------------------------------------


def _mlp(mode: str, batch: int = 2) -> Any:
    return spec("tiny_mlp", batch_size=batch, train_mode=mode, precision="fp32", optimizer="adamw")


def test_dora_adds_exactly_its_magnitude_vectors() -> None:
    """tiny_mlp's adapted layers: Linear(64 -> 256) and Linear(256 -> 64). DoRA adds one trained
    fp32 magnitude per output feature of each, with AdamW's two moments and step counter."""
    lora, lora_tracker = simulate.trace(_mlp("lora"))
    dora, dora_tracker = simulate.trace(_mlp("dora"))
    magnitudes = [p for n, p in dora.model.named_parameters() if "lora_magnitude_vector" in n]
    assert sorted(p.numel() for p in magnitudes) == [64, 256]
    assert dora.trainable_param_count == lora.trainable_param_count + 64 + 256
    grown = round_allocation(256 * F32) + round_allocation(64 * F32)
    parameters = dora_tracker.live_bytes("parameters") - lora_tracker.live_bytes("parameters")
    assert parameters == grown
    optimizer = dora_tracker.live_bytes("optimizer_state") - lora_tracker.live_bytes(
        "optimizer_state"
    )
    assert optimizer == 2 * grown + 2 * 512


def _dora_forward_allocations(monkeypatch: pytest.MonkeyPatch, probe: Any) -> list[Any]:
    """For every forward of a DoRA layer in the last step: (in, out, the sizes it allocated,
    which of them were still live when it returned)."""
    from peft.tuners.lora.dora import DoraLinearLayer

    from autofit.simulator.tracker import MemoryTracker

    trackers: list[MemoryTracker] = []
    enter = MemoryTracker.__enter__
    monkeypatch.setattr(
        MemoryTracker, "__enter__", lambda self: trackers.append(self) or enter(self)
    )
    windows: list[Any] = []
    forward = DoraLinearLayer.forward

    def recorded(self: Any, x: Any, **kwargs: Any) -> Any:
        tracker = trackers[-1]
        start = tracker.mark()
        out = forward(self, x, **kwargs)
        made = range(start, tracker.mark())
        live = set(tracker._live.values())
        base = kwargs["base_layer"]
        windows.append(
            (base.in_features, base.out_features, [tracker.sizes[a] for a in made],
             [a in live for a in made])
        )  # fmt: skip
        return out

    monkeypatch.setattr(DoraLinearLayer, "forward", recorded)
    simulate.trace(probe)
    return windows[-2:]  # the last step's two adapted layers


def test_dora_rebuilds_each_adapted_weight_in_temporaries_every_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """peft's DoRA forward (peft 0.21, tuners/lora/dora.py) for a layer of `i` inputs and `o`
    outputs at rank 16, fp32: the identity (i x i) through lora_A (i x 16) and lora_B (i x o) makes
    B@A, then the scaled product and the base weight plus it (o x i each) for the row norms. All
    of it is gone when the layer returns: none of it is kept for backward."""
    for i, o, sizes, still_live in _dora_forward_allocations(monkeypatch, _mlp("dora")):
        expected = [i * i, i * 16, i * o, o * i, o * i]
        assert sizes[:5] == [round_allocation(n * F32) for n in expected]
        assert not any(still_live[:5])


def test_dora_keeps_each_adapted_layers_outputs_for_backward() -> None:
    """Per sample (64 tokens), DoRA keeps what LoRA keeps and, for each adapted layer, the base
    layer's output and the adapter's output (the magnitude's gradient needs both): 2 x 64 x
    (256 + 64) fp32 values more."""

    def kept(mode: str, batch: int) -> int:
        _, tracker = simulate.trace(_mlp(mode, batch))
        return _live_at_phase(tracker, "backward", "activations")

    extra = [kept("dora", batch) - kept("lora", batch) for batch in (2, 4)]
    assert (extra[1] - extra[0]) // 2 == 2 * 64 * (256 + 64) * F32


def test_dora_allocates_on_fake_tensors_what_it_allocates_for_real() -> None:
    _same_allocations(_mlp("dora"))


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_dora_on_sana_allocates_on_fake_tensors_what_it_allocates_for_real(
    checkpointing: bool,
) -> None:
    _same_allocations(
        spec("tiny_sana", batch_size=2, train_mode="dora", checkpointing=checkpointing)
    )


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_qdora_stand_in_holds_what_bitsandbytes_holds(checkpointing: bool) -> None:
    """bitsandbytes' real 4-bit layers under peft's DoRA (cpu) and the stand-in (simulate): the
    same parameters and optimizer state; the peak within the 1 KiB QLoRA's stand-in differs by
    (peft wraps a real 4-bit layer in its own bitsandbytes LoRA layer, the stand-in in its
    generic one)."""
    probe = spec("tiny_sana", batch_size=2, train_mode="qdora", checkpointing=checkpointing)
    fake_run, fake = simulate.trace(probe)
    real_run, real = cpu.trace(probe)
    assert fake.live_bytes("parameters") == real.live_bytes("parameters")
    assert fake.live_bytes("optimizer_state") == real.live_bytes("optimizer_state")
    assert fake_run.trainable_param_count == real_run.trainable_param_count
    assert abs(fake.peak - real.peak) <= 1024


def test_dora_and_freeze_follow_the_lora_knobs_where_they_mean_something() -> None:
    preset = load_preset("llama3_8b")
    for knob in ("lora_rank", "lora_targets"):
        assert REGISTRY[knob].applies({"train_mode": "dora"}, preset)
        assert REGISTRY[knob].applies({"train_mode": "qdora"}, preset)
        assert not REGISTRY[knob].applies({"train_mode": "freeze"}, preset)
    assert REGISTRY["trainable_layers"].applies({"train_mode": "freeze"}, preset)
    assert not REGISTRY["trainable_layers"].applies({"train_mode": "lora"}, preset)
    knobs = {**defaults(), "train_mode": "dora", "base_precision": "fp8"}
    assert invalid_reason(knobs, GPU, preset, "simulate") == (
        "base_precision=fp8 stores a LoRA run's frozen base: train_mode=dora is measured with a "
        "16-bit base only; use train_mode=lora"
    )


# --- what trainers say --------------------------------------------------------------------------


def _export(target: str, preset: str, tmp_path: Path, **knobs: Any) -> Any:
    loaded = load_preset(preset)
    config = {**defaults(), "resolution": loaded.resolution, **knobs}
    point = StudyPoint(
        study="groups", summary_path=Path("groups/summary.json"), preset=loaded, gpu="a40",
        backend="simulate", label="best", config=config, peak_bytes=1, budget_bytes=2,
        samples_per_s=1.0,
    )  # fmt: skip
    try:
        return TARGETS[target].run(point, tmp_path)
    except Refused as refusal:
        return refusal


def test_simpletuner_says_dora_and_qdora_and_refuses_freeze(tmp_path: Path) -> None:
    dora = REGISTRY["train_mode"].words("simpletuner", "dora", None)  # type: ignore[arg-type]
    assert dict(dora.settings) == {"model_type": "lora", "lora_type": "standard", "use_dora": True}
    qdora = REGISTRY["train_mode"].words("simpletuner", "qdora", None)  # type: ignore[arg-type]
    assert qdora.settings["base_model_precision"] == "nf4-bnb" and qdora.settings["use_dora"]
    # bf16 under autocast: SimpleTuner's own mode, so that train_mode is what it refuses
    refused = _export(
        "simpletuner", "flux_dev", tmp_path, train_mode="freeze", precision="bf16_autocast"
    )
    assert isinstance(refused, Refused) and "\n" not in str(refused)
    assert str(refused).startswith("target=simpletuner cannot express train_mode=freeze")


@pytest.mark.parametrize("target", ["kohya", "diffusers", "sana"])
def test_trainers_without_dora_or_freeze_refuse_them_in_one_line(
    target: str, tmp_path: Path
) -> None:
    preset = "sana_1600m" if target == "sana" else "flux_dev"
    for mode in ("dora", "freeze"):
        refused = _export(target, preset, tmp_path, train_mode=mode, encoders="online")
        assert isinstance(refused, Refused), (target, mode)
        assert str(refused).startswith(f"target={target} cannot express train_mode={mode}")
        assert "\n" not in str(refused)
