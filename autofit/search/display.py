"""The text a search shows besides its Pareto table (the report's, autofit/report/tables.py): its
best configuration, and why the other combinations lost."""

from __future__ import annotations

from autofit.probe.spec import ProbeResult
from autofit.probe.summary import host_line
from autofit.results import Status
from autofit.search.engine import Combination
from autofit.units import size, value


def config_words(result: ProbeResult, knob_names: list[str]) -> str:
    return " ".join(f"{k}={value(result.config[k])}" for k in knob_names)


def best_block(best: ProbeResult, knob_names: list[str]) -> str:
    how = "roofline estimate" if best.throughput_estimated else "measured"
    host = host_line(best)
    return "\n".join(
        [
            f"best: batch_size={best.config['batch_size']} resolution={best.config['resolution']} "
            f"{config_words(best, knob_names)}",
            f"  {best.samples_per_s:.3f} samples/s ({how}), peak {size(best.peak_bytes)} of a "
            f"{size(best.budget_bytes)} budget",
            *([f"  host {host}"] if host else []),
        ]
    )


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
