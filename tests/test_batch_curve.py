"""A structure's batch curve answers every batch as a direct trace would, to the byte; a step
that is not affine in the batch is caught and traced batch by batch; the largest batch that fits
is exact even where memory is not monotonic in the batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from helpers import custom_preset, with_blocks
from helpers import spec as make

from autofit.fastpath.batch_curve import BatchCurve, NotAffine, canonical_frees
from autofit.fastpath.scan import (
    TracedPoint,
    curve_batches,
    replayed_point,
    scan,
    scan_group,
)
from autofit.probe.worker import execute
from autofit.records.probe import Outcome, ProbeSpec

TESTS = Path(__file__).parent
TIMING = {"versions", "wall_s", "source"}  # what a replayed point may report differently


def _same(replayed: dict, direct: dict) -> dict:
    return {
        k: (replayed[k], direct[k]) for k in direct if k not in TIMING and replayed[k] != direct[k]
    }


def _curve(probe: ProbeSpec, hi: int) -> BatchCurve:
    return BatchCurve.fit([TracedPoint(probe.at_batch(b), {}).record for b in curve_batches(2, hi)])


CASES = [
    # (model, gpu, knobs): plain, checkpointed, 8-bit state, LoRA, ZeRO-2 with offload
    ("tiny_sana", "a40", {"resolution": 128, "precision": "bf16", "optimizer": "adamw"}),
    ("tiny_sana", "a40", {"resolution": 128, "checkpointing": True, "optimizer": "adamw8bit"}),
    ("tiny_mlp", "l4", {"train_mode": "lora", "precision": "bf16_pure"}),
    ("tiny_sana", "a40", {"resolution": 64, "zero_stage": 2, "offload_optimizer": "cpu"}),
]


@pytest.mark.long
@pytest.mark.parametrize("model,gpu,knobs", CASES, ids=lambda v: str(v)[:40])
def test_a_replayed_batch_is_a_direct_trace_to_the_byte(model: str, gpu: str, knobs: dict) -> None:
    probe = make(model, gpu, **knobs)
    curve = _curve(probe, 24)
    for batch in (5, 11, 17):
        point = probe.at_batch(batch)
        replayed = replayed_point(curve, point, {}).to_dict()
        assert _same(replayed, execute(point).to_dict()) == {}, batch
        assert replayed["source"] == "replayed"


@pytest.mark.long
@pytest.mark.parametrize(
    "model,gpu,knobs,member",
    [
        ("tiny_sana", "a40", {"resolution": 128}, {"optimizer": "lion"}),
        (
            "tiny_sana",
            "a40",
            {"resolution": 128, "checkpointing": True},
            {"optimizer": "adamw8bit"},
        ),
        pytest.param(
            "tiny_sana",
            "a40",
            {"resolution": 128, "precision": "bf16_pure"},
            {"optimizer": "adamw_bf16"},
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "tiny_mlp",
            "l4",
            {"train_mode": "lora"},
            {"optimizer": "adafactor", "ema": "cpu"},
            marks=pytest.mark.slow,
        ),
    ],
    ids=lambda v: str(v)[:40],
)
def test_a_structure_that_differs_in_the_optimizer_shares_the_curve(
    model: str, gpu: str, knobs: dict, member: dict
) -> None:
    """One trace of the member at the top of the curve's range (where a scan traces it first),
    and the curve's growth elsewhere, answer the member as its own traces would."""
    curve = _curve(make(model, gpu, **knobs), 24)
    other = make(model, gpu, **knobs, **member)
    shared = curve.shared_with(TracedPoint(other.at_batch(24), {}).record)
    for batch in (6, 19):
        point = other.at_batch(batch)
        assert _same(replayed_point(shared, point, {}).to_dict(), execute(point).to_dict()) == {}


def test_a_member_whose_backward_differs_is_refused() -> None:
    """fused_backward runs the update inside backward: the backward differs, the curve is not
    shared."""
    curve = _curve(make("tiny_sana", "a40", resolution=128, optimizer="adafactor"), 24)
    other = make(
        "tiny_sana", "a40", resolution=128, optimizer="adafactor", fused_backward="parameter"
    )
    with pytest.raises(NotAffine, match="the member's phases differ"):
        curve.shared_with(TracedPoint(other.at_batch(2), {}).record)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,knobs",
    [
        ("sana_600m", {"resolution": 512}),
        ("sd35_medium", {"resolution": 512, "checkpointing": True}),
        ("sdxl", {"resolution": 512}),
        ("flux_dev", {"resolution": 512, "train_mode": "full", "swap_blocks": 8}),
        ("flux_dev", {"resolution": 512, "train_mode": "lora", "base_precision": "fp8"}),
        ("llama3_2_1b", {"resolution": 1024, "train_mode": "full"}),
        ("llama3_2_1b", {"resolution": 1024, "train_mode": "qlora"}),
    ],
    ids=lambda v: str(v)[:30],
)
def test_presets_replay_as_they_trace(model: str, knobs: dict) -> None:
    probe = make(model, "h100_80", **knobs)
    curve = _curve(probe, 16)
    for batch in (4, 9):
        point = probe.at_batch(batch)
        assert _same(replayed_point(curve, point, {}).to_dict(), execute(point).to_dict()) == {}


def test_batch_one_is_traced_by_itself_and_the_scan_reports_the_edge() -> None:
    """Batch 1 is a program of its own (a size-1 dimension makes copies views); a scan whose
    budget fits only batch 1 traces it and reports it with batch 2 above it."""
    probe = make("tiny_sana", "a40", resolution=512)
    batch_1 = execute(probe.at_batch(1))
    batch_2 = execute(probe.at_batch(2))
    budget = (batch_1.peak_bytes + batch_2.peak_bytes) // 2
    margin = 1 - budget / probe.gpu_spec.memory_bytes
    tight = dataclasses.replace(probe, margin=margin)
    answer = scan(tight, 1, 40)
    assert answer.best_batch == 1
    assert [r.config["batch_size"] for r in answer.results] == [1, 2]
    assert [r.outcome for r in answer.results] == [Outcome.OK, Outcome.OOM]
    assert 1 in answer.traced


def test_the_scan_finds_the_largest_batch_a_grid_finds() -> None:
    probe = make("tiny_mlp", "l4", resolution=256)
    grid = {b: execute(probe.at_batch(b)) for b in range(2, 13)}
    # a budget between two batches' peaks, so the answer is inside the range
    budget = (grid[7].peak_bytes + grid[8].peak_bytes) // 2
    tight = dataclasses.replace(probe, margin=1 - budget / probe.gpu_spec.memory_bytes)
    truth = max(b for b in grid if execute(tight.at_batch(b)).outcome is Outcome.OK)
    answer = scan(tight, 2, 12)
    assert answer.best_batch == truth and 2 < truth < 12
    best, above = answer.results
    assert (best.source, above.source) == ("replayed", "replayed")
    for result in answer.results:
        direct = execute(tight.at_batch(result.config["batch_size"])).to_dict()
        assert _same(result.to_dict(), direct) == {}


@pytest.mark.long
@pytest.mark.parametrize("floor", [0.0, 1.0])
def test_the_scan_reports_every_batch_the_best_rule_weighs(floor: float) -> None:
    """With a window asked for (ScanWindow), the scan also reports each batch that fits within
    the tolerance of the structure's fastest and at least as fast as the floor, as a direct probe
    of it says; the others a grid finds fitting are slower than that."""
    from autofit.records.probe import ScanWindow

    probe = make("tiny_sana", "a40", resolution=512)  # about 28 MiB more per sample
    edge = {b: execute(probe.at_batch(b)) for b in (10, 11)}
    budget = (edge[10].peak_bytes + edge[11].peak_bytes) // 2
    tight = dataclasses.replace(probe, margin=1 - budget / probe.gpu_spec.memory_bytes)
    grid = {b: execute(tight.at_batch(b)) for b in range(1, 13)}
    fitting = {b: r for b, r in grid.items() if r.outcome is Outcome.OK}
    fastest = max(r.samples_per_s for r in fitting.values())
    tolerance = 0.5  # wide, so the window holds several batches
    (answer,) = scan_group([(tight, 4)], 12, ScanWindow(1, tolerance, floor * fastest * 0.9))
    least = max(floor * fastest * 0.9, (1 - tolerance) * fastest)
    expected = {b for b, r in fitting.items() if r.samples_per_s >= least}
    reported = {r.config["batch_size"]: r for r in answer.results}
    assert answer.best_batch == 10 and {10, 11} <= set(reported)
    assert set(reported) - {11} == expected | {10} and len(expected) > 1
    assert answer.window_floor == floor * fastest * 0.9
    for batch, result in reported.items():
        assert _same(result.to_dict(), grid[batch].to_dict()) == {}, batch


def test_a_window_too_wide_to_report_is_left_to_the_search() -> None:
    """tiny_mlp's speed levels off after a few hundred samples: over batches 1 to 2,000, well
    over WINDOW_LIMIT batches are within 3% of its fastest. The scan reports its answer alone and
    no window floor, so the search looks for the rule's run itself (Search._weigh)."""
    from autofit.fastpath.scan import WINDOW_LIMIT
    from autofit.records.probe import ScanWindow

    probe = make("tiny_mlp", "l4", precision="bf16_pure")
    (answer,) = scan_group([(probe, 1)], 2000, ScanWindow(1, 0.03, 0.0))
    assert answer.best_batch == 2000 and answer.window_floor is None
    assert [r.config["batch_size"] for r in answer.results] == [2000]
    fastest = answer.results[0].samples_per_s
    below = execute(probe.at_batch(2000 - WINDOW_LIMIT))
    assert below.outcome is Outcome.OK and below.samples_per_s >= 0.97 * fastest


def test_a_step_that_is_not_affine_is_caught() -> None:
    from autofit.gpus import load_gpu
    from autofit.probe.build import make_spec

    with custom_preset("custom_models.pairwise:build") as preset:
        knobs = {"batch_size": 2, "resolution": 64}
        probe = make_spec(preset, load_gpu("l4"), knobs, "simulate")
        other = make_spec(preset, load_gpu("l4"), {**knobs, "optimizer": "lion"}, "simulate")
        # batch by batch x batch x 64 floats: 20,000 is far over the L4's memory
        answer, member = scan_group([(probe, 1), (other, 1)], 20_000)
    assert not answer.affine and answer.best_batch is None
    assert "not on the line" in answer.reason and "raw sizes" in answer.reason
    assert sorted(r.config["batch_size"] for r in answer.results) == [2, 3, 20_000]
    # the rest of its group traces only the top of its range, and no curve that cannot hold:
    # it is probed batch by batch, its trace there kept as a probe
    assert not member.affine and member.traced == [20_000]
    assert [(r.config["batch_size"], r.outcome) for r in member.results] == [(20_000, Outcome.OOM)]


def test_the_top_of_the_range_is_traced_first() -> None:
    """A structure whose largest batch fits is answered by that one trace. A member of its group
    whose largest batch does not fit borrows its curve, which the first structure traces only
    then, and reports what direct probes report."""
    lion, adamw = (
        with_blocks(make("sana_600m", "a40", resolution=256, optimizer=name), 1)
        for name in ("lion", "adamw")
    )
    hi = 24
    allocated = [execute(p.at_batch(hi)).peak_allocated_bytes for p in (lion, adamw)]
    gpu = lion.gpu_spec
    # a budget between the two at the top: AdamW keeps one more state than Lion
    budget = sum(allocated) // 2 + gpu.cuda_context_bytes + gpu.cublas_workspace_bytes
    lion, adamw = (
        dataclasses.replace(p, margin=1 - (budget + gpu.reserved_bytes) / gpu.memory_bytes)
        for p in (lion, adamw)
    )
    first, member = scan_group([(lion, 1), (adamw, 1)], hi)
    assert first.best_batch == hi and [r.source for r in first.results] == ["traced"]
    assert first.traced == [2, 3, hi]  # 2 and 3 for the member's curve
    assert member.shared and member.traced == [hi] and 2 < member.best_batch < hi
    assert [r.config["batch_size"] for r in member.results] == [
        member.best_batch,
        member.best_batch + 1,
    ]
    for probe, answer in ((lion, first), (adamw, member)):
        for result in answer.results:
            direct = execute(probe.at_batch(result.config["batch_size"]))
            assert _same(result.to_dict(), direct.to_dict()) == {}


def test_largest_fitting_is_exact_where_memory_is_not_monotonic() -> None:
    """Fits at 50 and 54, not at 51 to 53 (the allocator packs 54 better): the largest is 54,
    and the scan asks only from the bound of requested bytes down."""
    probe = make("tiny_mlp", "l4")
    curve = _curve(probe, 64)
    asked: list[int] = []

    def fits(batch: int) -> bool:
        asked.append(batch)
        return batch <= 50 or batch == 54

    limit = 1 << 40  # every batch's requested bytes are within it: the bound is the range's top
    assert curve.requested_bound(limit, 1, 64) == 64
    assert curve.largest_fitting(1, 64, limit, fits) == 54
    assert asked == list(range(64, 53, -1))


def test_the_requested_bound_is_sound() -> None:
    """No batch above the bound has its requested bytes within the limit at every event."""
    probe = make("tiny_mlp", "l4", resolution=256)
    curve = _curve(probe, 64)
    limit = curve.log_at(20).peak + 1
    bound = curve.requested_bound(limit, 2, 64)
    assert 20 <= bound < 64
    assert sum(curve._numbers(bound)["raw_sizes"]) > 0
    over = curve.log_at(bound + 1)
    assert over.peak > limit


def test_runs_of_frees_compare_in_one_order() -> None:
    # allocations 0..3; 1, 2 and 0 die together in one order here, in another there
    assert canonical_frees([0, 1, 2, ~1, ~2, ~0, 3]) == canonical_frees([0, 1, 2, ~0, ~2, ~1, 3])
    assert canonical_frees([0, ~0, 1]) != canonical_frees([0, 1, ~0])  # an allocation between


@pytest.mark.long
def test_a_simulated_search_records_the_points_it_reports_and_resumes(tmp_path: Path) -> None:
    """Two structures that differ in the optimizer, over batches 1 to 400,000: each scan is
    kept as its trials (b*, which fits, and b* + 1, which does not), marked replayed; the answer
    is what probes of those batches say; the same command again reuses the scans."""
    import json

    import optuna
    from helpers import in_process

    (tmp_path / "space.yaml").write_text(
        "batch_size: {min: 1, max: 400000}\nresolution: [x1]\n"
        "knobs:\n  precision: [bf16_pure]\n  optimizer: [adamw, lion]\n"
        "target: {memory_gain: 1}\n"  # only the fastest: thousands of batches are within 3%
    )
    args = ("search", "model=tiny_mlp", "gpu=l4", "backend=simulate", "space=space.yaml",
            "study=wide", "jobs=1")  # fmt: skip
    done = in_process(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(
        study_name="wide", storage=f"sqlite:///{tmp_path / 'results' / 'studies.db'}"
    )
    trials = sorted(study.trials, key=lambda t: (t.params["optimizer"], t.params["batch_size"]))
    assert [(t.params["optimizer"], t.state.name, t.user_attrs["source"]) for t in trials] == [
        ("adamw", "COMPLETE", "replayed"), ("adamw", "FAIL", "replayed"),
        ("lion", "COMPLETE", "replayed"), ("lion", "FAIL", "replayed"),
    ]  # fmt: skip
    best, above = (trials[i].params["batch_size"] for i in range(2))
    assert above == best + 1 and 1000 < best < 400000
    # at the margin the search took (margin=auto: tiny_mlp's class's)
    margin = json.loads((tmp_path / "results" / "wide" / "summary.json").read_text())["margin"]
    probe = make("tiny_mlp", "l4", precision="bf16_pure", optimizer="adamw")
    probe = dataclasses.replace(probe, margin=margin)
    assert execute(probe.at_batch(best)).outcome is Outcome.OK
    assert execute(probe.at_batch(best + 1)).outcome is Outcome.OOM

    again = in_process(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    summary = json.loads((tmp_path / "results" / "wide" / "summary.json").read_text())
    assert summary["new_probes"] == 0 and summary["reused_probes"] == 4
    assert len(optuna.load_study(study_name="wide", storage=study._storage).trials) == 4


_FIRST_AND_NEXT = """
import sys
sys.path.insert(0, sys.argv[1])
from helpers import spec, with_blocks
from autofit.backends.simulate import trace
from autofit.fastpath.batch_curve import canonical_frees

def step(probe):
    _, log = trace(probe)
    events = canonical_frees(log.events)
    return [(e, log.raw_sizes[e], log.categories[e]) if e >= 0 else e for e in events]

probe = with_blocks(spec("llama3_2_1b", "a40", batch_size=2, resolution=128, train_mode="qlora"), 1)
first, then = step(probe), step(probe)
print(len(first), len(then), first == then)
"""


@pytest.mark.long
def test_a_process_first_trace_is_the_step_its_next_trace_is() -> None:
    """A probe is the first trace of its process; most of a scan's traces are not. A library a
    knob imports while the run is built under fake tensors (peft, and through it bitsandbytes'
    lookup tables) would be allocations of the first trace only: none is."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FIRST_AND_NEXT, str(TESTS)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    first, then, same = done.stdout.split()
    assert same == "True", f"{first} events in a process's first trace, {then} in its next"


def _tight_tiny_sana() -> float:
    """The margin at which tiny_sana at 512 px on an A40 fits batch 10 and not 11."""
    probe = make("tiny_sana", "a40", resolution=512)
    edge = [execute(probe.at_batch(b)).peak_bytes for b in (10, 11)]
    return 1 - (edge[0] + edge[1]) // 2 / probe.gpu_spec.memory_bytes


def _grid_space(rule: Any, **knobs: tuple[Any, ...]) -> Any:
    from autofit.search.space import SearchSpace

    return SearchSpace(
        name="grid", min_batch=1, max_batch=14, resolutions=(512,), knobs=knobs,
        target_resolution=512, target_min_batch=1, best_rule=rule,
    )  # fmt: skip


def _grid_best(space: Any, margin: float) -> Any:
    """The best rule's pick from every batch of every combination of `space`, a probe each."""
    from autofit.search.pareto import fastest_and_best

    grid = [
        execute((dataclasses.replace(make("tiny_sana", "a40", resolution=512, **dict(knobs)), margin=margin)).at_batch(b))
        for knobs in space.combinations()
        for b in range(space.min_batch, space.max_batch + 1)
    ]  # fmt: skip
    return fastest_and_best(grid, 512, 1, space.best_rule)


def _searched(space: Any, margin: float, storage: Path, jobs: int = 2) -> Any:
    from autofit.gpus import load_gpu
    from autofit.models import load_preset
    from autofit.probe.launcher import launcher_for
    from autofit.search.engine import Search
    from autofit.search.prober import Prober
    from autofit.search.recorder import StudyRecorder

    preset, gpu = load_preset("tiny_sana"), load_gpu("a40")
    recorder = StudyRecorder(f"sqlite:///{storage}", "grid", {})
    with launcher_for("simulate", preset.family) as launcher:
        prober = Prober(preset, gpu, "simulate", margin, 300, recorder, launcher)
        try:
            return Search(space, prober, jobs=jobs).run()
        finally:
            prober.close()
            recorder.close()


def _same_run(one: Any, other: Any) -> bool:
    keys = ("precision", "optimizer", "checkpointing", "batch_size")
    return {k: one.config[k] for k in keys} == {k: other.config[k] for k in keys}


@pytest.mark.long
@pytest.mark.parametrize("tolerance", [0.03, 0.2])
def test_a_simulated_search_ends_with_the_best_a_grid_of_every_batch_gives(
    tmp_path: Path, tolerance: float
) -> None:
    """The scans report the batches the best rule weighs (below each largest batch, and below a
    memory-saving structure's range), so the search's best is the rule's pick from a grid of
    every batch of every combination, a probe each. At 0.2 the rule prefers a lighter run."""
    from autofit.search.pareto import BestRule

    margin = _tight_tiny_sana()
    space = _grid_space(
        BestRule(tolerance, 0.05), precision=("bf16_pure",), optimizer=("adamw", "adamw8bit"),
        checkpointing=(False, True),
    )  # fmt: skip
    fastest, best = _grid_best(space, margin)
    assert best is not None and (best is fastest) == (tolerance == 0.03)
    found = _searched(space, margin, tmp_path / "study.db")
    assert found.best is not None and _same_run(found.best, best)
    assert _same(found.best.to_dict(), best.to_dict()) == {}


@pytest.mark.long
def test_a_scan_stored_with_a_higher_floor_is_looked_below(tmp_path: Path) -> None:
    """A search whose fastest run is slower than the one that stored its scans (here: without
    bf16_pure) has a lower floor than their windows: it probes below them, and still ends with
    the grid's best."""
    from autofit.search.pareto import BestRule

    margin, rule = _tight_tiny_sana(), BestRule(0.2, 0.05)
    both = _grid_space(rule, precision=("bf16_pure", "bf16"), checkpointing=(False, True))
    # one job: bf16_pure is scanned first, so bf16's scans are given its floor (with two, they
    # may run at once, and bf16's be given none)
    first = _searched(both, margin, tmp_path / "study.db", jobs=1)
    assert first.best is not None and first.best.config["precision"] == "bf16_pure"
    import optuna

    study = optuna.load_study(study_name="grid", storage=f"sqlite:///{tmp_path / 'study.db'}")
    floors = [t.user_attrs.get("window_floor") for t in study.trials]
    assert any(floors) and 0.0 in floors  # bf16_pure's first scan was given none, bf16's one
    alone = _grid_space(rule, precision=("bf16",), checkpointing=(False, True))
    found = _searched(alone, margin, tmp_path / "study.db")
    assert found.reused_probes > 0 and found.new_probes > 0  # the scans, and probes below them
    _, best = _grid_best(alone, margin)
    assert found.best is not None and _same_run(found.best, best)
