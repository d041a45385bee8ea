"""The text a search shows besides its Pareto table (the report's, autofit/report/tables.py): its
best configuration, and why the other combinations lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autofit.probe.summary import headroom, host_line, provenance
from autofit.records.probe import ProbeResult
from autofit.records.status import Status
from autofit.search.combination import Combination
from autofit.search.pareto import BestRule
from autofit.units import size, value


def config_words(result: ProbeResult, knob_names: list[str]) -> str:
    return " ".join(f"{k}={value(result.config[k])}" for k in knob_names)


def run_words(result: ProbeResult, knob_names: list[str]) -> str:
    words = f"batch_size={result.config['batch_size']} resolution={result.config['resolution']}"
    return f"{words} {config_words(result, knob_names)}".rstrip()


def best_block(
    best: ProbeResult,
    knob_names: list[str],
    fastest: ProbeResult | None = None,
    rule: BestRule | None = None,
    edge: Edge | None = None,
) -> str:
    """The best run: its figures, its headroom, whether simulated; where the best rule
    preferred it to the fastest run (`fastest`), which run that was and the rule; and where it
    sits within the margin's width of the budget (`edge`), the roomier run beside it."""
    how = "roofline estimate" if best.throughput_estimated else "measured"
    host = host_line(best)
    lines = [
        f"best: {run_words(best, knob_names)}",
        f"  {best.samples_per_s:.3f} samples/s ({how}), peak {size(best.peak_bytes)} of a "
        f"{size(best.budget_bytes)} budget: {headroom(best.peak_bytes or 0, best.budget_bytes)}; "
        f"{provenance(best.backend)}",
        *([f"  host {host}"] if host else []),
    ]
    if fastest is not None and rule is not None:
        faster = (fastest.samples_per_s or 0.0) / (best.samples_per_s or 1.0) - 1
        lines.append(
            f"  preferred to the fastest, {run_words(fastest, knob_names)}: {faster:.1%} faster "
            f"but {size((fastest.peak_bytes or 0) - (best.peak_bytes or 0))} less headroom "
            f"({rule.describe()})"
        )
    if edge is not None:
        lines.extend(edge.words(best, knob_names))
    return "\n".join(lines)


@dataclass(frozen=True)
class Edge:
    """The margin's width (`margin_bytes`: the card's memory times the margin) and the runs
    that could stand in for a best that sits within it of the budget: those the search measured
    fitting at the best's resolution. The margin covers the simulation's error; a run within one
    margin of the edge fits only if the error is no larger than the published runs' worst."""

    margin_bytes: int
    fitting: Sequence[ProbeResult]

    def words(self, best: ProbeResult, knob_names: list[str]) -> list[str]:
        left = best.budget_bytes - (best.peak_bytes or 0)
        if left >= self.margin_bytes:
            return []
        line = (
            f"  at the edge: {size(left)} of headroom, less than the margin's width "
            f"({size(self.margin_bytes)})"
        )
        roomy = [
            r for r in self.fitting if best.budget_bytes - (r.peak_bytes or 0) >= self.margin_bytes
        ]
        if not roomy:
            return [line + "; no run the search measured leaves that much"]
        lighter = max(roomy, key=lambda r: r.samples_per_s or 0.0)
        slower = 1 - (lighter.samples_per_s or 0.0) / (best.samples_per_s or 1.0)
        return [
            line + f"; the fastest run that leaves it: {run_words(lighter, knob_names)}, "
            f"{slower:.1%} slower, peak {size(lighter.peak_bytes)}"
        ]


def losers(combinations: list[Combination]) -> str:
    """One line per combination that did not produce a fitting run, and why.

    Invalid combinations sharing a reason are counted on one line: a space that crosses ZeRO
    stages with optimizers and precisions has dozens of them, and listing each one buries the
    few lines worth reading (every one is still a PRUNED trial in the study and in trials.csv)."""
    lines = []
    invalid: dict[str, list[Combination]] = {}
    for c in combinations:
        if c.status is Status.INVALID:
            invalid.setdefault(c.reason, []).append(c)
        elif c.status in (Status.PRUNED, Status.NONE_FIT, Status.FAILED):
            lines.append(f"  {c.status.value:<9} {c.label()}: {c.reason}")
    for reason, group in invalid.items():
        what = group[0].label() if len(group) == 1 else f"{len(group)} combinations"
        lines.append(f"  {Status.INVALID.value:<9} {what}: {reason}")
    return "\n".join(lines)
