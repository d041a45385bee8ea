"""The two charts as PNG files, drawn with matplotlib (imported here, never at start-up), in the
colours charts.py declares."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from autofit.report import charts
from autofit.results import Study

MARKERS = "osD^vP<>"
# Each kind of probe on the memory panel: (marker, colour or None for its series' colour).
PEAK_MARKS = {"fits": ("o", None), "over": ("x", charts.COLOURS["over"]),
              "over_host": ("P", charts.COLOURS["over_host"])}  # fmt: skip
# The share of the Pareto figure's height under the plot that holds its legend (up to six rows
# of two entries at fontsize 8 in a 5.5-inch figure).
LEGEND_BAND = 0.2
# A series' line and its legend entry: more series than this are told apart on the page (hover).
LEGEND_SERIES = 10


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def pareto_figure(study: Study) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    points = charts.points(study)
    fitting = [p for p in points if p.fits]
    over = [p for p in points if not p.fits and not p.over_host]
    over_host = [p for p in points if p.over_host]
    view = charts.pareto_view(points)
    for runs, marker, (label, colour) in ((over, "x", charts.OVER_BUDGET),
                                          (over_host, "P", charts.OVER_HOST)):  # fmt: skip
        if runs:
            shown = [view.shown(p) for p in runs]
            ax.scatter([x for x, _ in shown], [y for _, y in shown],
                       marker=marker, color=colour, s=30, label=label, clip_on=False)  # fmt: skip
    if fitting:
        peak = [p.peak_gib for p in fitting]
        dots = ax.scatter([p.megapixels for p in fitting], [p.samples_per_s for p in fitting],
                          c=peak, cmap=charts.PEAK_SCALE, s=30, alpha=0.8, label="fits")  # fmt: skip
        fig.colorbar(dots, ax=ax, label="peak memory (GiB)")
    for i, (resolution, front) in enumerate(charts.fronts(study).items()):
        ax.plot([p.megapixels for p in front], [p.samples_per_s for p in front],
                color=charts.COLOURS["front"], marker=MARKERS[i % len(MARKERS)],
                markerfacecolor="none", markersize=9, label=f"Pareto front, {resolution} px")  # fmt: skip
    best = charts.best_point(study)
    if best is not None:
        ax.scatter([best.megapixels], [best.samples_per_s], marker="*", s=260,
                   color=charts.COLOURS["best"], edgecolors="black", zorder=5,
                   label=f"best: {best.label}")  # fmt: skip
    if not fitting:
        ax.text(0.5, 0.5, charts.NOTHING_FITS, transform=ax.transAxes, ha="center")
    if view.log:
        ax.set_xscale("log")
        # minor ticks' labels (2, 3, ... between decades) crowd into the decades' own
        ax.xaxis.set_minor_formatter(_no_labels())
    if view.x is not None and view.y is not None:
        ax.set_xlim(*view.x)
        ax.set_ylim(*view.y)
    ax.set_xlabel(charts.RUN_SIZE_AXIS)
    ax.set_ylabel(charts.THROUGHPUT_AXIS)
    ax.set_title(f"{study.name}: {charts.PARETO_TITLE}", fontsize=10)
    ax.grid(alpha=0.3)
    if points:  # below the plot: inside it, a legend covers points and the axis label
        fig.legend(fontsize=8, loc="lower center", ncol=2, bbox_to_anchor=(0.5, 0.0))
        fig.tight_layout(rect=(0, LEGEND_BAND, 1, 1))
    else:
        fig.tight_layout()
    return fig


def _no_labels() -> Any:
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def _peaks(ax: Any, study: Study, axis: charts.MemoryAxis) -> None:
    """Every probe's peak against its batch: a line per series, a marker per kind."""
    series = charts.peak_series(study, axis)
    marked: set[str] = set()
    for i, one in enumerate(series):
        colour = charts.SERIES[i % len(charts.SERIES)]
        ax.plot([p.batch_size for p in one.peaks], [p.shown for p in one.peaks], color=colour,
                linewidth=1, alpha=0.6, label=one.label if len(series) <= LEGEND_SERIES else None)  # fmt: skip
        for peak in one.peaks:
            marker, mark_colour = PEAK_MARKS[peak.kind]
            legend = {"over": charts.OVER_BUDGET[0], "over_host": charts.OVER_HOST[0]}.get(
                peak.kind
            )
            if peak.off_axis:
                marker, legend = "^", charts.OFF_AXIS
                ax.annotate(peak.figure, (peak.batch_size, peak.shown), xytext=(5, -3),
                            textcoords="offset points", fontsize=6)  # fmt: skip
            ax.scatter([peak.batch_size], [peak.shown], marker=marker, s=36, zorder=4,
                       color=mark_colour or colour,
                       label=legend if legend and legend not in marked else None)  # fmt: skip
            if legend:
                marked.add(legend)
    if not series:
        ax.text(0.5, 0.5, "no probe recorded a peak", transform=ax.transAxes, ha="center")
    ax.set_xlabel(charts.BATCH_AXIS)
    ax.set_title(charts.PEAKS_TITLE, fontsize=9)


def _bars(ax: Any, study: Study) -> None:
    """The best run at each resolution as a stacked bar of its peak's parts."""
    bars = charts.bars(study)
    drawn: set[str] = set()
    for column, bar in enumerate(bars):
        bottom = 0.0
        for part, amount in bar.parts.items():
            ax.bar(column, amount, bottom=bottom, color=charts.PART_COLOURS[part],
                   label=part if part not in drawn else None)  # fmt: skip
            drawn.add(part)
            bottom += amount
    labels = ["\n".join(textwrap.wrap(("* " if b.best else "") + b.label, 26)) for b in bars]
    ax.set_xticks(range(len(bars)), labels, fontsize=7)
    if not bars:
        ax.text(0.5, 0.5, charts.NOTHING_FITS, transform=ax.transAxes, ha="center")
    ax.set_title(charts.BARS_TITLE, fontsize=9)


def memory_figure(study: Study) -> Any:
    plt = _pyplot()
    axis = charts.memory_axis(study)
    fig, (peaks, bars) = plt.subplots(1, 2, sharey=True, figsize=(12, 6), dpi=120,
                                      gridspec_kw={"width_ratios": [3, 2]})  # fmt: skip
    _peaks(peaks, study, axis)
    _bars(bars, study)
    for ax in (peaks, bars):
        ax.axhline(axis.total, color=charts.COLOURS["total"], linewidth=1.2,
                   label=axis.total_label() if ax is peaks else None)  # fmt: skip
        ax.axhline(axis.budget, color=charts.COLOURS["budget"], linestyle="--", linewidth=1.2,
                   label=axis.budget_label() if ax is peaks else None)  # fmt: skip
        ax.grid(alpha=0.3, axis="y")
    peaks.set_ylim(0, axis.top)  # shared: the GPU and the runs that fit set it, never an oom
    peaks.set_ylabel(f"memory ({axis.unit})")
    fig.suptitle(f"{study.name}: {charts.MEMORY_TITLE}", fontsize=10)
    fig.legend(fontsize=7, loc="lower center", ncol=3, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    return fig


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def write_pngs(study: Study, out: Path) -> list[Path]:
    return [_save(pareto_figure(study), out / "pareto.png"),
            _save(memory_figure(study), out / "memory.png")]  # fmt: skip
