"""A results folder of every layout autofit has written (autofit/results/schema.py) is read by
today's autofit through one migration step per version: `autofit report` and `autofit export
target=hydra` give the best run and the Pareto front it holds, and never rewrite it. A folder
from a newer autofit is refused in one line; a folder written today states its version.

tests/fixtures/results_versions/vN is what autofit wrote at the commit that first wrote version N
(VERSIONS), searching tests/fixtures/results_versions/space.yaml for tiny_sana on a T4:

    git archive <commit> | tar -x -C src
    cd run && PYTHONPATH=src python -m autofit search model=tiny_sana gpu=t4 \\
        space=space.yaml margin=0.963 study=vN

Version 2 was written at e292cc7, the commit before version 3: its writer is 060a5e1's, but at
060a5e1 itself every simulated probe crashed. Every version found the same best run and front.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import in_process

from autofit.export import load_point
from autofit.knobs import completed
from autofit.report.tables import config_words
from autofit.results import Damaged, load_study, read_summary
from autofit.results.schema import (
    SCHEMA_VERSION,
    STEPS,
    NewerSchema,
    Written,
    migrated,
    written_version,
)
from autofit.units import size

FIXTURES = Path(__file__).parent / "fixtures" / "results_versions"
# The commit that first wrote each version (the one its fixture was written at, for version 2).
VERSIONS = {1: "3f405a6", 2: "060a5e1", 3: "0db0539", 4: "242cd25", 5: "6d778b0", 6: "4a8407c"}
KNOBS = ["precision", "optimizer", "checkpointing"]  # the space's


def _fixture(version: int, into: Path) -> Path:
    """A copy of version `version`'s folder at results/vN under `into`."""
    folder = into / "results" / f"v{version}"
    shutil.copytree(FIXTURES / f"v{version}", folder)
    return folder


def _contents(folder: Path) -> dict[str, str]:
    """Every file under `folder`, by its path, with a digest of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
    }


def _written(version: int) -> tuple[dict[str, Any], list[str]]:
    """Version `version`'s summary and trials.csv header, as written."""
    folder = FIXTURES / f"v{version}"
    with (folder / "trials.csv").open(newline="") as f:
        columns = next(csv.reader(f))
    return json.loads((folder / "summary.json").read_text()), columns


def _run(run: dict[str, Any]) -> tuple[Any, ...]:
    """What a run is, across versions: its searched knobs, batch and resolution, and its peak."""
    config = run["config"]
    return (
        config["resolution"],
        config["batch_size"],
        *(config[k] for k in KNOBS),
        run["peak_bytes"],
    )


def test_every_version_before_today_has_its_step_and_its_folder() -> None:
    assert [step.to for step in STEPS] == list(range(2, SCHEMA_VERSION + 1))
    assert sorted(VERSIONS) == list(range(1, SCHEMA_VERSION + 1))
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == [f"v{n}" for n in VERSIONS]


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_a_folder_without_a_schema_version_is_the_version_its_fields_show(version: int) -> None:
    summary, columns = _written(version)
    assert "schema_version" not in summary  # written before autofit kept it
    path = FIXTURES / f"v{version}" / "summary.json"
    assert written_version(path, summary, columns) == version
    # The summary alone: a version that changed only trials.csv cannot be told from the next.
    alone = written_version(path, summary)
    assert alone == version or (alone == version + 1 and not STEPS[version - 1].fields)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_an_older_folder_reports_and_exports_the_best_and_front_it_holds(
    tmp_path: Path, version: int
) -> None:
    folder = _fixture(version, tmp_path)
    before = _contents(folder)
    written, _ = _written(version)
    best = written["best"]
    front = sorted(written["pareto"], key=lambda p: (p["config"]["resolution"], p["run_size"]))

    done = in_process("report", f"from=results/v{version}", "out=report", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done_report = done.stdout
    assert f"best: {config_words(best['config'], KNOBS)}\n" in done_report
    table = done_report[done_report.index("Pareto front") :].split("\n\n")[0].splitlines()[2:]
    assert [line.split()[:2] + line.split()[5:8] for line in table] == [
        [str(p["config"]["resolution"]), str(p["config"]["batch_size"]),
         f"{p['samples_per_s']:.3f}", *size(p["peak_bytes"]).split()]
        for p in front
    ]  # fmt: skip

    done = in_process("export", "target=hydra", f"from=results/v{version}", "out=export",
                      cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    exported = json.loads((tmp_path / "export" / "export.json").read_text())
    assert exported["point"] == "best"
    assert exported["config"].items() <= completed(best["config"]).items()
    assert load_point(folder / "summary.json").config == completed(best["config"])

    # Read in today's shape: the runs as written, with what their version lacked as not recorded.
    study = load_study(folder)
    assert study.summary["schema_version"] == SCHEMA_VERSION
    assert study.best is not None and study.best.items() >= best.items()
    assert [_run(p) for p in study.pareto] == [_run(p) for p in written["pareto"]]
    assert all(p.items() >= w.items() for p, w in zip(study.pareto, written["pareto"], strict=True))
    assert study.summary["fastest"] is None  # the best was the fastest run
    assert len(study.probes) == len((folder / "trials.csv").read_text().splitlines()) - 1
    if version < 2:  # host memory not counted: no host budget stated, no host peak shown
        assert study.best["host_peak_bytes"] is None
        assert all(p.host_peak_bytes is None for p in study.probes)
        assert "host budget" not in done_report.split("\nstudy ")[1].splitlines()[0]
        assert all(line.split()[-1] == "-" for line in table)
    if version < 5:
        assert {p.source for p in study.probes} == {""}  # not recorded
    assert _contents(folder) == before  # reading never rewrites the folder


def test_every_version_holds_the_same_best_and_front() -> None:
    """The same search, written by each version: read today, one answer."""
    studies = [load_study(FIXTURES / f"v{version}") for version in VERSIONS]
    assert len({_run(s.best) for s in studies if s.best}) == 1
    assert len({tuple(_run(p) for p in s.pareto) for s in studies}) == 1


@pytest.fixture(scope="module")
def today(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixtures' search, run today (three probes)."""
    cwd = tmp_path_factory.mktemp("today")
    shutil.copy(FIXTURES / "space.yaml", cwd)
    done = in_process("search", "model=tiny_sana", "gpu=t4", "space=space.yaml", "margin=0.963",
                      "study=today", "jobs=1", cwd=cwd)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cwd / "results" / "today"


@pytest.mark.long  # its fixture runs a search
def test_a_folder_written_today_states_the_current_version_in_todays_shape(today: Path) -> None:
    summary = json.loads((today / "summary.json").read_text())
    assert summary["schema_version"] == SCHEMA_VERSION
    now = load_study(today)
    assert now.summary == {**summary}  # today's shape needs no step
    # Every older folder, migrated, has today's fields (but those only some searches write).
    sometimes = {
        "overrides", "host_budget_bytes", "host_budget_basis", "nothing_fits", "trainer",
        "trainer_stack", "trainer_values",
    }  # fmt: skip
    with (today / "trials.csv").open(newline="") as f:
        columns = next(csv.reader(f))
    for version in VERSIONS:
        old = load_study(FIXTURES / f"v{version}")
        assert set(old.summary) - sometimes == set(summary) - sometimes, version
        assert set(old.best or {}) == set(summary["best"]), version
        written, header = _written(version)
        assert migrated(Written(written, header), version).columns == columns, version


def test_a_folder_from_a_newer_autofit_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = _fixture(SCHEMA_VERSION, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    newer = SCHEMA_VERSION + 1
    # A newer layout may lack what this one reads: it is refused as newer, not as damaged.
    del summary["budget_bytes"]
    (folder / "summary.json").write_text(json.dumps({"schema_version": newer, **summary}))
    before = _contents(folder)
    line = (
        f"autofit: error: {Path('results', f'v{SCHEMA_VERSION}', 'summary.json')} was written by "
        f"a newer autofit (schema_version {newer}; this autofit reads up to {SCHEMA_VERSION}): "
        "upgrade autofit to read it"
    )
    for command in (["report"], ["export", "target=hydra"]):
        done = in_process(*command, f"from=results/v{SCHEMA_VERSION}", "out=out", cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.strip() == line, done.stderr
    with pytest.raises(NewerSchema, match=f"schema_version {newer};"):
        read_summary(folder / "summary.json")
    assert _contents(folder) == before


@pytest.mark.parametrize("stated", ["6", 0, True, None])
def test_a_schema_version_that_is_not_one_is_damaged(tmp_path: Path, stated: Any) -> None:
    folder = _fixture(SCHEMA_VERSION, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({"schema_version": stated, **summary}))
    with pytest.raises(Damaged, match=rf"\(its schema_version {stated!r} is not a version\)"):
        load_study(folder)


def test_a_folder_that_lacks_what_its_version_wrote_is_damaged(tmp_path: Path) -> None:
    """A stated version is read as that version: a trials.csv without the host columns it wrote
    (a hand edit) is damaged, in one line."""
    folder = _fixture(SCHEMA_VERSION, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, **summary}))
    with (folder / "trials.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if not c.startswith("host_")]
    with (folder / "trials.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    done = in_process("report", f"from=results/v{SCHEMA_VERSION}", "out=out", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert (
        done.stderr.startswith(
            f"autofit: error: {Path('results', f'v{SCHEMA_VERSION}', 'trials.csv')} is damaged "
            "(its header has no host_peak_bytes): rerun `autofit search "
        )
        and len(done.stderr.strip().splitlines()) == 1
    ), done.stderr
