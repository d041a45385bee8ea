"""The two charts as PNG files, drawn with matplotlib (imported here, never at start-up)."""

from __future__ import annotations

from pathlib import Path

from autofit.report import charts
from autofit.results import Study

MARKERS = "osD^vP<>"


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def pareto_png(study: Study, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    points = charts.points(study)
    fitting = [p for p in points if p.fits]
    over = [p for p in points if not p.fits and not p.over_host]
    over_host = [p for p in points if p.over_host]
    for runs, marker, (label, colour) in ((over, "x", charts.OVER_BUDGET),
                                          (over_host, "P", charts.OVER_HOST)):  # fmt: skip
        if runs:
            ax.scatter([p.megapixels for p in runs], [p.samples_per_s for p in runs],
                       marker=marker, color=colour, s=30, label=label)  # fmt: skip
    if fitting:
        peak = [p.peak_gib for p in fitting]
        dots = ax.scatter([p.megapixels for p in fitting], [p.samples_per_s for p in fitting],
                          c=peak, cmap="viridis", s=30, alpha=0.8, label="fits")  # fmt: skip
        fig.colorbar(dots, ax=ax, label="peak memory (GiB)")
    for i, (resolution, front) in enumerate(charts.fronts(study).items()):
        ax.plot([p.megapixels for p in front], [p.samples_per_s for p in front], color="C3",
                marker=MARKERS[i % len(MARKERS)], markerfacecolor="none", markersize=9,
                label=f"Pareto front, {resolution} px")  # fmt: skip
    best = charts.best_point(study)
    if best is not None:
        ax.scatter([best.megapixels], [best.samples_per_s], marker="*", s=260, color="C1",
                   edgecolors="black", zorder=5, label=f"best: {best.label}")  # fmt: skip
    if not fitting:
        ax.text(0.5, 0.5, charts.NOTHING_FITS, transform=ax.transAxes, ha="center")
    if charts.log_x(points):
        ax.set_xscale("log")
    ax.set_xlabel(charts.RUN_SIZE_AXIS)
    ax.set_ylabel(charts.THROUGHPUT_AXIS)
    ax.set_title(f"{study.name}: {charts.PARETO_TITLE}", fontsize=10)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def memory_png(study: Study, path: Path) -> Path:
    plt = _pyplot()
    unit, scale = charts.memory_unit(study.budget_bytes)
    bars = charts.bars(study)
    fig, ax = plt.subplots(figsize=(9, 1.8 + 0.8 * max(1, len(bars))), dpi=120)
    for row, bar in enumerate(bars):
        left = 0.0
        for i, (part, amount) in enumerate(bar.parts.items()):
            ax.barh(row, amount, left=left, color=f"C{i}", label=part if row == 0 else None)
            left += amount
    ax.axvline(study.budget_bytes / scale, color="black", linestyle="--", label="budget")
    ax.set_yticks(range(len(bars)), [("* " if b.best else "") + b.label for b in bars], fontsize=8)
    if not bars:
        ax.text(0.5, 0.5, charts.NOTHING_FITS, transform=ax.transAxes, ha="center")
        ax.set_yticks([])
    ax.set_xlabel(f"memory ({unit})")
    ax.set_title(f"{study.name}: {charts.MEMORY_TITLE}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_pngs(study: Study, out: Path) -> list[Path]:
    return [pareto_png(study, out / "pareto.png"), memory_png(study, out / "memory.png")]
