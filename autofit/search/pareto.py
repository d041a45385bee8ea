"""The trade-off between throughput and run size, and the best configuration."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields, replace
from typing import Any

from autofit.records.probe import Outcome, ProbeResult
from autofit.settings import SHARE


def run_size(result: ProbeResult) -> int:
    """Pixels per optimizer step: batch x resolution squared (x frames, for a video model's
    clips)."""
    frames = run_frames(result)
    return int(result.config["batch_size"]) * int(result.config["resolution"]) ** 2 * frames


def run_frames(result: ProbeResult) -> int:
    """The frames of a video run's clips; 1 for an image or a sequence."""
    return int(result.config.get("frames") or 1)


def at_longest_clip(results: list[ProbeResult]) -> list[ProbeResult]:
    """Of fitting runs, those at the longest clip among them: a video run's clip length is its
    size as its resolution is, so the answer is at the longest clip that fits (every run of an
    image or language model is at one clip)."""
    longest = max(map(run_frames, results), default=1)
    return [r for r in results if run_frames(r) == longest]


def _rank(result: ProbeResult) -> tuple[float, int]:
    """Faster first; on a tie, less memory first."""
    return (-(result.samples_per_s or 0.0), result.peak_bytes or 0)


def pareto_front(results: list[ProbeResult]) -> dict[int, list[ProbeResult]]:
    """Per resolution, the fitting runs no other run beats on both throughput and run size,
    smallest run first. Of runs with the same size and speed, the one using less memory stays."""
    by_resolution: dict[int, list[ProbeResult]] = defaultdict(list)
    for result in results:
        if result.outcome is Outcome.OK:
            by_resolution[int(result.config["resolution"])].append(result)
    fronts: dict[int, list[ProbeResult]] = {}
    for resolution, candidates in sorted(by_resolution.items()):
        front: list[ProbeResult] = []
        fastest = float("-inf")
        for result in sorted(candidates, key=lambda r: (-run_size(r), *_rank(r))):
            if (result.samples_per_s or 0.0) > fastest:
                front.append(result)
                fastest = result.samples_per_s or 0.0
        fronts[resolution] = front[::-1]
    return fronts


@dataclass(frozen=True)
class BestRule:
    """How the best configuration is chosen: the fastest fitting run, unless a run at most
    `speed_tolerance` slower (a share of the fastest's samples/s) leaves at least `memory_gain`
    of the budget more free; then, of those, the one that leaves the most free. The fastest run
    at the largest batch that fits sits at the memory edge by construction, where a real run's
    few percent of noise decides whether it fits: a run one batch smaller, or with a lighter
    optimizer, is as fast and safe. `memory_gain=1` turns the preference off."""

    speed_tolerance: float = 0.03
    memory_gain: float = 0.05

    def replaced(self, values: dict[str, Any], where: str) -> BestRule:
        """This rule with the settings `values` gives (None: keep), each checked: a share of 0
        to 1, or a one-line error naming `where` and the value."""
        shares = {}
        for name in (f.name for f in fields(self)):
            value = values.get(name)
            if value is not None:
                shares[name] = SHARE(f"{where}{name}", value)
        return replace(self, **shares)

    @property
    def prefers_lighter(self) -> bool:
        """Whether a run other than the fastest can be the best."""
        return self.memory_gain < 1

    def floor(self, fastest: ProbeResult | None) -> float:
        """The least samples/s of a run the rule weighs against `fastest` (0: none yet)."""
        return (fastest.samples_per_s or 0.0) * (1 - self.speed_tolerance) if fastest else 0.0

    def describe(self) -> str:
        return (
            f"target.speed_tolerance={self.speed_tolerance:g} "
            f"target.memory_gain={self.memory_gain:g}"
        )


def fastest_and_best(
    results: list[ProbeResult], resolution: int, min_batch: int, rule: BestRule = BestRule()
) -> tuple[ProbeResult | None, ProbeResult | None]:
    """The fastest fitting run at `resolution` with at least `min_batch` (ties to less memory),
    and the best by `rule`: the same run, or one nearly as fast with clearly more headroom; of a
    video model, at the longest clip that fits (`at_longest_clip`)."""
    candidates = at_longest_clip(
        [
            r
            for r in results
            if r.outcome is Outcome.OK
            and int(r.config["resolution"]) == resolution
            and int(r.config["batch_size"]) >= min_batch
        ]
    )
    if not candidates:
        return None, None
    fastest = min(candidates, key=_rank)
    floor = rule.floor(fastest)
    freed = rule.memory_gain * fastest.budget_bytes
    lighter = [
        r
        for r in candidates
        if (r.samples_per_s or 0.0) >= floor
        and (fastest.peak_bytes or 0) - (r.peak_bytes or 0) >= freed
    ]
    # most headroom first; of equal peaks, the faster
    best = min(lighter, key=lambda r: (r.peak_bytes or 0, *_rank(r))) if lighter else fastest
    return fastest, best


def best_config(
    results: list[ProbeResult], resolution: int, min_batch: int, rule: BestRule = BestRule()
) -> ProbeResult | None:
    """The best run by `rule` (fastest_and_best)."""
    return fastest_and_best(results, resolution, min_batch, rule)[1]
