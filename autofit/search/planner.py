"""The largest batch that fits, in few probes: fit, extrapolate, verify.

Peak memory grows with batch size almost linearly: fixed model state plus activations per sample
(the allocator's rounding makes small steps). The peak is the largest of each phase's peak, and
the phases grow at different rates: at small batches the optimizer step (weights, gradients,
states) is often the peak and barely grows, while backward (activations) grows fast and takes
over. So after a probe or two the planner fits a line to each phase's peak through the measured
probes nearest the boundary, extrapolates each to the budget, takes the smallest batch any phase
allows, and probes there and one above to verify (one above first, where the answer is nearer
the batches known to fit). The answer is exact (the probe at `b*` fits and the one at `b* + 1`
does not, or `b*` is the space's maximum) and usually takes three or four probes where bisection
over 1..64 takes six to seven and a grid takes 64. Probes that report no peak (a real
out-of-memory error) fall back to doubling and bisection, and a guess that fails to halve the
bracket is followed by a bisection step, so a curve the lines cannot follow still converges. No
probe is allowed that could leave a bracket wider than bisection can close in the probes left
(the projection of the ITP method, Oliveira and Takahashi 2020): the planner never takes more
probes than bisection over the same range, or `NARROW_PROBES` where bisection needs fewer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autofit.records.probe import Outcome, ProbeResult

Slopes = dict[str, float]  # curve name -> bytes per extra sample


@dataclass(frozen=True)
class Observation:
    """One probe, as the planner sees it: did `batch` fit, at what peak, and (when known) the
    allocated peak of each phase."""

    batch: int
    fits: bool | None  # None: the probe failed (crash or timeout) and says nothing about memory
    peak_bytes: int | None = None
    phase_peaks: Mapping[str, int] | None = None
    samples_per_s: float | None = None  # where it fits

    @classmethod
    def of(cls, batch: int, result: ProbeResult) -> Observation:
        """What a probe's result tells the planner: fits or not (ok or oom), or nothing. Over
        the host budget (oom_host) does not fit either; its GPU peak, under the GPU's budget,
        says nothing of where the host's boundary is, so it is kept out of the lines."""
        if result.outcome in (Outcome.OK, Outcome.OOM):
            fits = result.outcome is Outcome.OK
            speed = result.samples_per_s if fits else None
            return cls(batch, fits, result.peak_bytes, result.phase_peaks, speed)
        if result.outcome is Outcome.OOM_HOST:
            return cls(batch, False)
        return cls(batch, None)

    def curves(self) -> dict[str, int]:
        """What could be the peak: each phase's allocated peak plus the overhead the probe saw on
        top of its largest (allocator cache, CUDA context), or the peak alone."""
        assert self.peak_bytes is not None
        if not self.phase_peaks:
            return {"peak": self.peak_bytes}
        overhead = self.peak_bytes - max(self.phase_peaks.values())
        return {phase: peak + overhead for phase, peak in self.phase_peaks.items()}


@dataclass
class LargestBatch:
    """The planner's answer for one combination and resolution."""

    best_batch: int | None  # b*; None when nothing above `floor` fits
    observations: list[Observation] = field(default_factory=list)
    failed: Observation | None = None  # the probe that stopped the search, if one failed

    @property
    def probes(self) -> int:
        return len(self.observations)

    def slopes(self) -> Slopes | None:
        """Bytes per extra sample of each curve near the boundary, from the measured probes."""
        model = _model(self.observations)
        return model[1] if model else None


def _model(points: list[Observation]) -> tuple[Observation, Slopes] | None:
    """An anchor probe and each curve's slope, through the two measured probes nearest the
    boundary: the largest that fits and the smallest that does not, else the two nearest on the
    one side that has two."""
    measured = sorted((o for o in points if o.peak_bytes is not None), key=lambda o: o.batch)
    fitting = [o for o in measured if o.fits]
    failing = [o for o in measured if o.fits is False]
    if fitting and failing:
        a, b = fitting[-1], failing[0]
    elif len(fitting) >= 2:
        a, b = fitting[-2], fitting[-1]
    elif len(failing) >= 2:
        a, b = failing[0], failing[1]
    else:
        return None
    low, high = a.curves(), b.curves()
    if set(low) != set(high):  # phases differ (one probe failed early): fall back to the peak
        low, high = {"peak": a.peak_bytes}, {"peak": b.peak_bytes}  # type: ignore[dict-item]
    slopes = {name: (high[name] - low[name]) / (b.batch - a.batch) for name in low}
    return a, slopes


def _extrapolate(anchor: Observation, slopes: Slopes, budget: int) -> int | None:
    """The largest batch every curve allows, extrapolating each from the anchor."""
    curves = anchor.curves() if set(slopes) <= set(anchor.curves()) else {"peak": anchor.peak_bytes}
    limits = []
    for name, slope in slopes.items():
        start = curves.get(name)
        if start is None:
            continue
        if slope > 0:
            limits.append(anchor.batch + int((budget - start) // slope))
        elif start > budget:  # a curve that does not grow and is already over
            limits.append(anchor.batch - 1)
    return min(limits) if limits else None


# The most probes the planner may take on a range that bisection covers in fewer: room for its
# first probes, at the floor and one above, which bring the line but barely shrink the bracket,
# and for the line's guess and its check; with it, 1..1000 costs what 1..64 does on a line.
NARROW_PROBES = 13


def bisection_probes(width: int) -> int:
    """How many probes bisection takes to shrink a bracket `width` wide (lo fits, hi does not,
    the answer in between) to adjacent batches: ceil(log2(width))."""
    return (width - 1).bit_length()


def largest_fitting_batch(
    probe: Callable[[int], Observation],
    budget_bytes: int,
    max_batch: int,
    floor: int = 0,
    slope_hint: Slopes | None = None,
) -> LargestBatch:
    """Find the largest batch in (`floor`, `max_batch`] whose probe fits `budget_bytes`.

    `floor` is a batch below which the search need not look (another configuration already
    covers it); the first probe is at `floor + 1`. `slope_hint` (bytes per sample of each curve,
    from a similar configuration) lets the planner extrapolate after the first probe.
    """
    plan = LargestBatch(best_batch=None)
    lo, hi = (
        floor,
        max_batch + 1,
    )  # lo: largest known to fit (or the floor); hi: smallest known not to
    batch = floor + 1
    bisect = False
    allowed = max(bisection_probes(hi - lo), NARROW_PROBES)
    while True:
        # Never a probe that could leave more than bisection can finish in the probes left:
        # whichever way it falls, the bracket must then be at most 2^(probes left) wide.
        reach = 1 << (allowed - len(plan.observations) - 1)
        batch = min(max(batch, hi - reach, lo + 1), lo + reach, hi - 1)
        width = hi - lo
        observation = probe(batch)
        plan.observations.append(observation)
        if observation.fits is None:
            plan.failed = observation
            break
        if observation.fits:
            lo = batch
        else:
            hi = batch
        if lo >= max_batch or hi == lo + 1:
            break
        # A bracketed guess that did not halve the bracket means the line misleads here: bisect
        # once before trusting it again.
        bisect = not bisect and hi <= max_batch and width <= max_batch and 2 * (hi - lo) > width
        batch = _next_batch(plan.observations, lo, hi, budget_bytes, max_batch, slope_hint, bisect)
    plan.best_batch = lo if lo > floor else None
    return plan


def _next_batch(
    points: list[Observation],
    lo: int,
    hi: int,
    budget: int,
    max_batch: int,
    slope_hint: Slopes | None,
    bisect: bool,
) -> int:
    guess: int | None = None
    if not bisect:
        model = _model(points)
        measured = [o for o in points if o.peak_bytes is not None]
        if model is None and slope_hint and measured:
            model = (measured[-1], slope_hint)
        if model is not None:
            guess = _extrapolate(*model, budget)
            if guess is not None and lo < guess and guess + 1 - lo < hi - guess:
                # Nearer the fitting end: probe the batch above the line's answer first. If the
                # line is right it fails and the bracket closes on the next probe; verified from
                # below, a wide (b*, hi) would be left for the bound to make bisection close.
                guess += 1
    if guess is None:
        guess = (
            2 * lo if hi > max_batch else (lo + hi) // 2
        )  # double until something fails, then bisect
    return min(max(guess, lo + 1), hi - 1)
