"""ZeRO-3's gathered weights (the zero3_* knobs): DeepSpeed's parameter coordinator, run for real
(cpu backend, one process) and emulated (autofit/emulations/zero_gather.py), gathers and releases
the same weights at every one of its events; the settings reach DeepSpeed's config, and are
refused without ZeRO-3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import spec, with_blocks

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, invalid_reason
from autofit.knobs.zero_stage import probe_config
from autofit.models import load_preset

SMALL = dict(
    zero3_prefetch_bucket=3000,
    zero3_max_live_params=20000,
    zero3_max_reuse_distance=5000,
    zero3_persistence_threshold=600,
)


def _real_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """What DeepSpeed's coordinator holds gathered (elements, whole weights) after each of its
    events, recorded from the parameters' own status."""
    from deepspeed.runtime.zero import parameter_offload
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.runtime.zero.partitioned_param_coordinator import (
        PartitionedParameterCoordinator as Coordinator,
    )

    events: list[tuple[str, int]] = []
    init = parameter_offload.DeepSpeedZeRoOffload.__init__

    def remember_model(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        init(self, module, *args, **kwargs)
        self.param_coordinator.model_for_test = module

    def recorded(name: str, event: str) -> None:
        method = getattr(Coordinator, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(self, *args, **kwargs)
            params = self.model_for_test.parameters()
            gathered = sum(
                p.ds_numel for p in params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE
            )
            events.append((event, gathered))
            return result

        monkeypatch.setattr(Coordinator, name, wrapper)

    monkeypatch.setattr(parameter_offload.DeepSpeedZeRoOffload, "__init__", remember_model)
    for name, event in (
        ("fetch_sub_module", "fetch"),
        ("release_sub_module", "release"),
        ("release_backward_leftovers", "leftovers"),
        ("release_and_reset_all", "release_all"),
    ):
        recorded(name, event)
    return events


def _emulated_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    from autofit.emulations import zero_gather

    events: list[tuple[str, int]] = []
    init = zero_gather.GatherCoordinator.__init__

    def listened(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.listeners.append(lambda event: events.append((event, self.gathered_numel())))

    monkeypatch.setattr(zero_gather.GatherCoordinator, "__init__", listened)
    return events


def _from_first_fetch(events: list[tuple[str, int]]) -> list[tuple[str, int]]:
    start = next(i for i, (event, _) in enumerate(events) if event == "fetch")
    return events[start:]


@pytest.mark.long
@pytest.mark.parametrize(
    "knobs",
    [
        dict(train_mode="lora"),  # defaults: the tiny model is prefetched whole, held till the step
        dict(train_mode="lora", checkpointing=True, **SMALL),
        dict(train_mode="full", checkpointing=True, **SMALL),
        dict(train_mode="full", zero3_prefetch_bucket=0, zero3_persistence_threshold=0),
    ],
    ids=["lora-defaults", "lora-checkpointing-small", "full-checkpointing-small", "no-prefetch"],
)
def test_the_emulated_coordinator_gathers_what_deepspeeds_gathers(
    knobs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two steps: the first records the trace (a module's weights released after each use), the
    second prefetches along it and keeps what the settings keep. After every fetch and release
    the same weights are gathered, element for element."""
    probe = dict(batch_size=2, zero_stage=3, **knobs)
    real = _real_events(monkeypatch)
    cpu.trace(spec("tiny_sana", backend="cpu", **probe))
    monkeypatch.undo()
    fake = _emulated_events(monkeypatch)
    simulate.trace(spec("tiny_sana", **probe))
    real, fake = _from_first_fetch(real), _from_first_fetch(fake)
    assert [e for e, _ in real].count("release_all") == 2  # each step's start
    assert fake == real
    # The second step holds more than the first at its peak (it prefetches and keeps).
    second = next(i for i, (e, _) in enumerate(fake) if e == "release_all") + 1
    assert max(n for _, n in fake[second:]) >= max(n for _, n in fake[:second])


def _llama(**knobs: Any):
    return with_blocks(
        spec("llama3_2_1b", resolution=128, zero_stage=3, world_size=4, train_mode="lora",
             checkpointing=True, **knobs),
        2,
    )  # fmt: skip


def test_weights_kept_for_reuse_are_held_whole_at_the_forward_peak() -> None:
    """Across four GPUs, at the forward's peak (the logits, under the tied embedding): with
    DeepSpeed's defaults every weight the forward used is still gathered whole (each is used
    again in backward within 1e9 elements, the norms are persistent); with nothing prefetched,
    kept for reuse or persistent, only the embedding is. The difference is those weights' bytes,
    to the byte."""
    run, defaults = simulate.trace(_llama())
    coordinator = run._stepper.optimizer.coordinator
    _, lean = simulate.trace(
        _llama(zero3_prefetch_bucket=0, zero3_max_reuse_distance=0, zero3_persistence_threshold=0)
    )
    embedding = run.model.get_input_embeddings().weight
    others = sum(n for p, n in coordinator.numel.items() if p is not embedding)
    forward = [t.peak_report().phase_peaks["forward"] for t in (defaults, lean)]
    assert forward[0] - forward[1] == 2 * others  # bf16


@pytest.mark.parametrize("name", ["zero3_prefetch_bucket", "zero3_max_live_params",
                                  "zero3_max_reuse_distance", "zero3_persistence_threshold"])  # fmt: skip
def test_the_settings_are_zero3s_and_reach_deepspeeds_config(name: str) -> None:
    knob = REGISTRY[name]
    preset = load_preset("llama3_2_1b")
    gpu = load_gpu("a40")
    base = {k: v.default for k, v in REGISTRY.items()} | {"resolution": 128, "precision": "bf16"}
    refused = invalid_reason({**base, "zero_stage": 2, name: 7}, gpu, preset, "simulate")
    assert refused == f"{name}=7 is ZeRO-3's {knob.key}: it needs zero_stage=3"
    assert invalid_reason({**base, "zero_stage": 2}, gpu, preset, "simulate") is None
    zero3 = {**base, "zero_stage": 3, name: 7}
    assert invalid_reason(zero3, gpu, preset, "simulate") is None
    block = probe_config(zero3)["zero_optimization"]
    assert block[knob.key] == 7
    assert set(block) >= {"stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                          "stage3_max_reuse_distance", "stage3_param_persistence_threshold"}  # fmt: skip
    assert (
        "stage3_prefetch_bucket_size"
        not in probe_config({**base, "zero_stage": 2})["zero_optimization"]
    )


def test_deepspeed_reads_the_exported_settings(tmp_path: Path) -> None:
    """The block as DeepSpeed's own config parser reads it."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    base = {k: v.default for k, v in REGISTRY.items()} | {"precision": "bf16", "zero_stage": 3}
    block = probe_config({**base, **SMALL})["zero_optimization"]
    parsed = DeepSpeedZeroConfig(**json.loads(json.dumps(block)))
    assert (parsed.prefetch_bucket_size, parsed.max_live_parameters) == (3000, 20000)
    assert (parsed.max_reuse_distance, parsed.param_persistence_threshold) == (5000, 600)
