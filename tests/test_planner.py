"""The planner finds the exact largest fitting batch on known memory curves, in few probes."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from autofit.search.planner import (
    NARROW_PROBES,
    Observation,
    bisection_probes,
    largest_fitting_batch,
)

MIB = 1 << 20
BUDGET = 40_000 * MIB


def curve_probe(curve: Callable[[int], int], calls: list[int], report_peak: bool = True):
    def probe(batch: int) -> Observation:
        calls.append(batch)
        peak = curve(batch)
        return Observation(batch, peak <= BUDGET, peak if report_peak else None)

    return probe


def exact(curve: Callable[[int], int], max_batch: int, floor: int = 0) -> int | None:
    fitting = [b for b in range(floor + 1, max_batch + 1) if curve(b) <= BUDGET]
    return max(fitting) if fitting else None


def linear(fixed: int, per_sample: int) -> Callable[[int], int]:
    return lambda b: fixed + per_sample * b


def allocator_like(fixed: int, per_sample: int) -> Callable[[int], int]:
    """Near-linear with the caching allocator's 2 MiB steps and a fragmentation term."""
    return lambda b: math.ceil((fixed + per_sample * b + (b % 3) * 7 * MIB) / (2 * MIB)) * 2 * MIB


def convex(fixed: int, per_sample: int) -> Callable[[int], int]:
    return lambda b: fixed + per_sample * b + (per_sample // 40) * b * b


CURVES = [linear, allocator_like, convex]


# The most probes a search may take on each kind of curve (bisection over 1..64 takes 7).
BOUNDS = {"linear": 4, "allocator_like": 5, "convex": 10}


@pytest.mark.parametrize("shape", CURVES, ids=lambda f: f.__name__)
def test_exact_on_many_random_curves_within_a_bounded_number_of_probes(shape) -> None:
    rng = random.Random(0)
    probes = []
    for _ in range(300):
        fixed = rng.randint(1_000, 39_000) * MIB
        per_sample = rng.randint(10, 8_000) * MIB
        curve = shape(fixed, per_sample)
        calls: list[int] = []
        plan = largest_fitting_batch(curve_probe(curve, calls), BUDGET, max_batch=64)
        assert plan.best_batch == exact(curve, 64)
        if plan.best_batch is not None and plan.best_batch < 64:  # exactness is proven by probes
            assert plan.best_batch in calls and plan.best_batch + 1 in calls
        assert len(calls) == len(set(calls))  # never the same batch twice
        assert len(calls) <= BOUNDS[shape.__name__]
        probes.append(len(calls))
    assert sum(probes) / len(probes) <= 4.0  # fit-extrapolate-verify, not bisection


def staircase(fixed: int, per_sample: int, block: int) -> Callable[[int], int]:
    """A peak in whole allocator blocks with a term that comes and goes with the batch: a line
    through two probes misses the boundary by a few batches, again and again."""
    return lambda b: math.ceil((fixed + per_sample * b + (b % 7) * block // 3) / block) * block


@pytest.mark.parametrize("max_batch", [1_000, 1_000_000])
def test_never_more_probes_than_bisection_on_a_wide_range(max_batch: int) -> None:
    """Where bisection needs more than NARROW_PROBES, no curve makes the planner take more probes
    than it (the line's guesses are held to where bisection could still finish); the answer is
    exact: b* fits and b* + 1, probed, does not."""
    allowed = max(bisection_probes(max_batch + 1), NARROW_PROBES)
    rng = random.Random(0)
    for _ in range(300):
        fixed = rng.randint(1_000, 39_000) * MIB
        per_sample = rng.randint(10, 8_000_000) * (1 if max_batch > 1_000 else 1_000)
        curve = staircase(fixed, per_sample, rng.choice([2 * MIB, 20 * MIB, 200 * MIB]))
        calls: list[int] = []
        plan = largest_fitting_batch(curve_probe(curve, calls), BUDGET, max_batch=max_batch)
        assert len(calls) <= allowed, (len(calls), calls)
        assert len(calls) == len(set(calls))
        best = plan.best_batch
        if best is None:
            assert curve(1) > BUDGET and 1 in calls
            continue
        assert best in calls and curve(best) <= BUDGET
        assert best == max_batch or (best + 1 in calls and curve(best + 1) > BUDGET)


def test_a_range_of_a_thousand_costs_no_more_than_one_of_sixty_four_on_a_line() -> None:
    """The bound leaves room for the line where bisection needs few probes: on 1..1000 the
    planner finds b* on a straight line in as few probes as on 1..64."""
    rng = random.Random(2)
    for _ in range(100):
        curve = linear(rng.randint(1_000, 39_000) * MIB, rng.randint(10, 8_000) * MIB)
        counts = []
        for max_batch in (64, 1_000):
            calls: list[int] = []
            plan = largest_fitting_batch(curve_probe(curve, calls), BUDGET, max_batch=max_batch)
            assert plan.best_batch == exact(curve, max_batch)
            counts.append(len(calls))
        assert counts[1] <= max(counts[0], 4), counts


def test_nothing_fits() -> None:
    calls: list[int] = []
    plan = largest_fitting_batch(
        curve_probe(linear(41_000 * MIB, MIB), calls), BUDGET, max_batch=64
    )
    assert plan.best_batch is None and calls == [1]


def test_everything_fits_up_to_the_space_maximum() -> None:
    calls: list[int] = []
    plan = largest_fitting_batch(curve_probe(linear(MIB, MIB), calls), BUDGET, max_batch=64)
    assert plan.best_batch == 64 and calls[-1] == 64 and len(calls) <= 3


def test_a_floor_starts_the_search_above_it() -> None:
    calls: list[int] = []
    curve = linear(10_000 * MIB, 1_000 * MIB)  # b* = 30
    plan = largest_fitting_batch(curve_probe(curve, calls), BUDGET, max_batch=64, floor=12)
    assert plan.best_batch == 30 and calls[0] == 13 and min(calls) == 13
    calls.clear()
    plan = largest_fitting_batch(curve_probe(curve, calls), BUDGET, max_batch=64, floor=30)
    assert plan.best_batch is None and calls == [31]  # nothing to gain above the floor


def test_a_slope_hint_saves_the_second_probe() -> None:
    curve = linear(10_000 * MIB, 1_000 * MIB)
    calls: list[int] = []
    largest_fitting_batch(
        curve_probe(curve, calls), BUDGET, max_batch=64, slope_hint={"peak": 1_000 * MIB}
    )
    # b* = 30 is nearer the fitting end of (1, 65): 31 is probed first and fails, then 30 fits
    assert calls == [1, 31, 30]


def test_without_peaks_it_doubles_then_bisects() -> None:
    curve = linear(10_000 * MIB, 1_000 * MIB)
    calls: list[int] = []
    plan = largest_fitting_batch(curve_probe(curve, calls, report_peak=False), BUDGET, max_batch=64)
    assert plan.best_batch == 30
    assert calls[:6] == [1, 2, 4, 8, 16, 32]


def test_a_failed_probe_stops_the_search() -> None:
    def probe(batch: int) -> Observation:
        return Observation(batch, None if batch > 1 else True, 10 * MIB)

    plan = largest_fitting_batch(probe, BUDGET, max_batch=64)
    assert plan.failed is not None and plan.failed.batch == 2


def phased(optimizer: int, backward_fixed: int, per_sample: int) -> Callable[[int], dict[str, int]]:
    """Allocated peaks per phase: a near-constant optimizer step, a backward pass that grows."""
    return lambda b: {"optimizer": optimizer + b * MIB, "backward": backward_fixed + per_sample * b}


def phased_probe(
    phases: Callable[[int], dict[str, int]], overhead: int, use_phases: bool, calls: list[int]
):
    def probe(b: int) -> Observation:
        calls.append(b)
        peak = max(phases(b).values()) + overhead
        return Observation(b, peak <= BUDGET, peak, phases(b) if use_phases else None)

    return probe


def test_phase_peaks_see_past_an_optimizer_step_that_hides_the_activations() -> None:
    """At small batches the optimizer step (weights, gradients, states) is the peak and barely
    grows; backward grows with every sample and takes over. A line through the total peak of the
    first probes sees almost no growth and overshoots; a line per phase does not."""
    overhead = 2_000 * MIB
    rng = random.Random(1)
    with_phases, total_only = [], []
    for _ in range(100):
        phases = phased(
            rng.randint(15_000, 30_000) * MIB,
            rng.randint(5_000, 12_000) * MIB,
            rng.randint(300, 2_000) * MIB,
        )
        truth = exact(lambda b, phases=phases: max(phases(b).values()) + overhead, 64)
        for use_phases, counts in ((True, with_phases), (False, total_only)):
            calls: list[int] = []
            plan = largest_fitting_batch(
                phased_probe(phases, overhead, use_phases, calls), BUDGET, max_batch=64
            )
            assert plan.best_batch == truth
            counts.append(len(calls))
    assert max(with_phases) <= 5
    assert sum(with_phases) < sum(total_only)
