"""`autofit report` end to end on a real (tiny) study: its tables and files, the HTML page rendered
in headless Chromium, comparison with another study for nightly jobs, and the optuna-dashboard on
the default storage."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import wsgiref.util
from pathlib import Path
from typing import Any

import pytest
from chromium import find_chromium, open_page
from helpers import autofit, in_process

from autofit.calibration.margins import load_figures, load_margins
from autofit.calibration.rows import percent
from autofit.gpus import load_gpu
from autofit.probe.summary import headroom, provenance
from autofit.report import charts
from autofit.report.answer import answer, published_words
from autofit.report.changes import compare
from autofit.report.tables import config_words, host_cell
from autofit.results import load_study
from autofit.units import size

# Its fixtures run whole searches: the module is of the long group (pyproject.toml).
pytestmark = pytest.mark.long

# Two resolutions: at 64 px every batch fits (so checkpointing is pruned), at 256 px the budget
# stops the batch (oom); bf16 cannot run on a T4 (invalid). A 96.3% margin leaves a T4 ~568 MiB.
SPACE = """
batch_size: {min: 1, max: 16}
resolution: [64, 256]
knobs:
  precision: [fp16, bf16]
  optimizer: [adamw]
  checkpointing: [false, true]
target: {resolution: 256, min_batch: 1}
"""
STUDY = "tiny_sana-t4-report"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one real study, searched once for the whole module."""
    cwd = tmp_path_factory.mktemp("report")
    (cwd / "space.yaml").write_text(SPACE)
    done = autofit("search", "model=tiny_sana", "gpu=t4", "space=space.yaml", "margin=0.963",
                   f"study={STUDY}", cwd=cwd)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cwd


# Activations offloaded to pinned host memory grow with the batch; a 0.05 GiB host budget stops
# fp16 at a batch of about 6 and fp32 at about 3, while the T4 holds every batch of the space: the
# batches above are oom_host, never oom.
HOST_SPACE = """
batch_size: {min: 1, max: 16}
resolution: [256]
knobs:
  precision: [fp16, fp32]
  offload_activations: [cpu]
target: {resolution: 256, min_batch: 1}
"""
HOST_STUDY = "tiny_sana-t4-host"
HOST_BUDGET = int(0.05 * (1 << 30))


@pytest.fixture(scope="module")
def host_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one real study searched under a host budget, with its report written."""
    cwd = tmp_path_factory.mktemp("host")
    (cwd / "space.yaml").write_text(HOST_SPACE)
    done = autofit("search", "model=tiny_sana", "gpu=t4", "space=space.yaml",
                   "host_memory_gib=0.05", f"study={HOST_STUDY}", cwd=cwd)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cwd


@pytest.fixture(scope="module")
def reported(workdir: Path) -> subprocess.CompletedProcess[str]:
    done = autofit("report", cwd=workdir)  # the latest study: the only one
    assert done.returncode == 0, done.stderr
    return done


def test_the_report_shows_the_front_the_best_its_memory_and_why_others_lost(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    out = reported.stdout
    summary = json.loads((workdir / "results" / STUDY / "summary.json").read_text())
    best = summary["best"]["config"]
    assert "Pareto front" in out and "best configuration per resolution" in out
    assert f"best: batch_size={best['batch_size']} resolution=256" in out
    for part in ("parameters", "gradients", "optimizer state", "activations", "overhead", "budget"):
        assert re.search(rf"^{part}\b", out, re.M), part
    losers = out[out.index("why the others lost") :]
    assert re.search(r"invalid .*bf16.*T4", losers)  # invalid, and why
    assert re.search(r"pruned .*checkpointing=false already fits batch 16", losers)
    assert re.search(r"batch \d+: oom in (forward|backward|optimizer) \(", losers)  # and where
    report = workdir / "results" / STUDY / "report"
    assert (report / "report.txt").read_text().strip() == out[: out.index("\nreport in")].strip()
    for png in ("pareto.png", "memory.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"report in results/{STUDY}/report/" in out


def test_the_charts_and_tables_show_the_best_run_where_the_rule_chose_a_lighter_one(
    workdir: Path,
) -> None:
    """Where the best rule takes a lighter run than the fastest (a little speed for headroom),
    the memory chart's bar and the best-per-resolution table at that resolution are the best
    run, marked so, not the fastest beside it (issue 41 item 5)."""
    from autofit.report.tables import best_table

    study = load_study(workdir / "results" / STUDY)
    resolution, fastest = next(iter(study.fastest_per_resolution().items()))
    # a lighter run beside the fastest: one sample less, a little slower
    config = {**fastest["config"], "batch_size": fastest["config"]["batch_size"] - 1}
    lighter = {**fastest, "config": config, "samples_per_s": fastest["samples_per_s"] * 0.98}
    summary = {**study.summary, "best": lighter, "pareto": [*study.pareto, lighter]}
    chosen = dataclasses.replace(study, summary=summary)
    assert chosen.fastest_per_resolution()[resolution] == fastest
    (bar,) = [b for b in charts.bars(chosen) if b.label.startswith(f"{resolution}px ")]
    assert bar.best and bar.label.startswith(
        f"{resolution}px b={lighter['config']['batch_size']}\n"
    )
    row = next(r for r in best_table(chosen).rows if r[0] == str(resolution))
    assert row[1] == str(lighter["config"]["batch_size"]) and row[-1] == "<- best"


def _box(out: str) -> list[str]:
    """The answer's box, as the report prints it first: its lines, up to its closing rule."""
    lines = out.splitlines()
    assert lines[0].startswith("+-- the answer: "), out[:300]
    return lines[: next(i for i, line in enumerate(lines) if re.fullmatch(r"\+-+", line)) + 1]


def _flat(box: list[str]) -> str:
    """The box's words with its frame and wrapping taken out."""
    return " ".join(" ".join(line.lstrip("|").split()) for line in box[1:-1])


def test_the_answer_comes_first_with_the_best_run_its_headroom_export_command_and_trust(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    out = reported.stdout
    study = load_study(workdir / "results" / STUDY)
    best, budget = study.best, study.budget_bytes
    assert best is not None
    box = _box(out)
    assert out.index("Pareto front") > len("\n".join(box))  # the answer, then the tables
    words = config_words(best["config"], study.knob_names)
    assert f"| best run  {words}" in box
    peak = best["peak_bytes"]
    assert f"peak {size(peak)}: {headroom(peak, budget)}" in _flat(box)
    assert size(budget - peak) in headroom(peak, budget)
    total = load_gpu("t4").memory_bytes
    assert f"budget {size(budget)}: the GPU's {size(total)} less a 96.3% margin" in _flat(box)
    # A command to copy whole: it exports the best run once TARGET is named.
    (export,) = [line for line in box if line.startswith("| export")]
    command = export.removeprefix("| export").strip()
    assert command == f"autofit export study={STUDY} target=TARGET"
    # the targets that can train a Sana model: kohya has no Sana script
    assert "TARGET: accelerate, deepspeed, simpletuner, sana, diffusers, hydra" in _flat(box)
    exported = in_process(*shlex.split(command.replace("TARGET", "hydra"))[1:], cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    assert f" of {STUDY} for hydra to " in exported.stdout
    # Every probe of this study was simulated: the published comparison says how far to trust it.
    assert f"trust simulated: {published_words()}" in _flat(box)

    page = (workdir / "results" / STUDY / "report" / "report.html").read_text()
    assert page.index('id="answer"') < page.index('id="pareto"') < page.index('id="memory"')
    panel = page[page.index('id="answer"') : page.index("</div>", page.index('id="answer"'))]
    assert headroom(peak, budget) in panel and f"<code>{command}</code>" in panel
    assert published_words() in panel


def test_the_trust_line_says_measured_for_probes_on_the_gpu_and_counts_a_mix(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    study = load_study(workdir / "results" / STUDY)
    probed = [p for p in study.probes if p.backend]
    assert probed and {p.backend for p in probed} == {"simulate"}

    def trust(probes: list) -> str:
        lines = answer(dataclasses.replace(study, probes=probes)).lines
        return next(line.words for line in lines if line.label == "trust")

    measured = trust([dataclasses.replace(p, backend="cuda") if p.backend else p
                      for p in study.probes])  # fmt: skip
    assert measured.startswith(f"{provenance('cuda')}: real steps on the GPU")
    assert "simulated" not in measured and published_words() not in measured
    mixed = trust([dataclasses.replace(probed[0], backend="cuda"), *probed[1:]])
    assert mixed.startswith(f"simulated ({len(probed) - 1} of {len(probed)} probes): ")
    assert f"; {provenance('cuda')}: " in mixed


def test_the_readme_states_the_published_figures_the_trust_line_gives() -> None:
    """The trust line's figures are those calibration/margins.yaml keeps (what `autofit calibrate
    set=published` found); the README's first screen states the same, held-out runs first, and
    docs/accuracy.md each class's margin."""
    root = Path(__file__).parents[1]
    readme = " ".join((root / "README.md").read_text().split())
    accuracy = " ".join((root / "docs" / "accuracy.md").read_text().split())
    figures = load_figures()
    held, every = figures["held_out"], figures["all"]
    assert every["false_fits"] == 0
    for words in (
        f"Against the {held['figures']} runs with a memory figure that were held out from building it",
        f"within a median {held['median_abs']:.1%} of it (at most {held['max_abs']:.1%}, on average "
        f"{held['mean_signed']:+.1%})",
        f"against all {every['figures']}, a median {every['median_abs']:.1%}",
        f"{every['verdicts']} fit verdicts ({every['false_fits']} false fits, "
        f"{every['false_ooms']} false out-of-memory)",
    ):
        assert words in readme, words
    # The accuracy page's margins section holds each class's row as calibration/margins.yaml has it.
    for name, c in load_margins().items():
        row = f"| {name} | {c.runs} | {c.held_out} | {percent(c.median_abs_error)} | {percent(c.worst_under)} | {percent(c.margin)} |"
        assert row in accuracy, row


def _far_over(study, gib: int = 500):  # type: ignore[no-untyped-def]
    """The study with each out-of-memory probe's peak at `gib` GiB, far over a T4's 15."""
    probes = [dataclasses.replace(p, peak_bytes=gib << 30) if p.outcome.value == "oom" else p
              for p in study.probes]  # fmt: skip
    return dataclasses.replace(study, probes=probes)


def test_an_out_of_memory_run_far_beyond_the_fitting_ones_does_not_set_the_pareto_axes(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    """A run over the budget at a batch of 1,000,000 (a wide range's probe) sits at the edge the
    fitting runs set, in the PNG and on the page; its hover keeps its figures."""
    from autofit.report.html import _pareto_figure
    from autofit.report.plots import pareto_figure

    study = load_study(workdir / "results" / STUDY)
    over = next(p for p in study.probes if p.outcome.value == "oom")
    huge = dataclasses.replace(over, batch_size=1_000_000, samples_per_s=1e6)
    wide = dataclasses.replace(study, probes=[*study.probes, huge])
    view = charts.pareto_view(charts.points(study))
    assert view is not None and charts.pareto_view(charts.points(wide)) == view
    fitting = [p for p in charts.points(study) if p.fits]
    assert view.x[1] < 2 * max(p.megapixels for p in fitting)
    assert view.y[1] == pytest.approx(1.1 * max(p.samples_per_s for p in fitting))

    ax = pareto_figure(wide).axes[0]
    assert ax.get_xlim() == pytest.approx(view.x) and ax.get_ylim() == pytest.approx(view.y)
    edge = [c for c in ax.collections if (view.x[1], view.y[1]) in map(tuple, c.get_offsets())]
    assert len(edge) == 1

    page = _pareto_figure(wide)
    expected_x = [math.log10(v) for v in view.x] if view.log else list(view.x)
    assert list(page.layout.xaxis.range) == pytest.approx(expected_x)
    assert list(page.layout.yaxis.range) == pytest.approx(list(view.y))
    over_trace = next(t for t in page.data if t.name == charts.OVER_BUDGET[0])
    assert max(over_trace.x) == pytest.approx(view.x[1]) and max(over_trace.y) == view.y[1]
    assert any("b=1000000" in text for text in over_trace.text)


def test_an_out_of_memory_peak_far_over_the_card_does_not_set_the_memory_axis(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    from autofit.report.html import _memory_figure
    from autofit.report.plots import memory_figure

    study = load_study(workdir / "results" / STUDY)
    far = _far_over(study)
    over = [p for p in far.probes if p.outcome.value == "oom"]
    assert over
    axis = charts.memory_axis(study)
    assert charts.memory_axis(far) == axis  # the GPU and the runs that fit set it
    assert (axis.unit, axis.total) == ("GiB", load_gpu("t4").memory_bytes / (1 << 30))
    assert axis.budget == study.budget_bytes / (1 << 30)
    assert axis.total < axis.clip < axis.top < 20  # GiB: nowhere near 500
    clipped = [p for s in charts.peak_series(far, axis) for p in s.peaks if p.off_axis]
    assert len(clipped) == len(over)
    assert all(p.shown == axis.clip and p.figure == "500.00 GiB" for p in clipped)

    # The PNG: the axis is the same, the total and the budget drawn across both panels, each far
    # peak drawn as a triangle at the clip line and labelled with its figure.
    fig = memory_figure(far)
    peaks, bars = fig.axes[:2]
    assert peaks.get_ylim() == pytest.approx((0, axis.top))
    for ax in (peaks, bars):
        flat = {round(float(line.get_ydata()[0]), 9) for line in ax.lines
                if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2}  # fmt: skip
        assert {round(axis.total, 9), round(axis.budget, 9)} <= flat
    at_clip = [c for c in peaks.collections if c.get_offsets()[0][1] == pytest.approx(axis.clip)]
    assert len(at_clip) == len(over)
    assert {t.get_text() for t in peaks.texts} == {"500.00 GiB"}
    labels = set(peaks.get_legend_handles_labels()[1])
    assert {axis.total_label(), axis.budget_label(), charts.OFF_AXIS} <= labels
    assert axis.budget_label() == f"budget {size(study.budget_bytes)} (less a 96.3% margin)"

    # The page: the same axis, lines and clip.
    page = _memory_figure(far)
    assert list(page.layout.yaxis.range) == pytest.approx([0, axis.top])
    drawn = [y for trace in page.data if trace.type == "scatter" for y in trace.y]
    assert max(drawn) == pytest.approx(axis.clip)
    assert {round(s.y0, 9) for s in page.layout.shapes} == {
        round(axis.total, 9),
        round(axis.budget, 9),
    }
    symbols = [s for trace in page.data if trace.type == "scatter" for s in trace.marker.symbol]
    assert symbols.count("triangle-up") == len(over)


def _png_colours(fig) -> set[str]:  # type: ignore[no-untyped-def]
    """The colours a matplotlib figure draws its data in (not those a colormap gives)."""
    from matplotlib.colors import to_hex

    found = set()
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        found |= {to_hex(line.get_color()) for line in ax.lines}
        for dots in ax.collections:
            if dots.get_array() is None:
                found |= {to_hex(c) for c in dots.get_facecolors()}
        found |= {to_hex(patch.get_facecolor()) for patch in ax.patches}
    return found


def _page_colours(fig) -> set[str]:  # type: ignore[no-untyped-def]
    """The colours a plotly figure draws its data in (not those a colorscale gives)."""
    from matplotlib.colors import to_hex

    found = set()
    for trace in fig.data:
        colours = trace.marker.color
        for colour in colours if isinstance(colours, (list, tuple)) else [colours]:
            if isinstance(colour, str):
                found.add(to_hex(colour))
        if trace.type == "scatter" and "lines" in trace.mode:
            found.add(to_hex(trace.line.color))
    found |= {to_hex(shape.line.color) for shape in fig.layout.shapes}
    return found


@pytest.mark.parametrize("chart", ["pareto", "memory"])
def test_the_png_and_the_page_draw_in_the_same_declared_colours(
    workdir: Path, reported: subprocess.CompletedProcess[str], chart: str
) -> None:
    from autofit.report import html, plots

    study = _far_over(load_study(workdir / "results" / STUDY))
    png = getattr(plots, f"{chart}_figure")(study)
    page = getattr(html, f"_{chart}_figure")(study)
    declared = {*charts.COLOURS.values(), *charts.SERIES, *charts.PART_COLOURS.values()}
    assert _png_colours(png) == _page_colours(page) <= declared
    assert charts.COLOURS["over"] in _png_colours(png)  # the study has runs over the budget
    if chart == "pareto":
        from matplotlib.colors import to_hex

        # The runs that fit take their colour from one scale: its stops, as both draw them.
        (mapped,) = [c for c in png.axes[0].collections if c.get_array() is not None]
        (fitting,) = [t for t in page.data if t.name == "fits"]
        stops = fitting.marker.colorscale
        assert [to_hex(mapped.get_cmap()(at)) for at, _ in stops] == [c for _, c in stops]
    else:
        assert {charts.COLOURS["total"], charts.COLOURS["budget"]} <= _page_colours(page)


def test_the_page_lists_every_probe_one_row_per_trial(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    page = (workdir / "results" / STUDY / "report" / "report.html").read_text()
    section = page[page.index("<h2>every probe") :]
    body = section[section.index("<tbody>") : section.index("</tbody>")]
    rows = re.findall(r"<tr>(.*?)</tr>", body)
    trials = _trials(workdir / "results" / STUDY)
    assert len(rows) == len(trials) and len(trials) > 5
    for row, trial in zip(rows, trials, strict=True):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        assert cells[0] == trial["resolution"] and cells[1] == (trial["batch_size"] or "-")
        assert trial["outcome"] in cells
        if trial["backend"]:  # with where its figures come from: simulate (traced), ...
            assert f"{trial['backend']} ({trial['source']})" in cells
            assert trial["source"] in ("traced", "replayed")
            assert size(int(trial["peak_bytes"])) in cells


@pytest.mark.parametrize(("field", "value"), [("model", "tiny_mlp"), ("gpu", "a40")])
def test_compare_across_models_or_gpus_warns_and_strict_refuses_before_writing(
    workdir: Path, reported: subprocess.CompletedProcess[str], tmp_path: Path, field: str,
    value: str,
) -> None:  # fmt: skip
    other = tmp_path / "other"
    shutil.copytree(
        workdir / "results" / STUDY, other, ignore=shutil.ignore_patterns("report", "export")
    )
    summary = json.loads((other / "summary.json").read_text())
    summary[field] = value
    (other / "summary.json").write_text(json.dumps(summary))
    theirs = f"{summary['model']} on {summary['gpu']}"

    warned = in_process("report", f"study={STUDY}", f"compare={other}",
                        f"out={tmp_path / 'warned'}", cwd=workdir)  # fmt: skip
    assert warned.returncode == 0, warned.stderr
    (line,) = warned.stderr.splitlines()
    assert line.startswith(f"autofit: warning: compare={other} is a study of {theirs} and ")
    assert "tiny_sana on t4" in line and "strict=true" in line
    assert (tmp_path / "warned" / "compare.json").exists()

    strict = in_process("report", f"study={STUDY}", f"compare={other}", "strict=true",
                        f"out={tmp_path / 'strict'}", cwd=workdir)  # fmt: skip
    assert strict.returncode == 2 and strict.stdout == ""
    (line,) = strict.stderr.splitlines()
    assert line.startswith(f"autofit: error: compare={other} is a study of {theirs}")
    assert "strict=true compares studies of one model on one GPU only" in line
    assert not (tmp_path / "strict").exists()  # nothing written, not even the report

    same = in_process("report", f"study={STUDY}", f"compare={STUDY}", "strict=true",
                      f"out={tmp_path / 'same'}", cwd=workdir)  # fmt: skip
    assert same.returncode == 0 and same.stderr == "", same.stderr


def test_a_strict_that_is_not_true_or_false_is_one_line(workdir: Path) -> None:
    done = in_process("report", f"study={STUDY}", "strict=maybe", cwd=workdir)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "autofit: error: strict='maybe' is not valid; expected true or false\n"


def test_study_and_from_name_the_same_folder(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    by_name = autofit("report", f"study={STUDY}", cwd=workdir)
    by_folder = autofit("report", f"from=results/{STUDY}", "out=elsewhere", cwd=workdir)
    assert by_name.returncode == by_folder.returncode == 0, by_name.stderr + by_folder.stderr
    assert by_name.stdout == reported.stdout
    assert (workdir / "elsewhere" / "report.html").exists()


@pytest.mark.skipif(
    find_chromium() is None and not Path("/etc/debian_version").exists(),
    reason="needs Chromium; .ci/run installs Debian's package",
)
def test_the_html_page_renders_both_charts_offline_with_no_console_error(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    page = workdir / "results" / STUDY / "report" / "report.html"
    text = page.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", text)  # every script inlined: works offline
    assert "<table>" in text and "why the others lost" in text
    rendered = open_page(
        page,
        {
            # plotly draws each point of a scatter, and each bar, as a path.point
            "pareto_points": "document.querySelectorAll('#pareto .scatterlayer .point').length",
            "memory_bars": "document.querySelectorAll('#memory .barlayer .point').length",
            # the memory chart's labels (its two panels' titles, the GPU's total, the budget) as
            # drawn, "count:overlaps"
            "labels": OVERLAPS.replace("SELECTOR", "#memory .annotation"),
        },
    )
    assert rendered.errors == []
    assert rendered.values["pareto_points"] > 0 and rendered.values["memory_bars"] > 0, rendered
    assert rendered.values["labels"] == "4:0", rendered  # all drawn, none over another


# Of the elements a selector finds, how many, and how many pairs of their boxes overlap.
OVERLAPS = """(() => {
  const r = [...document.querySelectorAll('SELECTOR')].map(e => e.getBoundingClientRect());
  if (!r.length) return '';  // not drawn yet: open_page asks again
  let bad = 0;
  for (let i = 0; i < r.length; i++) for (let j = i + 1; j < r.length; j++) {
    const a = r[i], b = r[j];
    if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) bad++;
  }
  return r.length + ':' + bad;
})()"""


def _overlap(a: Any, b: Any) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)


def test_the_pngs_keep_their_legends_off_the_plots_and_their_labels_apart(workdir: Path) -> None:
    """pareto.png and memory.png as drawn at their default size: each legend clear of every
    plot area and axis label, and no two tick labels of an axis over one another (issue 41
    item 5: the legend hid the y axis' label and points, a log axis' labels collided)."""
    from autofit.report.plots import memory_figure, pareto_figure

    study = load_study(workdir / "results" / STUDY)
    for figure in (pareto_figure(study), memory_figure(study)):
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        legends = [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend())]
        assert legends
        for ax in figure.axes:
            if ax.get_label() == "<colorbar>":
                continue
            labels = [ax.xaxis.label, ax.yaxis.label]
            for legend in legends:
                box = legend.get_window_extent(renderer)
                assert not _overlap(box, ax.get_window_extent(renderer)), ax.get_title()
                for label in labels:
                    if label.get_text():
                        assert not _overlap(box, label.get_window_extent(renderer))
            ticks = [
                t for t in ax.get_xticklabels(which="both") if t.get_visible() and t.get_text()
            ]
            boxes = [t.get_window_extent(renderer) for t in ticks]
            for i, a in enumerate(boxes):
                assert not any(_overlap(a, b) for b in boxes[i + 1 :]), [
                    t.get_text() for t in ticks
                ]


def _slower_copy(source: Path, target: Path, factor: float) -> None:
    """A copy of a results folder whose fitting probes ran at `factor` times the throughput."""
    shutil.copytree(source, target)
    rows = list(csv.DictReader((source / "trials.csv").open()))
    for row in rows:
        if row["samples_per_s"]:
            row["samples_per_s"] = str(float(row["samples_per_s"]) * factor)
    with (target / "trials.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = json.loads((source / "summary.json").read_text())
    for point in [summary["best"], *summary["pareto"]]:
        point["samples_per_s"] *= factor
    (target / "summary.json").write_text(json.dumps(summary))


def test_compare_with_an_unchanged_study_passes(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    done = autofit("report", f"compare={STUDY}", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert (
        "no regression against" in done.stdout
        and "best configuration before and after" in done.stdout
    )
    result = json.loads((workdir / "results" / STUDY / "report" / "compare.json").read_text())
    assert result["regressed"] is False and result["regressions"] == []
    assert all(c["regression"] == "" for c in result["configurations"])


def test_compare_fails_a_nightly_job_when_throughput_falls_past_the_threshold(
    workdir: Path, reported: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    tonight = tmp_path / "tonight"
    _slower_copy(workdir / "results" / STUDY, tonight, 0.85)  # 15% slower
    failed = autofit("report", f"from={tonight}", f"compare={STUDY}", cwd=workdir)
    assert failed.returncode == 1, failed.stderr
    error = failed.stderr.strip().splitlines()
    assert len(error) == 1 and "Traceback" not in failed.stderr
    assert (
        error[0].startswith("autofit: error: regression against results/") and "15.0%" in error[0]
    )
    result = json.loads((tonight / "report" / "compare.json").read_text())
    speeds = [
        c["throughput_change"] for c in result["configurations"] if c["after"]["outcome"] == "ok"
    ]
    assert speeds and all(abs(s + 0.15) < 1e-9 for s in speeds)
    assert "-15.0%" in failed.stdout and "REGRESSION" in failed.stdout

    lenient = autofit("report", f"from={tonight}", f"compare={STUDY}", "threshold=0.2", cwd=workdir)
    assert lenient.returncode == 0, lenient.stderr


def test_compare_fails_when_a_configuration_that_fitted_no_longer_fits(
    workdir: Path, reported: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """Last night a batch fitted that tonight runs out of memory: the nightly job must fail."""
    tonight_dir = workdir / "results" / STUDY
    last_night = tmp_path / "last_night"
    shutil.copytree(tonight_dir, last_night)
    rows = list(csv.DictReader((last_night / "trials.csv").open()))
    oom = next(r for r in rows if r["outcome"] == "oom")
    oom["outcome"] = "ok"  # as if it had fitted before
    with (last_night / "trials.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    done = autofit("report", f"study={STUDY}", f"compare={last_night}", cwd=workdir)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert (
        f"batch {oom['batch_size']} " in line and "fitted before" in line and "does not now" in line
    )
    assert f"oom in {oom['phase']}" in line


def test_compare_flags_a_combination_whose_largest_batch_fell_or_a_best_that_vanished(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    study = load_study(workdir / "results" / STUDY)
    before = load_study(workdir / "results" / STUDY)
    exact = next(c for c in before.combinations if c["status"] == "exact")
    exact["best_batch"] += 3  # before, it fitted a larger batch, never probed tonight
    result = compare(before, study, threshold=0.1)
    assert [r for r in result.regressions if "fitted batch" in r and "fits only batch" in r]

    study.summary["best"] = None
    assert "nothing fits now" in compare(load_study(study.path), study, 0.1).regressions[-1]


def test_the_report_command_imports_nothing_heavy_until_it_runs() -> None:
    heavy = ("torch", "matplotlib", "plotly", "optuna", "pandas")
    code = f"import sys, autofit.cli, autofit.commands.report; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_dashboard_opens_the_default_storage(
    workdir: Path, reported: subprocess.CompletedProcess[str]
) -> None:
    """`optuna-dashboard sqlite:///results/studies.db`, as the README says: its WSGI app, queried
    in-process, lists the study and every trial of it."""
    dashboard = pytest.importorskip("optuna_dashboard")
    app = dashboard.wsgi(f"sqlite:///{workdir / 'results' / 'studies.db'}")

    def get(path: str) -> dict:
        environ = {"PATH_INFO": path}
        wsgiref.util.setup_testing_defaults(environ)
        status: list[str] = []
        body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:300])
        return json.load(io.BytesIO(body))

    studies = {s["study_name"]: s for s in get("/api/studies")["study_summaries"]}
    assert STUDY in studies
    detail = get(f"/api/studies/{studies[STUDY]['study_id']}")
    summary = json.loads((workdir / "results" / STUDY / "summary.json").read_text())
    probes = [t for t in detail["trials"] if t["state"] in ("Complete", "Fail")]
    assert len(probes) == summary["n_probes"]
    assert any(t["state"] == "Pruned" for t in detail["trials"])
    assert detail["best_trials"]  # the two-objective front


@pytest.mark.skipif(
    find_chromium() is None and not Path("/etc/debian_version").exists(),
    reason="needs Chromium; .ci/run installs Debian's package",
)
def test_the_browser_check_sees_console_errors_and_failed_loads(tmp_path: Path) -> None:
    """So that an empty error list above means something."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<div id="x"></div><script>console.error("boom"); notDefined();</script>'
        '<img src="missing.png">'
    )
    rendered = open_page(page, {"ready": "!!document.getElementById('x')"})
    assert rendered.values["ready"] is True
    text = "\n".join(rendered.errors)
    assert "boom" in text and "notDefined" in text and "missing.png" in text, text


def _study_line(out: str) -> str:
    """The line after the answer's box that names the study, its GPU and its budgets."""
    return next(line for line in out.splitlines() if line.startswith("study "))


def _trials(folder: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((folder / "trials.csv").open()))


def _rewrite_trials(folder: Path, rows: list[dict[str, str]], columns: list[str]) -> None:
    with (folder / "trials.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def test_a_run_over_the_host_budget_is_reported_as_oom_host_and_never_on_the_front(
    host_workdir: Path,
) -> None:
    done = autofit("report", f"study={HOST_STUDY}", cwd=host_workdir)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    folder = host_workdir / "results" / HOST_STUDY
    rows = _trials(folder)
    over_host = [r for r in rows if r["outcome"] == "oom_host"]
    assert over_host and not [r for r in rows if r["outcome"] == "oom"]
    for row in over_host:  # over the host's budget, within the GPU's
        assert int(row["host_peak_bytes"]) > int(row["host_budget_bytes"]) == HOST_BUDGET
        assert int(row["peak_bytes"]) <= int(row["budget_bytes"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["host_budget_bytes"] == HOST_BUDGET
    assert f"host budget {size(HOST_BUDGET)} (as host_memory_gib= sets it)," in _study_line(out)

    # The front and the best: fitting runs only, each with its host peak, pinned in full
    # (offloaded activations are page-locked).
    ok = {(r["batch_size"], r["precision"]) for r in rows if r["outcome"] == "ok"}
    for point in [summary["best"], *summary["pareto"]]:
        assert (str(point["config"]["batch_size"]), point["config"]["precision"]) in ok
        assert point["host_peak_bytes"] == point["host_pinned_bytes"] <= HOST_BUDGET
        assert host_cell(point) == f"{size(point['host_peak_bytes'])} (100% pinned)"
    front = out[out.index("Pareto front") : out.index("best configuration per resolution")]
    best = out[
        out.index("best configuration per resolution") : out.index("the best configuration's")
    ]
    assert front.splitlines()[1].split()[-1] == "host"
    assert best.splitlines()[1].split()[-1] == "host"
    for point in summary["pareto"]:
        row = rf"^256 +{point['config']['batch_size']} .*  {re.escape(host_cell(point))}$"
        assert re.search(row, front, re.M), front
    assert f"{host_cell(summary['best'])}  <- best" in best

    # The combination that lost says the batch above its largest went over the host's budget,
    # by how much, and where.
    loser = next(c for c in summary["combinations"] if c["knobs"]["precision"] == "fp32")
    above = next(r for r in over_host if r["precision"] == "fp32"
                 and int(r["batch_size"]) == loser["best_batch"] + 1)  # fmt: skip
    losers = out[out.index("why the others lost") :]
    assert (
        f"batch {above['batch_size']}: oom_host in {above['phase']} "
        f"(host {size(int(above['host_peak_bytes']))} of {size(HOST_BUDGET)})"
    ) in losers


def test_the_charts_mark_runs_over_the_host_budget_apart_in_both_renderers(
    host_workdir: Path,
) -> None:
    from autofit.report.html import _pareto_figure

    study = load_study(host_workdir / "results" / HOST_STUDY)
    # A probe and its point share the batch and the throughput.
    over_host = {
        (p.batch_size, p.samples_per_s): p for p in study.probes if p.outcome.value == "oom_host"
    }
    marked = {(p.batch_size, p.samples_per_s): p for p in charts.points(study) if p.over_host}
    assert over_host and marked.keys() == over_host.keys()
    for key, point in marked.items():
        assert not point.fits
        assert point.host_peak_gib == over_host[key].host_peak_bytes / (1 << 30)
        assert point.hover().endswith(": fits the GPU, over the host budget")
    front = [p for f in charts.fronts(study).values() for p in f]
    assert front and not [p for p in front if (p.batch_size, p.samples_per_s) in marked]
    best = charts.best_point(study)
    assert best is not None and best.host_peak_gib is not None

    traces = {t.name: t for t in _pareto_figure(study).data}
    label, colour = charts.OVER_HOST
    assert traces[label].marker.color == colour and traces[label].marker.symbol == "cross"
    assert len(traces[label].x) == len(marked)
    assert "over the budget" not in traces  # no run was over the GPU's budget
    report = host_workdir / "results" / HOST_STUDY / "report"
    assert (report / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_says_a_configuration_that_fitted_now_goes_over_the_host_budget(
    host_workdir: Path, tmp_path: Path
) -> None:
    tonight = host_workdir / "results" / HOST_STUDY
    last_night = tmp_path / "last_night"
    shutil.copytree(tonight, last_night)
    rows = _trials(last_night)
    over = next(r for r in rows if r["outcome"] == "oom_host")
    over["outcome"] = "ok"  # as if it had fitted the host before
    _rewrite_trials(last_night, rows, list(rows[0]))
    done = autofit("report", f"study={HOST_STUDY}", f"compare={last_night}", cwd=host_workdir)
    assert done.returncode == 1
    assert (
        f"batch {over['batch_size']} precision={over['precision']}" in done.stderr
        and f"(oom_host in {over['phase']}, host {size(int(over['host_peak_bytes']))} of "
        f"{size(HOST_BUDGET)})"
        in done.stderr
    ), done.stderr
    assert f"yes -> no (oom_host in {over['phase']})" in done.stdout


def test_when_only_the_host_stops_every_run_the_report_says_so(tmp_path: Path) -> None:
    """tiny_mlp with its EMA copy on the CPU (194.25 KiB of host memory) under a 0.0001 GiB host
    budget: every run fits the GPU and none the host. No front, no best; the point is charted as
    over the host budget, and the note names the host, not the GPU."""
    (tmp_path / "space.yaml").write_text(
        "batch_size: {min: 1, max: 2}\nresolution: [x1]\nknobs:\n  ema: [cpu]\n"
    )
    search = in_process("search", "model=tiny_mlp", "gpu=a40", "backend=simulate",
                        "space=space.yaml", "study=h", "jobs=1", "host_memory_gib=0.0001",
                        cwd=tmp_path)  # fmt: skip
    assert search.returncode == 1  # nothing fits
    done = in_process("report", "study=h", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    study = load_study(tmp_path / "results" / "h")
    (probe,) = study.probes
    assert probe.outcome.value == "oom_host" and probe.host_peak_bytes
    assert study.pareto == [] and study.best is None
    assert charts.fronts(study) == {} and charts.best_point(study) is None
    assert [p.over_host for p in charts.points(study)] == [True]
    budget = int(0.0001 * (1 << 30))
    assert (
        f"nothing fits: 1 run fits the GPU but not the host (the least host memory found is "
        f"{size(probe.host_peak_bytes)} against a host budget of {size(budget)} "
        "(as host_memory_gib= sets it))"
    ) in done.stdout
    assert f"none fit  batch 1: oom_host in {probe.phase} (host {size(probe.host_peak_bytes)}" in (
        done.stdout
    )
    box = _box(done.stdout)  # the answer says so first
    assert "| best run  nothing fits: 1 run fits the GPU but not the host" in "\n".join(box)
    assert "| export    nothing to export" in box and "| trust     simulated: " in "\n".join(box)


def test_a_study_written_before_host_memory_was_counted_still_reports(
    workdir: Path, reported: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """trials.csv without its host columns and a summary without host figures, as autofit wrote
    them before it counted host memory: the report has a host column of "-" and states no host
    budget."""
    old = tmp_path / "before_host"
    shutil.copytree(workdir / "results" / STUDY, old)
    rows = _trials(old)
    _rewrite_trials(old, rows, [c for c in rows[0] if not c.startswith("host_")])
    summary = json.loads((old / "summary.json").read_text())
    del summary["schema_version"], summary["host_budget_bytes"]  # as a folder of before both
    for point in [summary["best"], *summary["pareto"]]:
        del point["host_peak_bytes"], point["host_pinned_bytes"]
    (old / "summary.json").write_text(json.dumps(summary))

    done = autofit("report", f"from={old}", cwd=workdir)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "host budget" not in _study_line(out)
    assert all(p.host_peak_bytes is None for p in load_study(old).probes)
    front = out[out.index("Pareto front") : out.index("best configuration per resolution")]
    best = out[
        out.index("best configuration per resolution") : out.index("the best configuration's")
    ]
    front_rows = [line for line in front.splitlines()[2:] if line.strip()]
    assert len(front_rows) == len(summary["pareto"])
    assert all(line.endswith(" -") for line in front_rows), front
    assert re.search(r" - +<- best$", best, re.M), best
    # The new study, by contrast, states its host figures (simulated for a T4: the machine a
    # T4 is met in, conf/gpu/t4.yaml).
    assert "host budget 12.70 GiB (a typical machine for t4: a free Google Colab T4 VM" in (
        _study_line(reported.stdout)
    )


def test_a_read_only_study_is_reported_and_exported_as_far_as_it_can_be(
    workdir: Path, tmp_path: Path
) -> None:
    """A study on a read-only filesystem (a shared results folder, a mounted archive): the report
    prints in full with a one-line warning naming out=, exit 0; the export prints its README and
    says, in one line, that nothing was written and to add out=; out= then writes both."""
    import shutil

    from helpers import read_only

    shared = tmp_path / "shared"
    # the study as its search wrote it (other tests report and export it in place)
    shutil.copytree(
        workdir / "results" / STUDY,
        shared / STUDY,
        ignore=shutil.ignore_patterns("report", "export"),
    )
    with read_only(shared):
        report = in_process("report", f"from=shared/{STUDY}", cwd=tmp_path)
        export = in_process("export", f"from=shared/{STUDY}", "target=hydra", cwd=tmp_path)
        elsewhere = in_process(
            "report", f"from=shared/{STUDY}", "out=mine/report", cwd=tmp_path
        ).returncode, in_process(
            "export", f"from=shared/{STUDY}", "target=hydra", "out=mine/export", cwd=tmp_path
        ).returncode  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("+-- the answer") and "Pareto front" in report.stdout
    assert "report in " not in report.stdout
    assert report.stderr.count("\n") == 1 and report.stderr.startswith("autofit: warning: cannot ")
    assert "add out=DIR to write the report's files" in report.stderr
    assert export.returncode == 1
    assert export.stdout.startswith(f"autofit export: best of study {STUDY}, for hydra")
    assert "launch:" in export.stdout
    assert export.stderr.count("\n") == 1 and export.stderr.startswith("autofit: error: cannot ")
    assert "nothing is written" in export.stderr and "add out=DIR" in export.stderr
    assert elsewhere == (0, 0)
    assert (tmp_path / "mine" / "report" / "report.html").is_file()
    assert (tmp_path / "mine" / "export" / "export.json").is_file()
    assert not (shared / STUDY / "report").exists() and not (shared / STUDY / "export").exists()
