"""A simulated probe traces its first step's update alone and its second step whole, and writes
the log of both full steps from the second's forward and backward pass
(autofit/fastpath/first_step.py): what it reports is what tracing both steps reports, to the
byte, and a pass that leaves state behind it is traced twice instead."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import custom_preset, with_blocks
from helpers import spec as make

from autofit.backends import simulate
from autofit.fastpath import shared_updates
from autofit.fastpath.batch_curve import canonical_frees
from autofit.fastpath.first_step import Pass
from autofit.gpus import load_gpu
from autofit.probe.build import make_spec
from autofit.records.probe import ProbeSpec
from autofit.simulator.roofline import RooflineCounter
from autofit.simulator.step_log import StepLog, compact_phases


def _phases(log: StepLog) -> list[str]:
    """The phase of every event."""
    phases, changes, phase, at = [], log.phase_changes, "setup", 0
    for index in range(len(log.events)):
        while at < len(changes) and changes[at][0] <= index:
            phase, at = changes[at][1], at + 1
        phases.append(phase)
    return phases


def _traced(probe: ProbeSpec, how: str, pass_: Pass | None = None) -> tuple[Any, ...]:
    """`probe`'s log, priced step and figures: traced as a probe traces it (`one pass`), with
    both steps whole (`whole`), or assembled from `pass_` (`composed`); fails where the first
    two ways are the same one (the probe was not assembled from its pass)."""
    roofline = RooflineCounter(probe.gpu_spec, keep_kernels=True)
    if how == "whole":
        run, log, _ = simulate.trace_run(probe, roofline, alone=0)
        counts = run.param_count, run.trainable_param_count
    elif how == "composed":
        assert pass_ is not None
        updates = shared_updates.traced_updates(probe)
        assert updates is not None, "the updates could not be traced alone"
        log = shared_updates.composed_steps(updates, pass_, roofline)
        assert log is not None, "the probe was not assembled"
        counts = updates.counts
    else:
        traced = simulate.traced_steps(probe, roofline)
        assert traced.pass_ is not None, "the probe was not assembled from its pass"
        log, counts = traced.log, (traced.run.param_count, traced.run.trainable_param_count)
    figures = simulate.measurement(probe, log, roofline.cost, *counts)
    return log, roofline, figures


def _differences(one: tuple[Any, ...], other: tuple[Any, ...]) -> list[str]:
    """What one trace of a probe reports differently from another."""
    (log, roofline, figures), (log2, roofline2, figures2) = one, other
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
    # ZeRO: stage 1 updates from the gradients, stage 2 from the share they are reduced into as
    # backward makes them (and frees them), on the GPU or, offloaded, on the host (each
    # gradient crosses the host link in backward)
    ("tiny_sana", "a40", {"zero_stage": 1}),
    ("tiny_sana", "a40", {"zero_stage": 2, "checkpointing": True}),
    ("tiny_sana", "a40", {"zero_stage": 2, "offload_optimizer": "cpu"}),
    # saved activations copied to pinned host memory in forward and back in backward: the pass
    # takes and gives back host memory
    ("tiny_sana", "a40", {"offload_activations": "cpu", "checkpointing": True}),
]


@pytest.mark.parametrize("model,gpu,knobs", CASES, ids=lambda v: str(v)[:50])
def test_one_pass_reports_what_two_whole_steps_report(model: str, gpu: str, knobs: dict) -> None:
    probe = make(model, gpu, batch_size=3, resolution=128 if model == "tiny_sana" else 64, **knobs)
    assert _differences(_traced(probe, "one pass"), _traced(probe, "whole")) == []


@pytest.mark.parametrize(
    "member",
    [
        {"optimizer": "adamw8bit"},
        {"optimizer": "paged_adamw8bit"},
        {"optimizer": "adafactor", "ema": "gpu"},
        {"optimizer": "came", "ema": "cpu"},
        {"optimizer": "lion", "validation": "on"},
        {"optimizer": "sgd"},
        {"optimizer_impl": "foreach", "allocator": "expandable_segments"},
    ],
    ids=str,
)
def test_a_structure_that_differs_in_its_update_is_assembled_from_another_s_pass(
    member: dict,
) -> None:
    """The pass of AdamW's run, with another optimizer's (or an EMA's, or a validation pass's)
    setup and updates, reports what that run's own trace reports."""
    knobs = {"batch_size": 3, "resolution": 128, "precision": "bf16"}
    lender_probe = make("tiny_sana", "a40", **knobs, optimizer="adamw")
    lender = simulate.traced_steps(
        lender_probe, RooflineCounter(lender_probe.gpu_spec, keep_kernels=True)
    )
    assert lender.pass_ is not None
    probe = make("tiny_sana", "a40", **{"optimizer": "adamw", **knobs, **member})
    composed = _traced(probe, "composed", lender.pass_)
    assert _differences(composed, _traced(probe, "whole")) == []


def test_a_structure_is_assembled_from_a_pass_that_uses_the_host() -> None:
    """A pass that copies saved activations to pinned host memory and back, with another
    optimizer's setup and updates (and an EMA copy on the host): its host events are copied
    into both steps, and the bytes it moves priced with the update's."""
    knobs = {"batch_size": 3, "resolution": 128, "offload_activations": "cpu"}
    lender_probe = make("tiny_sana", "a40", **knobs)
    lender = simulate.traced_steps(
        lender_probe, RooflineCounter(lender_probe.gpu_spec, keep_kernels=True)
    )
    assert lender.pass_ is not None and lender.pass_.host_events and lender.pass_.moved[0] > 0
    probe = make("tiny_sana", "a40", **knobs, optimizer="came", ema="cpu")
    assert _differences(_traced(probe, "composed", lender.pass_), _traced(probe, "whole")) == []


@pytest.mark.parametrize(
    "knobs",
    [
        {"precision": "fp16"},  # the loss scaler's state is made by its first backward
        {"fused_backward": "parameter", "optimizer": "adafactor"},  # the update runs in backward
        {"zero_stage": 3},  # its pass gathers the weights it partitions
        {"swap_blocks": 1},  # backward moves the swapped blocks' gradients to the host
    ],
    ids=str,
)
def test_runs_whose_update_is_not_the_loop_s_own_trace_both_steps(knobs: dict) -> None:
    probe = make("tiny_sana", "a40", batch_size=3, resolution=128, **knobs)
    traced = simulate.traced_steps(probe)
    assert traced.pass_ is None and traced.log is traced.run.tracker  # both steps traced whole


@pytest.mark.long
def test_a_loop_that_keeps_its_gradients_traces_both_steps() -> None:
    """The SD3 ControlNet example zeroes its gradients in place: the second step's backward adds
    into the first's, which the first's own backward made."""
    probe = make("sd3_controlnet", "h100_80", batch_size=1, resolution=256)
    traced = simulate.traced_steps(probe)
    assert traced.pass_ is None and traced.log is traced.run.tracker


def test_a_parameter_the_pass_gives_no_gradient_is_traced_twice() -> None:
    """A trainable weight the loss never reaches has no gradient, and the optimizer no state for
    it; gradients made directly for every trainable weight would give it both."""
    with custom_preset("custom_models.unused:build") as preset:
        probe = make_spec(preset, load_gpu("l4"), {"batch_size": 2, "resolution": 64}, "simulate")
        traced = simulate.traced_steps(probe)
    assert traced.pass_ is None and traced.log is traced.run.tracker


def test_a_pass_that_leaves_state_behind_is_traced_twice() -> None:
    """A first pass that fills a cache allocates what the second does not: a log spliced from
    the second would lack it. The splice refuses, and the trace is the two whole steps'."""
    with custom_preset("custom_models.cached:build") as preset:
        probe = make_spec(preset, load_gpu("l4"), {"batch_size": 2, "resolution": 64}, "simulate")
        traced = simulate.traced_steps(probe)
    assert traced.pass_ is None
    log = traced.log
    assert log is traced.run.tracker
    # the cache is made once, in the first step's pass, and held from then on
    table = 8 * 8 * 64 * 4
    tables = [a for a in range(len(log.raw_sizes)) if log.raw_sizes[a] == table]
    assert tables and all(~a not in log.events for a in tables[:1])


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
        ("sana_600m", {"resolution": 512, "zero_stage": 2, "offload_optimizer": "cpu"}),
        ("sd35_medium", {"resolution": 512, "checkpointing": True}),
        ("sdxl", {"resolution": 512}),
        ("sana_1600m", {"resolution": 1024, "precision": "bf16_pure", "optimizer": "adamw_bf16"}),
        ("flux_dev", {"resolution": 512, "train_mode": "lora", "base_precision": "fp8"}),
        ("llama3_2_1b", {"resolution": 1024, "train_mode": "full"}),
        ("llama3_2_1b", {"resolution": 1024, "train_mode": "qlora"}),
        ("llama3_2_1b", {"resolution": 1024, "optimizer": "paged_adamw8bit"}),
    ],
    ids=lambda v: str(v)[:30],
)
def test_presets_report_from_one_pass_what_two_whole_steps_report(model: str, knobs: dict) -> None:
    probe = with_blocks(make(model, "h100_80", batch_size=2, **knobs), 2)
    assert _differences(_traced(probe, "one pass"), _traced(probe, "whole")) == []


@pytest.mark.long
def test_a_scan_assembles_the_rest_of_a_group_from_the_first_structure_s_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a scan of structures that differ only in the optimizer, the others' traces are
    assembled from the first one's pass, and answer as each structure's scan alone does."""
    from autofit.fastpath.scan import scan, scan_group

    assembled: list[int] = []

    def counted(probe: ProbeSpec) -> Any:
        updates = traced_updates(probe)
        assembled.append(probe.knobs["batch_size"]) if updates else None
        return updates

    traced_updates = shared_updates.traced_updates
    monkeypatch.setattr(shared_updates, "traced_updates", counted)
    knobs = {"batch_size": 1, "resolution": 128, "precision": "bf16"}
    first, other = (make("tiny_sana", "a40", **knobs, optimizer=o) for o in ("adamw", "lion"))
    grouped = scan_group([(first, 1), (other, 1)], 1_000_000)[1]
    assert assembled == [1_000_000]  # the top of the range, where the first structure traced first
    alone = scan(other, 1, 1_000_000)
    assert grouped.best_batch == alone.best_batch and grouped.shared and not alone.shared
    timing = {"versions", "wall_s"}
    for one, own in zip(grouped.results, alone.results, strict=True):
        assert {k: v for k, v in one.to_dict().items() if k not in timing} == {
            k: v for k, v in own.to_dict().items() if k not in timing
        }
