"""`autofit report` end to end on a real (tiny) study: its tables and files, the HTML page rendered
in headless Chromium, comparison with another study for nightly jobs, and the optuna-dashboard on
the default storage."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
import wsgiref.util
from pathlib import Path

import pytest
from chromium import find_chromium, open_page
from helpers import autofit, in_process

from autofit.report import charts
from autofit.report.changes import compare
from autofit.report.tables import host_cell
from autofit.results import load_study
from autofit.units import size

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
        },
    )
    assert rendered.errors == []
    assert rendered.values["pareto_points"] > 0 and rendered.values["memory_bars"] > 0, rendered


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
    assert f"host budget {size(HOST_BUDGET)}," in out.splitlines()[0]

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
        f"{size(probe.host_peak_bytes)} against a host budget of {size(budget)})"
    ) in done.stdout
    assert f"none fit  batch 1: oom_host in {probe.phase} (host {size(probe.host_peak_bytes)}" in (
        done.stdout
    )


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
    del summary["host_budget_bytes"]
    for point in [summary["best"], *summary["pareto"]]:
        del point["host_peak_bytes"], point["host_pinned_bytes"]
    (old / "summary.json").write_text(json.dumps(summary))

    done = autofit("report", f"from={old}", cwd=workdir)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "host budget" not in out.splitlines()[0]
    assert all(p.host_peak_bytes is None for p in load_study(old).probes)
    front = out[out.index("Pareto front") : out.index("best configuration per resolution")]
    best = out[
        out.index("best configuration per resolution") : out.index("the best configuration's")
    ]
    front_rows = [line for line in front.splitlines()[2:] if line.strip()]
    assert len(front_rows) == len(summary["pareto"])
    assert all(line.endswith(" -") for line in front_rows), front
    assert re.search(r" - +<- best$", best, re.M), best
    # The new study, by contrast, states its host figures (simulated: no host budget).
    assert "host budget not stated" in reported.stdout.splitlines()[0]
