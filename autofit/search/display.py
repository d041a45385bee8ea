"""The text a search shows besides its Pareto table (the report's, autofit/report/tables.py): its
best configuration, and why the other combinations lost."""

from __future__ import annotations

from autofit.probe.spec import ProbeResult
from autofit.probe.summary import headroom, host_line, provenance
from autofit.results import Status
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
) -> str:
    """The best run: its figures, its headroom, whether simulated; and, where the best rule
    preferred it to the fastest run (`fastest`), which run that was and the rule."""
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
    return "\n".join(lines)


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
