"""What a study stores outlives the code that wrote it: a study written before a knob or a value
existed resumes (reusing its probes), reports and exports after it is added. A results folder of
every layout autofit has written is read in tests/test_results_schema.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autofit.cli import main
from autofit.export import load_point
from autofit.knobs import REGISTRY
from autofit.knobs.optimizer import Optimizer
from autofit.records.probe import Outcome, ProbeResult
from autofit.search.keys import probe_key
from autofit.search.recorder import StudyRecorder

OLD_SPACE = """
batch_size: {min: 1, max: 1}
resolution: [x1]
knobs:
  precision: [bf16]
  optimizer: [adamw, lion]
  checkpointing: [false]
"""
# The same space once `ema` and optimizer=lion8bit exist (YAML reads `off` as false: autofit
# takes the word back).
NEW_SPACE = OLD_SPACE.replace("[adamw, lion]", "[adamw, lion8bit]") + "  ema: [off, gpu]\n"


class OlderOptimizer(Optimizer):
    values = {k: v for k, v in Optimizer.values.items() if k != "lion8bit"}


class Versions:
    """Switches the knob registry between today's autofit and the one before the `ema` knob and
    optimizer=lion8bit existed (in place: every module holds the same dict)."""

    def __init__(self) -> None:
        self.today = dict(REGISTRY)

    def older(self) -> None:
        REGISTRY.clear()
        for name, knob in self.today.items():
            if name != "ema":
                REGISTRY[name] = OlderOptimizer() if name == "optimizer" else knob

    def newer(self) -> None:
        REGISTRY.clear()
        REGISTRY.update(self.today)  # in its own order


@pytest.fixture
def versions() -> Iterator[Versions]:
    switch = Versions()
    try:
        yield switch
    finally:
        switch.newer()


def _result(config: dict, batch: int) -> ProbeResult:
    return ProbeResult(
        outcome=Outcome.OK, backend="simulate", gpu="a40", model="tiny_sana",
        config={**config, "batch_size": batch}, budget_bytes=100, peak_bytes=50,
        samples_per_s=1.0,
    )  # fmt: skip


def test_a_study_recorded_before_a_knob_and_a_value_existed_takes_both(
    tmp_path: Path, versions: Versions
) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    versions.older()
    old = {k: v.default for k, v in REGISTRY.items()} | {
        "resolution": 64, "precision": "bf16", "optimizer": "lion", "batch_size": 2
    }  # fmt: skip
    StudyRecorder(storage, "s", {}).record_probe(
        probe_key(old, "simulate", 100, "m", "g"), _result(old, 2)
    )
    versions.newer()
    recorder = StudyRecorder(storage, "s", {})
    now = {**old, "ema": "off"}  # the knob it predates, at its default: the same run
    assert recorder.finished(probe_key(now, "simulate", 100, "m", "g")) is not None
    newer = {**now, "optimizer": "lion8bit", "ema": "gpu"}  # a value and a knob it never saw
    recorder.record_probe(probe_key(newer, "simulate", 100, "m", "g"), _result(newer, 2))
    recorder.record_probe(
        probe_key({**now, "batch_size": 1}, "simulate", 100, "m", "g"), _result(now, 1)
    )

    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.params.get("optimizer") for t in trials] == ["lion", None, "lion"]
    assert trials[1].params["optimizer~2"] == "lion8bit"  # the stored distribution lacks it
    assert "lion8bit" not in trials[0].distributions["optimizer"].choices
    assert trials[1].params["ema"] == "gpu"


@pytest.mark.long
def test_a_search_written_before_a_knob_and_a_value_existed_resumes_reports_and_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, versions: Versions
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.yaml").write_text(OLD_SPACE)
    (tmp_path / "new.yaml").write_text(NEW_SPACE)
    search = ["search", "model=tiny_sana", "gpu=a40", "study=nightly", "jobs=1"]
    summary = tmp_path / "results" / "nightly" / "summary.json"

    versions.older()
    assert main([*search, "space=old.yaml"]) == 0
    old = json.loads(summary.read_text())
    assert "ema" not in old["best"]["config"]

    versions.newer()
    # The old study's files, read by the newer autofit: the knob it predates at its default.
    assert main(["report", "study=nightly"]) == 0
    assert load_point(summary).config["ema"] == "off"
    assert main(["export", "target=hydra", "study=nightly", "out=old-export"]) == 0
    # Resumed with the new knob and value: every old probe reused, only new ones run.
    assert main([*search, "space=new.yaml"]) == 0
    new = json.loads(summary.read_text())
    assert new["reused_probes"] == 1  # adamw without EMA: the same run as before
    assert new["new_probes"] == 3
    searched = {(c["knobs"]["optimizer"], c["knobs"]["ema"]) for c in new["combinations"]}
    assert ("lion8bit", "gpu") in searched
    assert main(["report", "study=nightly"]) == 0
    assert main(["export", "target=accelerate", "study=nightly", "out=new-export"]) == 0


def test_pruned_notes_are_recorded_once_each_from_one_read_of_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    StudyRecorder(storage, "s", {}).record_pruned({"optimizer": "came"}, "invalid: earlier")
    recorder = StudyRecorder(storage, "s", {})
    reads = []
    read = recorder.refresh
    monkeypatch.setattr(recorder, "refresh", lambda: reads.append(1) or read())
    notes = [({"optimizer": name}, f"invalid: {name}") for name in ("adamw", "lion", "came")]
    recorder.record_pruned_all(notes + notes[:1])  # one twice, one the study holds already
    assert len(reads) == 1
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    reasons = sorted(t.user_attrs["reason"] for t in trials)
    assert reasons == ["invalid: adamw", "invalid: earlier", "invalid: lion"]
