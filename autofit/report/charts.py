"""What the two charts show, as plain data both renderers draw: the PNGs (plots.py) and the
interactive page (html.py).

- The Pareto front: samples/s against run size (batch x pixels) for every probe with a throughput,
  memory as colour; fitting runs filled, runs over the GPU's budget as grey crosses, runs that fit
  the GPU but not the host's budget (`oom_host`) as purple pluses, the front as a line per
  resolution, the best run marked. Both renderers draw the markers below in the same colours.
- The memory breakdown: the best run at each resolution as a stacked bar of its peak's parts
  against the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofit.probe.spec import DOES_NOT_FIT, Outcome
from autofit.report.tables import PARTS
from autofit.results import Study
from autofit.units import value as show

PARETO_TITLE = "Pareto front: throughput against run size, memory as colour"
MEMORY_TITLE = "Peak memory of the best run per resolution, against the budget"
RUN_SIZE_AXIS = "run size: batch x pixels per step (megapixels)"
THROUGHPUT_AXIS = "samples/s"
NOTHING_FITS = "nothing fits the budget"
# The runs that do not fit, as both renderers mark them: (legend, colour). matplotlib draws the
# markers as "x" and "P", plotly as "x" and "cross".
OVER_BUDGET = ("over the budget", "#a6a6a6")
OVER_HOST = ("fits the GPU, over the host budget", "#9467bd")


def log_x(points: list[Point]) -> bool:
    """Run sizes spread over more than a factor of 20 read better on a log axis."""
    return bool(points) and max(p.megapixels for p in points) > 20 * min(
        p.megapixels for p in points
    )


@dataclass(frozen=True)
class Point:
    resolution: int
    batch_size: int
    megapixels: float  # batch x resolution², in millions
    samples_per_s: float
    peak_gib: float
    fits: bool
    label: str
    over_host: bool = False  # fits the GPU but not the host's budget (oom_host)
    host_peak_gib: float | None = None  # None: a study from before autofit counted host memory

    def hover(self) -> str:
        """What a point says of its memory, after its label."""
        host = f", host {self.host_peak_gib:.3f} GiB" if self.host_peak_gib is not None else ""
        verdict = "" if self.fits else f": {(OVER_HOST if self.over_host else OVER_BUDGET)[0]}"
        return f"peak {self.peak_gib:.3f} GiB{host}{verdict}"


@dataclass(frozen=True)
class Bar:
    label: str  # two lines: resolution and batch, then the knobs
    parts: dict[str, float]  # part ("optimizer state") -> memory in `memory_unit`
    best: bool


def _label(resolution: int, batch: int, knobs: dict[str, object], sep: str = " ") -> str:
    return f"{resolution}px b={batch}{sep}" + " ".join(f"{k}={show(v)}" for k, v in knobs.items())


def points(study: Study) -> list[Point]:
    """Every probe that has a throughput: fitting runs and runs over the GPU's or the host's
    budget."""
    found = []
    for probe in study.probes:
        if (
            probe.outcome not in (Outcome.OK, *DOES_NOT_FIT)
            or probe.samples_per_s is None
            or not probe.batch_size
        ):
            continue
        found.append(
            Point(
                resolution=probe.resolution,
                batch_size=probe.batch_size,
                megapixels=probe.batch_size * probe.resolution**2 / 1e6,
                samples_per_s=probe.samples_per_s,
                peak_gib=(probe.peak_bytes or 0) / (1 << 30),
                fits=probe.outcome is Outcome.OK,
                label=_label(probe.resolution, probe.batch_size, probe.knobs),
                over_host=probe.outcome is Outcome.OOM_HOST,
                host_peak_gib=_gib(probe.host_peak_bytes),
            )
        )
    return found


def _gib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / (1 << 30)


def _point(study: Study, entry: dict) -> Point:
    config = entry["config"]
    resolution, batch = int(config["resolution"]), int(config["batch_size"])
    knobs = {k: config[k] for k in study.knob_names if k in config}
    return Point(resolution, batch, batch * resolution**2 / 1e6, entry["samples_per_s"],
                 entry["peak_bytes"] / (1 << 30), True, _label(resolution, batch, knobs),
                 host_peak_gib=_gib(entry.get("host_peak_bytes")))  # fmt: skip


def fronts(study: Study) -> dict[int, list[Point]]:
    """The Pareto front per resolution, smallest run first."""
    by_resolution: dict[int, list[Point]] = {}
    for entry in study.pareto:
        point = _point(study, entry)
        by_resolution.setdefault(point.resolution, []).append(point)
    return {r: sorted(f, key=lambda p: p.megapixels) for r, f in sorted(by_resolution.items())}


def best_point(study: Study) -> Point | None:
    return _point(study, study.best) if study.best else None


def memory_unit(budget_bytes: int) -> tuple[str, int]:
    return ("GiB", 1 << 30) if budget_bytes >= 4 << 30 else ("MiB", 1 << 20)


def bars(study: Study) -> list[Bar]:
    """The best run at each resolution, its peak part by part in `memory_unit`."""
    _, scale = memory_unit(study.budget_bytes)
    best = study.best
    found = []
    for resolution, entry in study.best_per_resolution().items():
        breakdown = entry.get("breakdown") or {}
        config = entry["config"]
        knobs = {k: config[k] for k in study.knob_names if k in config}
        found.append(
            Bar(
                label=_label(resolution, int(config["batch_size"]), knobs, sep="\n"),
                parts={k.replace("_", " "): breakdown[k] / scale for k in PARTS if k in breakdown},
                best=best is not None and best["config"] == config,
            )
        )
    return found
