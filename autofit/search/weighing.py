"""The runs the best rule weighs: where the rule (autofit/search/pareto.py) may prefer a lighter
run than the fastest, which batches a scan reports for it, which combinations may hold such a run
that no scan reported, and the probes that find it in one of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autofit.records.probe import ProbeResult, ScanWindow
from autofit.records.status import Status
from autofit.search.combination import Combination, frozen, parents
from autofit.search.planner import Observation
from autofit.search.space import SearchSpace


def scan_window(
    space: SearchSpace, resolution: int, fastest: Callable[[], ProbeResult | None]
) -> ScanWindow | None:
    """What scans at `resolution` report for the best rule: at the target resolution, where
    the rule may prefer a lighter run than the fastest, every batch within its tolerance,
    above the floor that the fastest run found so far (`fastest()`) sets (ScanWindow)."""
    rule = space.best_rule
    if resolution != space.target_resolution or not rule.prefers_lighter:
        return None
    floor = rule.floor(fastest())
    return ScanWindow(space.target_min_batch, rule.speed_tolerance, floor)


def unweighed(
    runnable: list[Combination],
    floor: float,
    space: SearchSpace,
    windows: dict[tuple[Any, ...], float],
    reaches: Callable[[dict[str, Any], float], bool],
    clip: int | None = None,
) -> list[Combination]:
    """The combinations at the target resolution that may hold a run the best rule weighs
    (as fast as `floor`) that the search has not looked at: those probed batch by batch,
    those whose window was too wide to report, and those whose scan reported it down to a
    higher floor only (`windows`: (knobs, resolution) -> the floor its scan reported down to; a
    scan another search stored, whose fastest run was faster), where their own fastest run
    reaches the floor (`reaches`); and those pruned because a parent already fits the largest
    batch, where that parent reaches it (a memory-saving setting costs speed at every batch, so
    it cannot run faster than its parent). Of a video model, only those at `clip`, the clip
    length of the fastest run the floor comes from: the best is at that length."""
    found = []
    for combination in runnable:
        if combination.resolution != space.target_resolution:
            continue
        if clip is not None and combination.knobs.get("frames") not in (None, clip):
            continue
        key = (frozen(combination.knobs), combination.resolution)
        if windows.get(key, float("inf")) <= floor:
            continue  # its scan reported every batch as fast as the floor
        if combination.status is Status.PRUNED:
            if any(reaches(p, floor) for p in parents(combination.knobs, space)):
                found.append(combination)
        elif reaches(combination.knobs, floor):
            found.append(combination)
    return found


def weigh(probe: Callable[[int], Observation], top: int, least_batch: int, floor: float) -> None:
    """Probe a combination (`probe`, whose probes already made are not made again) for the run
    the best rule weighs for it, of its runs as fast as `floor` the one that holds the least (the
    faster of equal ones), by bisection between `least_batch` and its largest batch `top`: a
    roofline step's time per sample does not grow with the batch, so the runs as fast are the
    batches from the least that is up; and the memory a step holds does not fall as its batch
    grows, so the one that holds the least is the largest batch that holds what that least one
    does."""

    def fast(batch: int) -> bool:  # a batch that does not fit says to look lower
        seen = probe(batch)
        return not seen.fits or (seen.samples_per_s or 0.0) >= floor

    if not fast(top):
        return
    least = _first_true(fast, least_batch, top)
    while least < top and not probe(least).fits:  # the least that also fits
        least += 1
    peak = probe(least).peak_bytes or 0

    def heavier(batch: int) -> bool:
        seen = probe(batch)
        return not seen.fits or (seen.peak_bytes or 0) > peak

    if heavier(top):
        _first_true(heavier, least + 1, top)


def _first_true(holds: Callable[[int], bool], low: int, high: int) -> int:
    """The least batch in `low`..`high` for which `holds`, by bisection: it holds at `high` and
    at every batch above the least one."""
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle + 1, high)
    return low
