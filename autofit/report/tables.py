"""The report's tables, as data (`Table`) the text and the HTML page both render.

The Pareto front, the best configuration per resolution, the best configuration's peak broken
down against the budget, and why every other combination lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autofit.host import budget_words
from autofit.records.probe import Outcome
from autofit.records.status import Status
from autofit.report.changes import Comparison, over_budget, relative
from autofit.results import Probe, Study
from autofit.units import many, size
from autofit.units import value as show

# The parts of a peak, in the order a training step builds them, as a probe's breakdown names them.
PARTS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "temporaries": "temporaries",
    "overhead": "overhead (CUDA context, workspaces, cache)",
}


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""  # shown below the table (or instead of it when there are no rows)

    def text(self) -> str:
        lines = [f"{self.title}:"]
        if self.rows:
            widths = [
                max(len(h), *(len(r[i]) for r in self.rows)) for i, h in enumerate(self.header)
            ]
            for row in [self.header, *self.rows]:
                lines.append(
                    "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                )
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def margin_words(margin: float | None) -> str:
    """A margin as a share, as the user wrote it: 5%, 96.3%."""
    return f"{float(margin or 0.0) * 100:g}%"


def headline(study: Study) -> str:
    s = study.summary
    # A study written before autofit counted host memory has no host budget to state.
    host = (
        f", host budget {budget_words(s['host_budget_bytes'], s.get('host_budget_basis'))}"
        if "host_budget_bytes" in s
        else ""
    )
    return (
        f"study {study.name}: {s.get('model')} on {s.get('gpu')} [{s.get('backend')}], "
        f"space {s.get('space')}, budget {size(study.budget_bytes)} "
        f"(the GPU's memory less a {margin_words(s.get('margin'))} margin){host}, "
        f"{many(int(s.get('n_probes', 0)), 'probe')}; results in {study.path}/"
    )


def _knobs(config: dict[str, Any], names: list[str]) -> list[str]:
    return [show(config.get(k, "-")) for k in names]


def config_words(config: dict[str, Any], names: list[str]) -> str:
    return " ".join(
        [f"batch_size={config['batch_size']}", f"resolution={config['resolution']}"]
        + [f"{k}={show(config[k])}" for k in names if k in config]
    )


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def host_cell(point: dict[str, Any]) -> str:
    """A fitting run's host peak for a table: its size, with the pinned share where some of it
    is pinned (page-locked memory the host cannot page out); "-" for a run from a study written
    before autofit counted host memory."""
    peak, pinned = point.get("host_peak_bytes"), point.get("host_pinned_bytes")
    if peak is None:
        return "-"
    return size(peak) + (f" ({pinned / peak:.0%} pinned)" if pinned and peak else "")


def pareto_table(study: Study) -> Table:
    names = study.knob_names
    table = Table(
        "Pareto front (throughput against batch x pixels), per resolution",
        ["res", "batch", *names, "samples/s", "peak", "of budget", "host"],
    )
    for point in sorted(study.pareto, key=lambda p: (p["config"]["resolution"], p["run_size"])):
        config = point["config"]
        table.rows.append(
            [
                str(config["resolution"]),
                str(config["batch_size"]),
                *_knobs(config, names),
                f"{point['samples_per_s']:.3f}",
                size(point["peak_bytes"]),
                _share(point["peak_bytes"], study.budget_bytes),
                host_cell(point),
            ]  # fmt: skip
        )
    if not table.rows:
        table.note = nothing_fits(study)
    return table


def host_budget(study: Study) -> int | None:
    """The study's host budget (bytes); None where not stated or not counted."""
    return study.summary.get("host_budget_bytes")


def _runs(n: int) -> str:
    return "1 run fits" if n == 1 else f"{n} runs fit"


def nothing_fits(study: Study) -> str:
    over_host = [p for p in study.probes if p.outcome is Outcome.OOM_HOST]
    if over_host:
        least = min(p.host_peak_bytes or 0 for p in over_host)
        return (
            f"nothing fits: {_runs(len(over_host))} the GPU but not the host (the least host "
            f"memory found is {size(least)} against a host budget of "
            f"{budget_words(host_budget(study), study.summary.get('host_budget_basis'))})"
        )
    smallest = study.smallest_peak()
    found = f"the smallest peak found is {size(smallest)}" if smallest else "no probe finished"
    return f"nothing fits: {found} against a budget of {size(study.budget_bytes)}"


def best_table(study: Study) -> Table:
    names = study.knob_names
    best = study.best
    table = Table(
        "best configuration per resolution (the fastest that fits; at the target resolution, "
        "the search's best, which may trade a little speed for headroom)",
        ["res", "batch", *names, "samples/s", "step", "peak", "of budget", "host", ""],
    )
    points = study.chosen_per_resolution()
    for resolution, point in points.items():
        config = point["config"]
        overall = best is not None and best["config"] == config
        table.rows.append(
            [
                str(resolution),
                str(config["batch_size"]),
                *_knobs(config, names),
                f"{point['samples_per_s']:.3f}",
                f"{(point.get('step_time_s') or 0) * 1e3:.1f} ms",
                size(point["peak_bytes"]),
                _share(point["peak_bytes"], study.budget_bytes),
                host_cell(point),
                "<- best" if overall else "",
            ]  # fmt: skip
        )
    if best is not None:
        table.note = f"best: {config_words(best['config'], names)}"
    elif table.rows:
        table.note = "best: none at the target resolution (see the Pareto front for the others)"
    else:
        table.note = "none: nothing fits"
    return table


def breakdown_table(study: Study) -> Table:
    best = study.best
    table = Table(
        "the best configuration's peak, part by part", ["part", "bytes", "of peak", "of budget"]
    )
    if best is None or not best.get("breakdown"):
        table.note = "no best configuration: nothing fits"
        return table
    peak, budget = best["peak_bytes"], study.budget_bytes
    breakdown = best["breakdown"]
    for key, label in PARTS.items():
        if key in breakdown:
            part = breakdown[key]
            table.rows.append([label, size(part), _share(part, peak), _share(part, budget)])
    table.rows.append(["peak", size(peak), "100%", _share(peak, budget)])
    table.rows.append(["budget", size(budget), "", "100%"])
    table.rows.append(["headroom", size(budget - peak), "", _share(budget - peak, budget)])
    return table


def _oom_words(probe: Probe, study: Study) -> str:
    if probe.outcome in (Outcome.OOM, Outcome.OOM_HOST):
        outcome, figures = over_budget(probe, study.budget_bytes, host_budget(study))
        return f"batch {probe.batch_size}: {outcome} ({figures})"
    return f"batch {probe.batch_size}: {probe.outcome.value}" + (
        f" ({probe.reason})" if probe.reason else ""
    )


def _why_exact(study: Study, combination: dict[str, Any], best_at: dict[str, Any] | None) -> str:
    """Why a combination that fits some batch is not the best at its resolution."""
    probes = study.probes_of(combination)
    b = combination["best_batch"]
    fitting = next((p for p in probes if p.batch_size == b), None)
    above = next((p for p in probes if p.batch_size == b + 1), None)
    limit = _oom_words(above, study) if above else f"batch {b} is the space's largest"
    if fitting is None or fitting.samples_per_s is None or best_at is None:
        return limit
    slower = 1 - fitting.samples_per_s / best_at["samples_per_s"]
    if slower <= 0:
        tie = (
            "a larger peak" if (fitting.peak_bytes or 0) > best_at["peak_bytes"] else "listed later"
        )
        speed = f"{fitting.samples_per_s:.3f} samples/s, as fast as the best ({tie})"
    else:
        speed = f"{fitting.samples_per_s:.3f} samples/s, {slower:.1%} slower than the best"
    on_front = any(
        p["config"]["resolution"] == combination["resolution"]
        and p["config"]["batch_size"] == b
        and all(show(p["config"].get(k)) == show(v) for k, v in combination["knobs"].items())
        for p in study.pareto
    )
    if on_front:
        speed += " (on the Pareto front: a larger run)"
    return f"{speed}; {limit}"


def losers_table(study: Study) -> Table:
    """One row per combination at each resolution that is not the best there, with why."""
    names = study.knob_names
    table = Table("why the others lost", ["res", *names, "result", "why"])
    best_at = study.chosen_per_resolution()
    for combination in study.combinations:
        resolution, status = int(combination["resolution"]), Status(combination["status"])
        best = best_at.get(resolution)
        if best is not None and status is Status.EXACT:
            same = all(
                show(best["config"].get(k)) == show(v) for k, v in combination["knobs"].items()
            )
            if same and best["config"]["batch_size"] == combination["best_batch"]:
                continue
        if status is Status.EXACT:
            result, why = (
                f"fits up to {combination['best_batch']}",
                _why_exact(study, combination, best),
            )
        elif status is Status.NONE_FIT:
            probes = study.probes_of(combination)
            result = "none fit"
            why = _oom_words(probes[0], study) if probes else combination["reason"]
        elif status is Status.FAILED:  # a probe crashed or timed out: its own message says why
            broken = [
                p
                for p in study.probes_of(combination)
                if p.outcome in (Outcome.CRASH, Outcome.TIMEOUT)
            ]
            result = status.value
            why = _oom_words(broken[0], study) if broken else combination["reason"]
        else:  # pruned or invalid: the search said why
            result, why = status.value, combination["reason"].removeprefix("invalid: ")
        table.rows.append([str(resolution), *_knobs(combination["knobs"], names), result, why])
    if not table.rows:
        table.note = "none: every combination's best run is the best at its resolution"
    return table


def _figures(probe: Probe) -> str:
    """Where a probe's figures come from: its backend, and for a simulated one whether it traced
    its own step or replayed a batch curve, where trials.csv says so."""
    return f"{probe.backend} ({probe.source})" if probe.source else probe.backend or "-"


def probes_table(study: Study) -> Table:
    """Every row of trials.csv, in its order: each probe, and each combination pruned or invalid
    without one."""
    names = study.knob_names
    table = Table(
        f"every probe ({len(study.probes)} rows of trials.csv)",
        ["res", "batch", *names, "outcome", "phase", "peak", "of budget", "host", "samples/s",
         "figures", "why"],
    )  # fmt: skip
    for probe in study.probes:
        table.rows.append(
            [
                str(probe.resolution),
                "-" if probe.batch_size is None else str(probe.batch_size),
                *_knobs(probe.knobs, names),
                probe.outcome.value,
                probe.phase or "-",
                size(probe.peak_bytes),
                _share(probe.peak_bytes, study.budget_bytes) if probe.peak_bytes else "-",
                size(probe.host_peak_bytes),
                "-" if probe.samples_per_s is None else f"{probe.samples_per_s:.3f}",
                _figures(probe) if probe.batch_size is not None else "-",
                probe.reason,
            ]  # fmt: skip
        )
    if not table.rows:
        table.note = "none: trials.csv holds no row"
    return table


def report_tables(study: Study) -> list[Table]:
    return [pareto_table(study), best_table(study), breakdown_table(study), losers_table(study)]


# -- compare ---------------------------------------------------------------------------------------


def _fit(probe: Probe | None) -> str:
    if probe is None:
        return "not probed"
    if probe.outcome in (Outcome.OOM, Outcome.OOM_HOST):
        where = f" in {probe.phase}" if probe.phase else ""
        return f"no ({probe.outcome.value}{where})"
    return "yes" if probe.outcome is Outcome.OK else probe.outcome.value


def _percent(change: float | None) -> str:
    return "-" if change is None else f"{change:+.1%}"


def comparison_tables(comparison: Comparison) -> list[Table]:
    """Two studies side by side: the configurations whose figures changed, the combinations
    whose largest fitting batch changed, and the best configuration of each."""
    names = comparison.after.knob_names or comparison.before.knob_names
    return [
        _changed_configurations(comparison, names),
        _changed_largest(comparison, names),
        _best_before_and_after(comparison, names),
    ]


def _changed_configurations(comparison: Comparison, names: list[str]) -> Table:
    """The configurations whose fit, peak or throughput changed, with a note that counts those
    probed by both studies and by one only."""
    # Regressions first, then other changes to configurations both probed, then the rest.
    changed = sorted(
        (c for c in comparison.configurations if c.changed),
        key=lambda c: (not c.regression, c.before is None or c.after is None),
    )
    both = [c for c in comparison.configurations if c.before is not None and c.after is not None]
    configurations = Table(
        f"configurations that changed, {comparison.before.name} ({comparison.before.path}) -> "
        f"{comparison.after.name} ({comparison.after.path})",
        [
            "res",
            "batch",
            *names,
            "fits",
            "peak before",
            "peak after",
            "peak change",
            "samples/s before",
            "samples/s after",
            "change",
            "",
        ],  # fmt: skip
    )
    for c in changed:
        peak = c.peak_change_bytes
        configurations.rows.append(
            [
                str(c.config["resolution"]),
                str(c.config["batch_size"]),
                *_knobs(c.config, names),
                f"{_fit(c.before)} -> {_fit(c.after)}",
                size(c.before.peak_bytes if c.before else None),
                size(c.after.peak_bytes if c.after else None),
                "-" if peak is None else ("+" if peak > 0 else "") + size(peak),
                f"{c.before.samples_per_s:.3f}" if c.before and c.before.samples_per_s else "-",
                f"{c.after.samples_per_s:.3f}" if c.after and c.after.samples_per_s else "-",
                _percent(c.throughput_change),
                "REGRESSION" if c.regression else "",
            ]  # fmt: skip
        )
    only_before = sum(c.after is None for c in comparison.configurations)
    only_after = sum(c.before is None for c in comparison.configurations)
    configurations.note = (
        f"{len(both)} configurations probed by both, {len(both) - sum(c.changed for c in both)} "
        f"unchanged; {only_before} probed only before, {only_after} only after"
    )
    if not both:
        configurations.note += " (no configuration in common: were the same knobs searched?)"
    return configurations


def _changed_largest(comparison: Comparison, names: list[str]) -> Table:
    """The combinations whose largest fitting batch, or status, changed."""
    largest = Table("largest fitting batch per combination, where it changed",
                    ["res", *names, "before", "after", ""])  # fmt: skip
    for c in comparison.combinations:
        before, after = c.largest(c.before), c.largest(c.after)
        states = (c.before or {}).get("status"), (c.after or {}).get("status")
        if before == after and states[0] == states[1]:
            continue
        largest.rows.append(
            [
                str(c.resolution),
                *_knobs(c.knobs, names),
                str(before) if before is not None else str(states[0] or "absent"),
                str(after) if after is not None else str(states[1] or "absent"),
                "REGRESSION" if c.regression else "",
            ]  # fmt: skip
        )
    if not largest.rows:
        largest.note = "no change"
    return largest


def _best_before_and_after(comparison: Comparison, names: list[str]) -> Table:
    """Each study's best configuration, and how the throughput changed between them."""
    best = Table("best configuration before and after",
                 ["", "configuration", "samples/s", "peak", "budget"])  # fmt: skip
    for label, study in (("before", comparison.before), ("after", comparison.after)):
        entry = study.best
        best.rows.append(
            [
                label,
                config_words(entry["config"], names) if entry else "nothing fits",
                f"{entry['samples_per_s']:.3f}" if entry else "-",
                size(entry["peak_bytes"]) if entry else "-",
                size(study.budget_bytes),
            ]  # fmt: skip
        )
    if comparison.before.best and comparison.after.best:
        speed = relative(
            comparison.before.best["samples_per_s"], comparison.after.best["samples_per_s"]
        )
        same = comparison.before.best["config"] == comparison.after.best["config"]
        best.note = f"{'same configuration' if same else 'a different configuration'}, throughput {speed:+.1%}"
    return best
