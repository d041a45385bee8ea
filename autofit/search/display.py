"""The text a search shows: its Pareto table, its best configuration, why others lost."""

from __future__ import annotations

from autofit.probe.spec import ProbeResult
from autofit.search.engine import Combination, SearchResult
from autofit.units import size, value


def config_words(result: ProbeResult, knob_names: list[str]) -> str:
    return " ".join(f"{k}={value(result.config[k])}" for k in knob_names)


def pareto_table(search: SearchResult, knob_names: list[str]) -> str:
    header = ["res", "batch", *knob_names, "samples/s", "peak", "of budget"]
    rows = []
    for resolution, front in search.pareto.items():
        for result in front:
            rows.append(
                [
                    str(resolution),
                    str(result.config["batch_size"]),
                    *(value(result.config[k]) for k in knob_names),
                    f"{result.samples_per_s:.3f}",
                    size(result.peak_bytes),
                    f"{(result.peak_bytes or 0) / search.budget_bytes:.0%}",
                ]
            )
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def best_block(best: ProbeResult, knob_names: list[str]) -> str:
    how = "roofline estimate" if best.throughput_estimated else "measured"
    return "\n".join(
        [
            f"best: batch_size={best.config['batch_size']} resolution={best.config['resolution']} "
            f"{config_words(best, knob_names)}",
            f"  {best.samples_per_s:.3f} samples/s ({how}), peak {size(best.peak_bytes)} of a "
            f"{size(best.budget_bytes)} budget",
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
        if c.status == "invalid":
            invalid.setdefault(c.reason, []).append(c)
        elif c.status in ("pruned", "none_fit", "failed"):
            lines.append(f"  {c.status:<9} {c.label()}: {c.reason}")
    for reason, group in invalid.items():
        what = group[0].label() if len(group) == 1 else f"{len(group)} combinations"
        lines.append(f"  {'invalid':<9} {what}: {reason}")
    return "\n".join(lines)
