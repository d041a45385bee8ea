"""A simulated probe traces its first step's update alone and its second step whole, and writes
the log of both full steps from the second's forward and backward pass
(autofit/simulator/first_step.py): what it reports is what tracing both steps reports, to the
byte, and a pass that leaves state behind it is traced twice instead."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import spec as make
from helpers import with_blocks

from autofit.backends import simulate
from autofit.gpus import load_gpu
from autofit.models import ModelPreset, load_preset
from autofit.probe.build import make_spec
from autofit.probe.spec import ProbeSpec
from autofit.simulator.batch_curve import canonical_frees
from autofit.simulator.first_step import compact_phases
from autofit.simulator.roofline import RooflineCounter
from autofit.simulator.step_log import StepLog

TESTS = Path(__file__).parent


def _phases(log: StepLog) -> list[str]:
    """The phase of every event."""
    phases, changes, phase, at = [], log.phase_changes, "setup", 0
    for index in range(len(log.events)):
        while at < len(changes) and changes[at][0] <= index:
            phase, at = changes[at][1], at + 1
        phases.append(phase)
    return phases


def _traced(probe: ProbeSpec, one_pass: bool) -> tuple[Any, ...] | None:
    roofline = RooflineCounter(probe.gpu_spec, keep_kernels=True)
    traced = simulate._trace(probe, roofline, one_pass)
    if traced is None:
        return None
    run, log = traced
    figures = simulate.measurement(
        probe, log, roofline.cost, run.param_count, run.trainable_param_count
    )
    return log, roofline, figures


def _differences(probe: ProbeSpec) -> list[str]:
    """What the one-pass trace of `probe` reports differently from tracing both steps; fails
    where the probe was traced twice instead of spliced."""
    spliced = _traced(probe, one_pass=True)
    assert spliced is not None, "the probe was not spliced"
    whole = _traced(probe, one_pass=False)
    assert whole is not None
    (log, roofline, figures), (log2, roofline2, figures2) = spliced, whole
    # Frees that follow one another come in the order the garbage collector drops their
    # storages, which differs from run to run: the batch curve compares them in one order too.
    parts = {
        "events": (canonical_frees(log.events), canonical_frees(log2.events)),
        "phases": (_phases(log), _phases(log2)),
        "kernels": (roofline.kernels, roofline2.kernels),
        "cost": (roofline.cost, roofline2.cost),
        "figures": (figures, figures2),
    }
    for name in ("raw_sizes", "categories", "host_raw_sizes", "host_pinned", "host_events"):
        parts[name] = (list(getattr(log, name)), list(getattr(log2, name)))
    return [name for name, (a, b) in parts.items() if a != b]


CASES = [
    # (model, gpu, knobs): plain; bf16 weights; checkpointed 8-bit state; paged state (host);
    # an EMA copy on the GPU and on the host; a validation pass; encoders run in the step; LoRA
    ("tiny_sana", "a40", {"precision": "bf16"}),
    ("tiny_sana", "a40", {"precision": "bf16_pure", "optimizer": "adamw_bf16"}),
    ("tiny_sana", "a40", {"checkpointing": True, "optimizer": "adamw8bit"}),
    ("tiny_sana", "a40", {"optimizer": "paged_adamw8bit"}),
    ("tiny_sana", "a40", {"optimizer": "adafactor", "ema": "gpu"}),
    ("tiny_sana", "a40", {"optimizer": "came", "ema": "cpu"}),
    ("tiny_sana", "a40", {"optimizer": "lion", "validation": "on"}),
    ("tiny_sana", "a40", {"encoders": "online"}),
    ("tiny_mlp", "l4", {"train_mode": "lora", "precision": "bf16_pure"}),
]


@pytest.mark.parametrize("model,gpu,knobs", CASES, ids=lambda v: str(v)[:50])
def test_one_pass_reports_what_two_whole_steps_report(model: str, gpu: str, knobs: dict) -> None:
    probe = make(model, gpu, batch_size=3, resolution=128 if model == "tiny_sana" else 64, **knobs)
    assert _differences(probe) == []


@pytest.mark.parametrize(
    "knobs",
    [
        {"precision": "fp16"},  # the loss scaler's state is made by its first backward
        {"fused_backward": "parameter", "optimizer": "adafactor"},  # the update runs in backward
        {"zero_stage": 2},  # DeepSpeed drives the update
        {"swap_blocks": 1},  # backward moves the swapped blocks' gradients to the host
    ],
    ids=str,
)
def test_runs_whose_update_is_not_the_loop_s_own_trace_both_steps(knobs: dict) -> None:
    probe = make("tiny_sana", "a40", batch_size=3, resolution=128, **knobs)
    run, log = simulate.trace(probe)
    assert log is run.tracker  # both steps traced whole: the tracker's own log


def test_a_pass_that_leaves_state_behind_is_traced_twice() -> None:
    """A first pass that fills a cache allocates what the second does not: a log spliced from
    the second would lack it. The splice refuses, and the trace is the two whole steps'."""
    sys.path.insert(0, str(TESTS))
    try:
        preset = load_preset("custom")
        preset = ModelPreset.from_dict({**preset.to_dict(), "entry": "custom_models.cached:build"})
        probe = make_spec(preset, load_gpu("l4"), {"batch_size": 2, "resolution": 64}, "simulate")
        assert simulate._trace(probe, None, one_pass=True) is None
        run, log = simulate.trace(probe)
        assert log is run.tracker
        # the cache is made once, in the first step's pass, and held from then on
        table = 8 * 8 * 64 * 4
        tables = [a for a in range(len(log.raw_sizes)) if log.raw_sizes[a] == table]
        assert tables and all(~a not in log.events for a in tables[:1])
    finally:
        sys.path.remove(str(TESTS))


def test_phase_changes_in_their_least_form_say_the_same_phases() -> None:
    changes = [(0, "setup"), (3, "forward"), (3, "setup"), (3, "backward"), (5, "backward")]
    changes += [(7, "setup"), (7, "optimizer"), (9, "setup"), (12, "setup")]
    compact = compact_phases(changes)
    assert compact == [(0, "setup"), (3, "backward"), (7, "optimizer"), (9, "setup")]
    log, least = StepLog(), StepLog()
    log.events = least.events = list(range(12))
    log.phase_changes, least.phase_changes = changes, compact
    assert _phases(log) == _phases(least)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,knobs",
    [
        ("sana_600m", {"resolution": 512}),
        ("sd35_medium", {"resolution": 512, "checkpointing": True}),
        ("sdxl", {"resolution": 512}),
        ("sd3_controlnet", {"resolution": 512}),
        ("flux_dev", {"resolution": 512, "train_mode": "lora", "base_precision": "fp8"}),
        ("llama3_2_1b", {"resolution": 1024, "train_mode": "full"}),
        ("llama3_2_1b", {"resolution": 1024, "train_mode": "qlora"}),
        ("llama3_2_1b", {"resolution": 1024, "optimizer": "paged_adamw8bit"}),
    ],
    ids=lambda v: str(v)[:30],
)
def test_presets_report_from_one_pass_what_two_whole_steps_report(model: str, knobs: dict) -> None:
    probe = with_blocks(make(model, "h100_80", batch_size=2, **knobs), 2)
    assert _differences(probe) == []
