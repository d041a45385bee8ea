"""The trade-off between throughput and run size, and the best configuration."""

from __future__ import annotations

from collections import defaultdict

from autofit.probe.spec import Outcome, ProbeResult


def run_size(result: ProbeResult) -> int:
    """Pixels per optimizer step: batch x resolution squared."""
    return int(result.config["batch_size"]) * int(result.config["resolution"]) ** 2


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


def best_config(results: list[ProbeResult], resolution: int, min_batch: int) -> ProbeResult | None:
    """The fastest fitting run at `resolution` with at least `min_batch`; ties to less memory."""
    candidates = [
        r
        for r in results
        if r.outcome is Outcome.OK
        and int(r.config["resolution"]) == resolution
        and int(r.config["batch_size"]) >= min_batch
    ]
    return min(candidates, key=_rank) if candidates else None
