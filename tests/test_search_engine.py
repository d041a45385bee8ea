"""The search over a synthetic workload whose memory curve is known: exact b* for every
combination, pruning with reasons, the Pareto front and the best config, in few probes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autofit.errors import ConfigError
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.records.probe import Outcome, ProbeResult
from autofit.search.display import best_block, losers
from autofit.search.engine import Search
from autofit.search.pareto import BestRule, best_config, fastest_and_best, pareto_front
from autofit.search.space import SearchSpace

GIB = 1 << 30
GPU = load_gpu("a40")
BUDGET = GPU.budget_bytes(0.05)
PRESET = load_preset("sana_1600m")


def curve(knobs: dict[str, Any]) -> tuple[int, int, float]:
    """Fixed bytes, bytes per sample, and step seconds per sample of a made-up model."""
    fixed = {"bf16": 24, "fp16": 24, "bf16_pure": 12}[knobs["precision"]] * GIB
    fixed -= 6 * GIB if knobs["optimizer"] == "sgd" else 0
    per_sample = (1.1 if knobs["resolution"] == 1024 else 0.3) * GIB
    if knobs["checkpointing"]:
        per_sample *= 0.2
    seconds = (0.12 if knobs["resolution"] == 1024 else 0.035) * (
        1.3 if knobs["checkpointing"] else 1.0
    )
    return fixed, int(per_sample), seconds


class CurveProber:
    """Stands in for real probes: the peak is the known curve, and every call is counted."""

    def __init__(self) -> None:
        from autofit.knobs import registry

        self.preset, self.gpu, self.budget, self.backend = PRESET, GPU, BUDGET, "simulate"
        self.defaults = {name: knob.default for name, knob in registry().items()}
        self.calls: list[dict[str, Any]] = []
        self.recorder = self  # pruned combinations are recorded here

    def record_pruned(self, knobs: dict[str, Any], reason: str) -> None:
        self.pruned = getattr(self, "pruned", []) + [(knobs, reason)]

    def record_pruned_all(self, notes: list[tuple[dict[str, Any], str]]) -> None:
        for knobs, reason in notes:
            self.record_pruned(knobs, reason)

    def __call__(self, knobs: dict[str, Any]) -> tuple[ProbeResult, bool]:
        knobs = {**self.defaults, **knobs}
        self.calls.append(knobs)
        fixed, per_sample, seconds = curve(knobs)
        batch = knobs["batch_size"]
        peak = fixed + per_sample * batch
        result = ProbeResult(
            outcome=Outcome.OK if peak <= self.budget else Outcome.OOM,
            backend="simulate", gpu="a40", model="sana_1600m", config=knobs, budget_bytes=self.budget,
            peak_bytes=peak, samples_per_s=batch / (0.05 + seconds * batch), step_time_s=0.05 + seconds * batch,
        )  # fmt: skip
        return result, False


def space(max_batch: int = 64) -> SearchSpace:
    return SearchSpace(
        name="synthetic", min_batch=1, max_batch=max_batch, resolutions=(512, 1024),  # type: ignore[arg-type]
        knobs={"precision": ("bf16", "fp16", "bf16_pure"), "optimizer": ("adamw", "sgd"), "checkpointing": (False, True)},
        target_resolution=1024, target_min_batch=1,
    )  # fmt: skip


def truth(knobs: dict[str, Any], resolution: int, max_batch: int) -> int | None:
    fixed, per_sample, _ = curve({**knobs, "resolution": resolution})
    best = (BUDGET - fixed) // per_sample
    return min(best, max_batch) if best >= 1 else None


def test_every_combination_gets_its_exact_largest_batch() -> None:
    prober = CurveProber()
    result = Search(space(), prober, jobs=2).run()  # type: ignore[arg-type]
    for combination in result.combinations:
        expected = truth(combination.knobs, combination.resolution, 64)
        if combination.status == "pruned":
            parent = truth(
                {**combination.knobs, "checkpointing": False}, combination.resolution, 64
            )
            # Pruned only when the faster parent already reaches every batch this one reaches.
            assert parent is not None and (parent == 64 or expected == parent), combination
            assert "checkpointing=false already fits batch" in combination.reason
        else:
            assert combination.status == "exact" and combination.best_batch == expected, combination
    assert len(prober.calls) == len({tuple(sorted(c.items())) for c in prober.calls})  # no repeats
    grid = 24 * 64
    assert len(prober.calls) <= grid * 0.10, len(prober.calls)


def test_pruned_combinations_are_recorded_with_the_reason() -> None:
    prober = CurveProber()
    result = Search(space(max_batch=16), prober).run()  # type: ignore[arg-type]
    pruned = [c for c in result.combinations if c.status == "pruned"]
    assert pruned and len(prober.pruned) == len(pruned)
    for knobs, reason in prober.pruned:
        assert (
            knobs["checkpointing"] is True
            and "would only be slower" in reason
            or "does not fit" in reason
        )


def test_the_best_is_the_fastest_fitting_at_the_target_resolution() -> None:
    # the rule's preference for a lighter run off (test_the_best_is_what_the_rule_picks...)
    searched = dataclasses.replace(space(), best_rule=BestRule(0.03, 1.0))
    result = Search(searched, CurveProber()).run()  # type: ignore[arg-type]
    fitting = [
        r for r in result.results if r.outcome is Outcome.OK and r.config["resolution"] == 1024
    ]
    assert result.best is not None
    assert result.best.samples_per_s == max(r.samples_per_s for r in fitting)
    assert result.best.config["resolution"] == 1024


def test_invalid_combinations_are_recorded_not_probed() -> None:
    prober = CurveProber()
    prober.gpu = load_gpu("t4")  # no bf16
    prober.budget = prober.gpu.budget_bytes(0.05)
    result = Search(space(max_batch=4), prober).run()  # type: ignore[arg-type]
    invalid = [c for c in result.combinations if c.status == "invalid"]
    assert {c.knobs["precision"] for c in invalid} == {"bf16", "bf16_pure"}
    assert all(call["precision"] == "fp16" for call in prober.calls)

    # What the search prints: one line per reason with its count, not one per combination.
    shown = [line for line in losers(result.combinations).splitlines() if "invalid" in line]
    reasons = {c.reason for c in invalid}
    assert len(shown) == len(reasons) < len(invalid)
    counted = sum(int(line.split()[1]) for line in shown if line.split()[1].isdigit())
    assert counted == len(invalid)


def make(
    batch: int, resolution: int, speed: float, peak: int, ok: bool = True, **knobs: Any
) -> ProbeResult:
    return ProbeResult(
        outcome=Outcome.OK if ok else Outcome.OOM, backend="simulate", gpu="a40", model="m",
        config={"batch_size": batch, "resolution": resolution, **knobs}, budget_bytes=BUDGET,
        peak_bytes=peak, samples_per_s=speed,
    )  # fmt: skip


def test_pareto_front_per_resolution() -> None:
    results = [
        make(1, 512, 10.0, 5),
        make(4, 512, 20.0, 9),
        make(8, 512, 18.0, 12),  # bigger run, slower: on the front
        make(8, 512, 19.0, 13),  # same size, faster: replaces the one above
        make(8, 512, 19.0, 11),  # same size and speed, less memory: wins the tie
        make(2, 512, 15.0, 6),  # smaller and slower than batch 4: dominated
        make(16, 512, 99.0, 99, ok=False),  # does not fit: never on the front
        make(2, 1024, 5.0, 20),
    ]
    front = pareto_front(results)
    assert [(r.config["batch_size"], r.samples_per_s, r.peak_bytes) for r in front[512]] == [
        (4, 20.0, 9),
        (8, 19.0, 11),
    ]
    assert [r.config["batch_size"] for r in front[1024]] == [2]


def test_best_config_honours_min_batch_and_breaks_ties_on_memory() -> None:
    results = [make(1, 1024, 9.0, 5), make(4, 1024, 8.0, 9), make(6, 1024, 8.0, 7)]
    assert best_config(results, 1024, 1).config["batch_size"] == 1
    assert best_config(results, 1024, 2).config["batch_size"] == 6  # tie on speed: less memory
    assert best_config(results, 1024, 7) is None
    assert best_config(results, 512, 1) is None


def test_the_best_rule_prefers_a_nearly_as_fast_run_with_clearly_more_headroom() -> None:
    """Of the runs within speed_tolerance of the fastest, one that leaves at least memory_gain
    of the budget more free wins, the one leaving most free first; less than that, or slower
    than that, and the fastest stays the best."""
    edge = BUDGET - BUDGET // 100  # the fastest run: 99% of the budget
    fastest = make(8, 1024, 10.0, edge)
    lighter = make(7, 1024, 9.8, edge - BUDGET // 10)  # 2% slower, frees 10% of the budget
    lightest = make(6, 1024, 9.75, edge - BUDGET // 5)  # 2.5% slower, frees 20%
    slow = make(2, 1024, 5.0, BUDGET // 10)  # frees most, far slower
    almost = make(7, 1024, 9.9, edge - BUDGET // 50)  # frees only 2%
    rule = BestRule()  # 3%, 5%
    assert fastest_and_best([fastest, slow, almost], 1024, 1, rule) == (fastest, fastest)
    assert fastest_and_best([fastest, lighter, slow], 1024, 1, rule) == (fastest, lighter)
    assert fastest_and_best([fastest, lighter, lightest], 1024, 1, rule)[1] is lightest
    assert best_config([fastest, lightest], 1024, 1, BestRule(0.02, 0.05)) is fastest  # too slow
    assert best_config([fastest, lighter], 1024, 1, BestRule(0.03, 1.0)) is fastest  # off
    assert not BestRule(0.03, 1.0).prefers_lighter and BestRule().prefers_lighter
    assert BestRule(0.03).floor(fastest) == pytest.approx(9.7) and BestRule().floor(None) == 0


def test_the_best_line_shows_headroom_provenance_and_the_run_it_was_preferred_to() -> None:
    edge = BUDGET - BUDGET // 100
    fastest, lighter = make(8, 1024, 10.0, edge), make(7, 1024, 9.8, edge - BUDGET // 10)
    alone = best_block(fastest, [])
    assert "headroom, the peak 99% of budget; simulated" in alone and "preferred" not in alone
    preferred = best_block(lighter, [], fastest, BestRule())
    assert "headroom, the peak 89% of budget; simulated" in preferred
    assert "preferred to the fastest, batch_size=8 resolution=1024: 2.0% faster but " in preferred
    assert "(target.speed_tolerance=0.03 target.memory_gain=0.05)" in preferred
    cuda = dataclasses.replace(fastest, backend="cuda")
    assert "; measured (cuda)" in best_block(cuda, [])


def test_a_best_within_the_margins_width_of_the_budget_names_a_roomier_run() -> None:
    """The margin covers the simulation's worst published error: a best with less headroom than
    one margin's width is flagged, with the fastest measured run that leaves that much and what
    it costs in speed; a best with room to spare is not."""
    from autofit.search.display import Edge

    width = BUDGET // 10
    best = make(8, 1024, 10.0, BUDGET - BUDGET // 20)  # 5% headroom
    roomy = make(6, 1024, 9.0, BUDGET - BUDGET // 5)  # 20% headroom, 10% slower
    roomier = make(4, 1024, 7.0, BUDGET // 2)
    text = best_block(best, [], edge=Edge(width, [best, roomy, roomier]))
    assert "at the edge: " in text and "less than the margin's width" in text
    assert "the fastest run that leaves it: batch_size=6 resolution=1024, 10.0% slower" in text
    assert "no run the search measured" in best_block(best, [], edge=Edge(width, [best]))
    assert "at the edge" not in best_block(roomy, [], edge=Edge(width, [best, roomy]))


def test_best_rule_settings_are_shares() -> None:
    rule = BestRule().replaced({"speed_tolerance": 0.1, "memory_gain": None}, "target.")
    assert rule == BestRule(0.1, 0.05)
    for bad in (1.5, -0.1, "x", True):
        with pytest.raises(ConfigError, match=rf"^target.memory_gain={bad!r} is not valid; "):
            BestRule().replaced({"memory_gain": bad}, "target.")


def test_nothing_fits() -> None:
    prober = CurveProber()
    prober.budget = 1 * GIB
    result = Search(
        dataclasses.replace(space(), knobs={**space().knobs, "checkpointing": (False,)}), prober
    ).run()  # type: ignore[arg-type]
    assert result.best is None
    assert all(c.status == "none_fit" for c in result.combinations)


def test_a_combination_starts_once_its_parents_are_answered_not_its_whole_wave() -> None:
    """A checkpointed combination waits for its parent (the same without checkpointing), and
    for nothing else: it runs beside a combination of the wave before that is still going."""
    import threading

    child_started = threading.Event()

    class Slow(CurveProber):
        def __call__(self, knobs: dict[str, Any]) -> tuple[ProbeResult, bool]:
            full = {**self.defaults, **knobs}
            if full["checkpointing"] and full["precision"] == "bf16":
                child_started.set()
            last_of_first_wave = not full["checkpointing"] and full["resolution"] == 1024
            if (
                last_of_first_wave
                and full["precision"] == "bf16_pure"
                and full["optimizer"] == "sgd"
            ):
                assert child_started.wait(60), "nothing of the next wave ran beside it"
            return super().__call__(knobs)

    prober = Slow()
    # without the best rule's look below the largest batches, which comes after every answer
    searched = dataclasses.replace(space(), best_rule=BestRule(0.03, 1.0))
    result = Search(searched, prober, jobs=2).run()  # type: ignore[arg-type]
    assert child_started.is_set()
    calls = [(tuple(sorted(c.items())), c) for c in prober.calls]
    for combination in result.combinations:
        if not combination.knobs["checkpointing"] or combination.status != "exact":
            continue
        parent = {**combination.knobs, "checkpointing": False, "resolution": combination.resolution}

        def of(knobs: dict[str, Any]) -> list[int]:
            return [i for i, (_, c) in enumerate(calls) if knobs.items() <= c.items()]

        child = {**combination.knobs, "resolution": combination.resolution}
        assert max(of(parent)) < min(of(child)), combination  # the parent answered first


def test_the_launcher_is_warmed_before_the_space_is_checked() -> None:
    """A fork server's imports take seconds: the search starts them before it checks the space
    and records what it leaves out, not at its first probe."""
    events: list[str] = []

    class Warmed(CurveProber):
        def warm(self) -> None:
            events.append("warm")

        def record_pruned(self, knobs: dict[str, Any], reason: str) -> None:
            events.append("pruned")

        def __call__(self, knobs: dict[str, Any]) -> tuple[ProbeResult, bool]:
            events.append("probe")
            return super().__call__(knobs)

    Search(space(), Warmed()).run()  # type: ignore[arg-type]
    assert events[0] == "warm" and events.count("warm") == 1
    assert "pruned" in events and "probe" in events


@pytest.mark.parametrize("tolerance,max_batch", [(0.03, 64), (0.10, 64), (0.35, 16)])
def test_the_best_is_what_the_rule_picks_from_every_batch_of_every_combination(
    tolerance: float, max_batch: int
) -> None:
    """Measured batch by batch (as a real backend is), the search ends with the best the rule
    takes from a grid of every batch of every combination: below its largest batch it probes,
    of each combination that may hold it, the lightest run as fast as the rule's floor. At 0.35
    over batches up to 16 that is a checkpointed run the search pruned (its parent fits 16)."""
    rule = BestRule(tolerance, 0.05)
    searched = dataclasses.replace(space(max_batch), best_rule=rule)
    prober = CurveProber()
    result = Search(searched, prober, jobs=2).run()  # type: ignore[arg-type]
    grid = [
        CurveProber()({**dict(knobs), "resolution": resolution, "batch_size": batch})[0]
        for resolution in searched.resolutions
        for knobs in searched.combinations()
        for batch in range(1, searched.max_batch + 1)
    ]
    fastest, best = fastest_and_best(grid, 1024, 1, rule)
    assert best is not fastest and best.config["batch_size"] <= fastest.config["batch_size"]
    assert result.best is not None and result.best.config == best.config
    assert best.config["checkpointing"] == (max_batch == 16)
    assert len(prober.calls) == len({tuple(sorted(c.items())) for c in prober.calls})


def _combination(resolution: int = 512, **knobs: Any) -> Any:
    from autofit.search.combination import Combination

    defaults = {"precision": "bf16", "optimizer": "adamw", "checkpointing": False, "zero_stage": 0}
    return Combination({**defaults, **knobs}, resolution)


def test_of_the_ready_groups_the_one_with_the_longest_chain_waiting_on_it_starts_first() -> None:
    """A combination with checkpointing waits on the same without it; one with both memory
    savers on both of those: the group at the head of that chain starts before a group no
    other waits on, whatever their order in the waves."""
    from autofit.fastpath.scheduler import GroupQueue, chain_heights

    searched = dataclasses.replace(space(), knobs={**space().knobs, "zero_stage": (0, 2)})
    alone = [_combination(precision="bf16_pure", optimizer="sgd")]
    head = [_combination()]
    middle = [_combination(checkpointing=True)]
    tail = [_combination(checkpointing=True, zero_stage=2)]
    groups = [alone, head, middle, tail]
    heights = chain_heights(groups, searched)
    assert [heights[id(g)] for g in groups] == [0, 2, 1, 0]
    queue = GroupQueue(groups, heights=heights)
    assert queue.next() is head
    assert queue.next() is middle  # ready: this queue waits on nothing
    queue.done(head)
    queue.done(middle)
    assert queue.next() is alone  # the same height, earlier in order
    assert queue.next() is tail


def test_a_group_that_would_trace_the_updates_another_is_tracing_waits_for_it() -> None:
    """Two groups that share their setup-and-update traces (the same optimizers at two
    resolutions) do not start at once while neither has traced them: another group starts
    beside the first, and the second once the first is done."""
    from autofit.fastpath.scheduler import GroupQueue, shared_updates

    at_512 = [_combination(512), _combination(512, optimizer="sgd")]
    at_1024 = [_combination(1024), _combination(1024, optimizer="sgd")]
    other = [_combination(512, precision="bf16_pure"), _combination(512, precision="bf16_pure", optimizer="sgd")]  # fmt: skip
    assert shared_updates(at_512) == shared_updates(at_1024) != shared_updates(other)
    heights = {id(at_512): 2, id(at_1024): 1, id(other): 0}
    queue = GroupQueue([at_512, at_1024, other], heights=heights, shared=shared_updates)
    assert queue.next() is at_512
    assert queue.next() is other  # not at_1024, whose updates at_512 is tracing
    queue.done(at_512)
    assert queue.next() is at_1024


def test_of_groups_alike_otherwise_one_at_the_target_resolution_starts_first() -> None:
    from autofit.fastpath.scheduler import GroupQueue

    at_512, at_1024 = [_combination(512)], [_combination(1024)]
    queue = GroupQueue([at_512, at_1024], target=1024)
    assert queue.next() is at_1024
    assert queue.next() is at_512


def test_a_combination_names_its_resolution_in_the_model_s_unit() -> None:
    """A language model's resolution is tokens, an image model's pixels; summary.json keeps no
    unit (the study's model says it)."""
    from autofit.search.combination import Combination

    assert Combination({"precision": "bf16"}, 4096, unit="tokens").label() == (
        "precision=bf16 @4096 tokens"
    )
    assert Combination({"precision": "bf16"}, 1024).label() == "precision=bf16 @1024px"
    assert "unit" not in Combination({}, 64, unit="tokens").to_dict()
