"""The scans of one search share each configuration's setup and updates
(autofit/fastpath/shared_updates.py): traced alone, they do not depend on the knobs that change
only the pass, which every such knob's values show here; and a scan answers from shared ones
exactly as from its own."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from helpers import spec as make
from helpers import tiny_wan, with_blocks

from autofit.fastpath import shared_updates
from autofit.fastpath.batch_curve import canonical_frees
from autofit.fastpath.scan import TracedPoint, scan_group
from autofit.fastpath.shared_updates import SharedUpdates, Updates
from autofit.fastpath.update_keys import updates_key
from autofit.knobs import registry
from autofit.records.probe import ProbeSpec

PASS_ONLY = sorted(name for name, knob in registry().items() if knob.reach == "pass")


def _parts(updates: Updates) -> dict[str, Any]:
    """Everything of a setup-and-updates trace that an assembled log or price is made of (frees
    that follow one another in one order, as the batch curve compares them)."""
    log = updates.log
    parts: dict[str, Any] = {
        "events": canonical_frees(log.events),
        "host_events": canonical_frees(log.host_events, log.host_event_phases),
    }
    for name in ("raw_sizes", "categories", "phase_changes", "host_raw_sizes", "host_pinned"):
        parts[name] = list(getattr(log, name))
    for name in ("first", "second", "kernels", "traffic", "counts"):
        parts[name] = getattr(updates, name)
    return parts


def _values(name: str) -> list[Any]:
    """Two or more values of a knob that changes only the pass."""
    if name == "resolution":
        return [64, 128]
    if name == "frames":  # a video model's clip lengths
        return [5, 9]
    if name in ("checkpoint_interval", "checkpoint_stride"):
        return [1, 2] if name == "checkpoint_interval" else [0, 3]
    choices = registry()[name].choices
    assert choices, f"{name}: say which values to compare"
    return list(choices)


def _probe(name: str, value: Any) -> ProbeSpec:
    knobs = {"batch_size": 2, "optimizer": "adafactor", "ema": "gpu", name: value}
    if name.startswith("checkpoint_"):  # a schedule of checkpointed blocks: two of them
        knobs = {"checkpointing": True, "checkpoint_interval": 2, **knobs}
    if name == "loss":  # a language model's
        return with_blocks(make("llama3_2_1b", "h100_80", resolution=64, **knobs), 1)
    if name == "frames":  # a video model's
        return tiny_wan(**knobs)
    return make("tiny_sana", "a40", **{"resolution": 128, **knobs})


def test_the_knobs_that_change_only_the_pass_are_declared() -> None:
    assert PASS_ONLY == [
        "attention", "checkpoint_interval", "checkpoint_policy", "checkpoint_stride",
        "checkpointing", "compile", "frames", "loss", "offload_activations", "resolution",
    ]  # fmt: skip


@pytest.mark.parametrize("name", PASS_ONLY)
def test_a_knob_that_changes_only_the_pass_leaves_setup_and_updates_as_they_are(name: str) -> None:
    """Each value of the knob gives the same setup and updates, and the same key: a search may
    trace them for one value and use them for all."""
    traced = []
    for value in _values(name):
        probe = _probe(name, value)
        updates = shared_updates.traced_updates(probe)
        assert updates is not None
        traced.append((updates_key(probe), _parts(updates)))
    first_key, first = traced[0]
    for key, parts in traced[1:]:
        assert key == first_key
        assert [k for k in first if first[k] != parts[k]] == []


def test_the_resolution_a_validation_pass_renders_at_is_part_of_the_key() -> None:
    """A validation pass at the training resolution renders at it after training: the setup and
    updates then differ with it, and so do their keys."""
    knobs = {"batch_size": 2, "validation": "on"}
    low, high = (make("tiny_sana", "a40", resolution=r, **knobs) for r in (64, 128))
    assert updates_key(low) != updates_key(high)
    one, other = (shared_updates.traced_updates(p) for p in (low, high))
    assert one is not None and other is not None
    assert _parts(one)["raw_sizes"] != _parts(other)["raw_sizes"]
    native = [make("tiny_sana", "a40", resolution=r, validation_resolution="native", **knobs)
              for r in (64, 128)]  # fmt: skip
    assert updates_key(native[0]) == updates_key(native[1])


def _group(resolution: int, checkpointing: bool) -> list[ProbeSpec]:
    knobs = {"batch_size": 3, "resolution": resolution, "checkpointing": checkpointing}
    return [make("tiny_sana", "a40", **knobs, optimizer=o) for o in ("adamw", "lion", "adafactor")]


def _point(point: TracedPoint) -> dict[str, Any]:
    """What a traced point answers with: its record (which a batch curve is fitted through or
    lent to), its priced step and its result."""
    record = point.record
    return {
        "record": (record.structure, record.numbers.tolist(), record.parts, record.rates),
        "counts": (record.param_count, record.trainable_param_count),
        "cost": point.cost,
        "result": {k: v for k, v in point.result().to_dict().items() if k != "versions"},
    }


def test_a_point_assembled_from_another_scan_s_updates_is_the_one_from_its_own(
    tmp_path: Any,
) -> None:
    """Two groups of a search (another resolution, checkpointing on) share their members'
    setup and updates: the second traces none of them, and its points are the same to the byte
    as those it assembles from its own."""
    kept = SharedUpdates(tmp_path)
    first = _group(64, False)
    lender = TracedPoint(first[0], {})
    for member in first[1:]:
        TracedPoint(member, {}, lender, kept)
    assert (kept.traced, kept.reused) == (2, 0)
    second = _group(128, True)
    lender = TracedPoint(second[0], {})
    assert lender.pass_ is not None
    shared, alone = SharedUpdates(tmp_path), SharedUpdates(None)
    for member in second[1:]:
        one, own = TracedPoint(member, {}, lender, shared), TracedPoint(member, {}, lender, alone)
        assert one.pass_ is lender.pass_ and own.pass_ is lender.pass_  # both assembled
        assert _point(one) == _point(own)
    assert (shared.traced, shared.reused) == (0, 2) and (alone.traced, alone.reused) == (2, 0)


def test_a_scan_group_shares_its_members_updates(tmp_path: Any) -> None:
    """A scan's members take their setup and updates from where the search keeps them: a
    second group traces none."""
    for resolution, checkpointing in ((64, False), (128, True)):
        group = [(probe, 1) for probe in _group(resolution, checkpointing)]
        kept = SharedUpdates(tmp_path)
        answers = scan_group(group, 64, None, kept)
        assert [a.best_batch for a in answers] == [64] * 3  # each fits at the top
        assert (kept.traced, kept.reused) == ((2, 0) if resolution == 64 else (0, 2))


def test_a_search_s_updates_live_as_long_as_its_prober(tmp_path: Any) -> None:
    from autofit.gpus import load_gpu
    from autofit.models import load_preset
    from autofit.search.prober import Prober
    from autofit.search.recorder import StudyRecorder

    recorder = StudyRecorder(f"sqlite:///{tmp_path / 'study.db'}", "study", {})
    preset, gpu = load_preset("tiny_mlp"), load_gpu("l4")
    prober = Prober(preset, gpu, "simulate", 0.05, 60, recorder, launcher=None)  # type: ignore[arg-type]
    root = prober.updates_dir
    assert root is not None and root.is_dir()
    measured = Prober(preset, gpu, "cuda", 0.05, 60, recorder, launcher=None)  # type: ignore[arg-type]
    assert measured.updates_dir is None  # real probes measure every batch
    measured.close()
    del prober
    gc.collect()
    assert not root.exists()
    closed = Prober(preset, gpu, "simulate", 0.05, 60, recorder, launcher=None)  # type: ignore[arg-type]
    assert closed.updates_dir is not None and closed.updates_dir.is_dir()
    closed.close()  # as an interrupted search does, which ends without the interpreter's teardown
    assert not closed.updates_dir.exists()
