"""What the two charts show, as plain data both renderers draw: the PNGs (plots.py) and the
interactive page (html.py), in the colours `COLOURS`, `PEAK_SCALE` and `SERIES` declare once.

- The Pareto front: samples/s against run size (batch x pixels) for every probe with a throughput,
  memory as colour; fitting runs filled, runs over the GPU's budget as grey crosses, runs that fit
  the GPU but not the host's budget (`oom_host`) as purple pluses, the front as a line per
  resolution, the best run marked.
- Memory, two panels on one memory axis with the GPU's total memory and the budget (the total less
  the margin) drawn across both: every probe's peak against its batch, a line per combination at
  each resolution; and the best run at each resolution as a stacked bar of its peak's parts. The
  axis is set by the GPU and the runs that fit (`memory_axis`): a peak above it (an out-of-memory
  probe far over the card) is drawn at its top as a triangle, marked over, with its figure in words.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofit.records.probe import DOES_NOT_FIT, Outcome
from autofit.report.answer import gpu_memory_bytes
from autofit.report.tables import PARTS, margin_words
from autofit.results import Study
from autofit.units import size
from autofit.units import value as show

PARETO_TITLE = "Pareto front: throughput against run size, memory as colour"
MEMORY_TITLE = "Peak memory: every probe, and the best run (the fastest elsewhere) part by part"
PEAKS_TITLE = "every probe's peak against its batch"
BARS_TITLE = "best run part by part (elsewhere: the fastest)"
RUN_SIZE_AXIS = "run size: batch x pixels per step (megapixels)"
THROUGHPUT_AXIS = "samples/s"
BATCH_AXIS = "batch size"
NOTHING_FITS = "nothing fits the budget"

# The colours of both renderers, by role (matplotlib's tab10 where it has one): plots.py and
# html.py read them here, so the PNGs and the page agree.
COLOURS = {
    "over": "#a6a6a6",  # runs over the GPU's budget
    "over_host": "#9467bd",  # runs that fit the GPU but not the host's budget
    "front": "#d62728",  # the Pareto front
    "best": "#ff7f0e",  # the best run's star
    "total": "#000000",  # the GPU's total memory
    "budget": "#d62728",  # the budget: the total less the margin
}
PEAK_SCALE = "viridis"  # fitting runs' peak, as colour: matplotlib's colormap, plotly's colorscale
# One colour per probe series (combination at a resolution), in turn, and per part of a peak.
SERIES = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]  # fmt: skip
PART_COLOURS = dict(zip((key.replace("_", " ") for key in PARTS),
                        ["#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f"],
                        strict=True))  # fmt: skip
# The runs that do not fit, as both renderers mark them: (legend, colour). matplotlib draws the
# markers as "x" and "P", plotly as "x" and "cross"; a peak above the memory axis, as "^" and
# "triangle-up".
OVER_BUDGET = ("over the budget", COLOURS["over"])
OVER_HOST = ("fits the GPU, over the host budget", COLOURS["over_host"])
OFF_AXIS = "over the budget, peak above the axis (drawn at its top)"


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


@dataclass(frozen=True)
class ParetoView:
    """The Pareto chart's axes, set by the runs that fit alone: a run over a budget far beyond
    them (a batch of 1,000,000 on a wide range) would squash every fitting run into a corner.
    Such a run is drawn at the edge it passes (`shown`); its hover keeps its own figures. With
    nothing fitting there are no limits (None) and every run sets the axes."""

    log: bool
    x: tuple[float, float] | None = None  # megapixels
    y: tuple[float, float] | None = None  # samples/s

    def shown(self, point: Point) -> tuple[float, float]:
        if self.x is None or self.y is None:
            return point.megapixels, point.samples_per_s
        return (min(max(point.megapixels, self.x[0]), self.x[1]),
                min(max(point.samples_per_s, self.y[0]), self.y[1]))  # fmt: skip


def pareto_view(found: list[Point]) -> ParetoView:
    """The axes the fitting runs span, with a margin."""
    fitting = [p for p in found if p.fits]
    if not fitting:
        return ParetoView(log_x(found))
    log = log_x(fitting)
    low, high = min(p.megapixels for p in fitting), max(p.megapixels for p in fitting)
    x = (
        (low / 1.3, high * 1.3)
        if log
        else (low - 0.08 * (high - low or high), high + 0.08 * (high - low or high))
    )
    return ParetoView(log, x, (0.0, 1.1 * max(p.samples_per_s for p in fitting)))


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


def memory_unit(study: Study) -> tuple[str, int]:
    """The memory axis's unit: GiB on a GPU of 4 GiB or more."""
    return ("GiB", 1 << 30) if gpu_memory_bytes(study) >= 4 << 30 else ("MiB", 1 << 20)


def bars(study: Study) -> list[Bar]:
    """The run the answer names at its resolution and the fastest at each other, its peak part
    by part in `memory_unit` (the same runs as the best-per-resolution table)."""
    _, scale = memory_unit(study)
    best = study.best
    found = []
    for resolution, entry in study.chosen_per_resolution().items():
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


# -- memory ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryAxis:
    """The memory axis both panels share, in `unit`: the GPU's total and the budget as lines, and
    the limits. Only the GPU and the runs that fit set `top`; a peak above `clip` is drawn at
    `clip`."""

    unit: str
    scale: int
    total: float
    budget: float
    margin: float  # a share of the total
    top: float
    clip: float

    def total_label(self) -> str:
        return f"GPU memory {size(self.total * self.scale)}"

    def budget_label(self) -> str:
        return (
            f"budget {size(self.budget * self.scale)} (less a {margin_words(self.margin)} margin)"
        )


@dataclass(frozen=True)
class Peak:
    """One probe's peak, as the memory panel draws it."""

    batch_size: int
    peak: float | None  # in the axis's unit; None: an out-of-memory probe that recorded none
    shown: float  # where it is drawn: its peak, or the axis's `clip`
    kind: str  # "fits", "over" (the GPU's budget) or "over_host" (the host's)
    label: str  # the run and its peak, in words
    figure: str  # its peak: "500.00 GiB", or "peak not recorded"

    @property
    def off_axis(self) -> bool:
        return self.peak is None or self.peak > self.shown


@dataclass(frozen=True)
class Series:
    label: str  # the resolution and the knobs
    peaks: list[Peak]  # smallest batch first


def memory_axis(study: Study) -> MemoryAxis:
    unit, scale = memory_unit(study)
    total, budget = gpu_memory_bytes(study) / scale, study.budget_bytes / scale
    fitting = [
        (p.peak_bytes or 0) / scale
        for p in study.probes
        if p.outcome in (Outcome.OK, Outcome.OOM_HOST)
    ]
    ceiling = max([total, budget, *fitting, *(sum(b.parts.values()) for b in bars(study))])
    # The clip line sits between the GPU's total and the axis's top: what is drawn there is over.
    return MemoryAxis(unit, scale, total, budget, float(study.summary.get("margin") or 0.0),
                      top=ceiling * 1.12, clip=ceiling * 1.06)  # fmt: skip


KINDS = {Outcome.OK: "fits", Outcome.OOM: "over", Outcome.OOM_HOST: "over_host"}


def peak_series(study: Study, axis: MemoryAxis) -> list[Series]:
    """Every probe of a batch that fit or went over a budget, by combination at each resolution
    (trials.csv's order); a crash or a timeout has no peak to draw."""
    found: dict[tuple[int, tuple[str, ...]], list[Peak]] = {}
    labels: dict[tuple[int, tuple[str, ...]], str] = {}
    for probe in study.probes:
        kind = KINDS.get(probe.outcome) if isinstance(probe.outcome, Outcome) else None
        if kind is None or not probe.batch_size:
            continue
        knobs = tuple(f"{k}={show(v)}" for k, v in probe.knobs.items())
        key = (probe.resolution, knobs)
        labels[key] = f"{probe.resolution}px " + " ".join(knobs)
        peak = None if probe.peak_bytes is None else probe.peak_bytes / axis.scale
        shown = axis.clip if peak is None or peak > axis.clip else peak
        figure = size(probe.peak_bytes) if probe.peak_bytes else "peak not recorded"
        words = f"peak {figure}" if probe.peak_bytes else figure
        if kind != "fits":
            words += f": {(OVER_HOST if kind == 'over_host' else OVER_BUDGET)[0]}"
        text = f"{_label(probe.resolution, probe.batch_size, probe.knobs)}, {words}"
        found.setdefault(key, []).append(Peak(probe.batch_size, peak, shown, kind, text, figure))
    return [
        Series(labels[key], sorted(peaks, key=lambda p: p.batch_size))
        for key, peaks in found.items()
    ]
