"""What changed between two studies of the same search: last night's and tonight's, say.

Configurations are matched by batch, resolution and the searched knobs. A regression is a
configuration that fitted before and does not now, a combination whose largest fitting batch fell,
a fitting configuration (or the best one) whose throughput fell by more than `threshold`, or a best
configuration that disappeared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autofit.host import budget_words
from autofit.records.probe import DOES_NOT_FIT, Outcome
from autofit.records.status import Status
from autofit.results import Probe, Study, knobs_key
from autofit.units import size
from autofit.units import value as show

# Changes smaller than this share are noise of float formatting, not a change.
_SAME = 1e-6


def _config(probe: Probe) -> dict[str, Any]:
    return {"resolution": probe.resolution, "batch_size": probe.batch_size, **probe.knobs}


def _words(config: dict[str, Any]) -> str:
    knobs = " ".join(
        f"{k}={show(v)}" for k, v in config.items() if k not in ("resolution", "batch_size")
    )
    batch = f"batch {config['batch_size']} " if config.get("batch_size") is not None else ""
    return f"{batch}{knobs} @{config['resolution']}px"


def relative(before: float | None, after: float | None) -> float | None:
    if not before or after is None:
        return None
    return after / before - 1


def _state(probe: Probe | None) -> dict[str, Any] | None:
    if probe is None:
        return None
    return {"outcome": probe.outcome.value, "peak_bytes": probe.peak_bytes,
            "host_peak_bytes": probe.host_peak_bytes, "samples_per_s": probe.samples_per_s,
            "phase": probe.phase or None}  # fmt: skip


def over_budget(probe: Probe, budget: int, host_budget: int | None) -> tuple[str, str]:
    """How a probe that does not fit says so: its outcome where it first went over ("oom in
    backward", "oom_host in optimizer") and the figures that went over: the GPU's peak against
    the GPU's budget, or for `oom_host` the host's peak against the host's budget."""
    where = f" in {probe.phase}" if probe.phase else ""
    if probe.outcome is Outcome.OOM_HOST:
        figures = f"host {size(probe.host_peak_bytes)} of {budget_words(host_budget)}"
    else:
        figures = f"{size(probe.peak_bytes)} of {size(budget)}"
    return f"{probe.outcome.value}{where}", figures


def _outcome_words(probe: Probe, study: Study) -> str:
    if probe.outcome in DOES_NOT_FIT:
        return ", ".join(
            over_budget(probe, study.budget_bytes, study.summary.get("host_budget_bytes"))
        )
    return probe.outcome.value


@dataclass
class Change:
    """One configuration probed by either study."""

    config: dict[str, Any]
    before: Probe | None
    after: Probe | None
    regression: str = ""

    @property
    def throughput_change(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        if self.before.outcome is not Outcome.OK or self.after.outcome is not Outcome.OK:
            return None
        return relative(self.before.samples_per_s, self.after.samples_per_s)

    @property
    def peak_change_bytes(self) -> int | None:
        if self.before is None or self.after is None:
            return None
        if self.before.peak_bytes is None or self.after.peak_bytes is None:
            return None
        return self.after.peak_bytes - self.before.peak_bytes

    @property
    def changed(self) -> bool:
        if self.before is None or self.after is None:
            return True
        speed = self.throughput_change
        return (
            self.before.outcome != self.after.outcome
            or self.peak_change_bytes not in (0, None)
            or (speed is not None and abs(speed) > _SAME)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "before": _state(self.before), "after": _state(self.after),
                "peak_change_bytes": self.peak_change_bytes,
                "throughput_change": self.throughput_change, "regression": self.regression}  # fmt: skip


@dataclass
class CombinationChange:
    """One combination at one resolution: its largest fitting batch before and after."""

    knobs: dict[str, Any]
    resolution: int
    before: dict[str, Any] | None  # the summary's combination entry
    after: dict[str, Any] | None
    regression: str = ""

    @staticmethod
    def largest(entry: dict[str, Any] | None) -> int | None:
        return None if entry is None else entry.get("best_batch")

    def to_dict(self) -> dict[str, Any]:
        return {"knobs": self.knobs, "resolution": self.resolution,
                "before": None if self.before is None else {k: self.before[k] for k in ("status", "best_batch", "reason")},
                "after": None if self.after is None else {k: self.after[k] for k in ("status", "best_batch", "reason")},
                "regression": self.regression}  # fmt: skip


@dataclass
class Comparison:
    before: Study
    after: Study
    threshold: float
    configurations: list[Change] = field(default_factory=list)
    combinations: list[CombinationChange] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def study(s: Study) -> dict[str, Any]:
            return {
                "study": s.name,
                "path": str(s.path),
                "budget_bytes": s.budget_bytes,
                "best": s.best,
            }

        return {
            "before": study(self.before),
            "after": study(self.after),
            "threshold": self.threshold,
            "regressed": bool(self.regressions),
            "regressions": self.regressions,
            "configurations": [c.to_dict() for c in self.configurations],
            "combinations": [c.to_dict() for c in self.combinations],
        }


def _probes_by_key(study: Study) -> dict[tuple[Any, ...], Probe]:
    return {p.key(): p for p in study.probes if p.batch_size is not None}


def _fit_regression(change: Change, after_study: Study) -> str:
    before, after = change.before, change.after
    if (
        before is None
        or after is None
        or before.outcome is not Outcome.OK
        or after.outcome is Outcome.OK
    ):
        return ""
    return (
        f"{_words(change.config)} fitted before ({size(before.peak_bytes)}) and does not now "
        f"({_outcome_words(after, after_study)})"
    )


def _speed_regression(change: Change, threshold: float) -> str:
    speed = change.throughput_change
    if speed is None or speed >= -threshold:
        return ""
    assert change.before is not None and change.after is not None
    return (
        f"{_words(change.config)} throughput fell {-speed:.1%} ({change.before.samples_per_s:.3f} -> "
        f"{change.after.samples_per_s:.3f} samples/s), more than the {threshold:.0%} threshold"
    )


def _combination_regression(change: CombinationChange) -> str:
    before, after = change.largest(change.before), change.largest(change.after)
    if (
        before is None
        or change.after is None
        or Status(change.after["status"]) not in (Status.EXACT, Status.NONE_FIT)
    ):
        return ""
    if after is not None and after >= before:
        return ""
    now = f"fits only batch {after}" if after is not None else "fits no batch"
    config = {"resolution": change.resolution, **change.knobs}
    return f"{_words(config)} fitted batch {before} before and {now} now"


def _best_regression(before: Study, after: Study, threshold: float) -> str:
    if before.best is None:
        return ""
    if after.best is None:
        return f"nothing fits now; the best before was {_words(before.best['config'])}"
    speed = relative(before.best["samples_per_s"], after.best["samples_per_s"])
    if speed is not None and speed < -threshold:
        return (
            f"the best configuration's throughput fell {-speed:.1%} "
            f"({before.best['samples_per_s']:.3f} -> {after.best['samples_per_s']:.3f} samples/s), "
            f"more than the {threshold:.0%} threshold"
        )
    return ""


def compare(before: Study, after: Study, threshold: float) -> Comparison:
    """Every configuration and combination of the two studies side by side, and the regressions
    from `before` to `after`."""
    result = Comparison(before, after, threshold)
    old, new = _probes_by_key(before), _probes_by_key(after)
    for key in [*old, *(k for k in new if k not in old)]:
        probe = old.get(key) or new[key]
        change = Change(_config(probe), old.get(key), new.get(key))
        change.regression = _fit_regression(change, after) or _speed_regression(change, threshold)
        result.configurations.append(change)

    fit_lost = {
        (c.after.resolution, knobs_key(c.after.knobs))
        for c in result.configurations
        if c.regression and c.after is not None and c.after.outcome is not Outcome.OK
    }
    old_combos = {(int(c["resolution"]), knobs_key(c["knobs"])): c for c in before.combinations}
    new_combos = {(int(c["resolution"]), knobs_key(c["knobs"])): c for c in after.combinations}
    for key in [*old_combos, *(k for k in new_combos if k not in old_combos)]:
        entry = old_combos.get(key) or new_combos[key]
        change = CombinationChange(
            entry["knobs"], int(entry["resolution"]), old_combos.get(key), new_combos.get(key)
        )
        change.regression = _combination_regression(change)
        result.combinations.append(change)

    result.regressions = [c.regression for c in result.configurations if c.regression]
    result.regressions += [  # a configuration that no longer fits already says it
        c.regression
        for c in result.combinations
        if c.regression and (c.resolution, knobs_key(c.knobs)) not in fit_lost
    ]
    best = _best_regression(before, after, threshold)
    if best:
        result.regressions.append(best)
    return result
