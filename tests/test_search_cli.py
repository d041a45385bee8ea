"""`autofit search` end to end on the tiny models: its files, resuming, surviving SIGKILL, and its
errors."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import autofit, in_process

SUMMARY_FIELDS = {
    "study",
    "model",
    "gpu",
    "backend",
    "budget_bytes",
    "n_probes",
    "wall_s",
    "best",
    "pareto",
}

WIDE_SPACE = """
batch_size: {min: 1, max: 8}
resolution: [x1]
knobs:
  precision: [bf16, fp16, bf16_pure]
  optimizer: [adamw, sgd]
  checkpointing: [false]
"""


@pytest.mark.long
def test_quick_search_writes_its_results_and_a_rerun_repeats_no_probe(tmp_path: Path) -> None:
    done = autofit("search", "model=tiny_sana", "gpu=a40", "space=quick", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "results" / "tiny_sana-a40-quick"
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["backend"] == "simulate"
    assert summary["best"]["config"]["resolution"] == 64
    assert summary["best"]["peak_bytes"] <= summary["budget_bytes"]
    assert {"config", "peak_bytes", "samples_per_s"} <= set(summary["best"])
    assert summary["pareto"] and all(
        {"config", "peak_bytes", "samples_per_s"} <= set(p) for p in summary["pareto"]
    )
    trials = (out / "trials.csv").read_text().splitlines()
    assert len(trials) - 1 >= summary["n_probes"]
    assert (out / "pareto.csv").read_text().startswith("resolution,batch_size,precision")
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert (
        best["model"] == "tiny_sana"
        and best["batch_size"] == summary["best"]["config"]["batch_size"]
    )
    # A full fine-tune's best lists no knob of adapters or frozen blocks: it trains none.
    assert summary["best"]["config"]["train_mode"] == "full" and "checkpointing" in best
    assert not {"lora_rank", "lora_targets", "trainable_layers", "peft_config"} & set(best)
    assert "Pareto front" in done.stdout and "best:" in done.stdout
    assert (tmp_path / "results" / "studies.db").exists()

    again = autofit("search", "model=tiny_sana", "gpu=a40", "space=quick", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["new_probes"] == 0
    assert resumed["reused_probes"] == summary["n_probes"]
    assert resumed["best"] == summary["best"]


def _finished_probes(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as connection:
            (count,) = connection.execute(
                "select count(*) from trials where state in ('COMPLETE', 'FAIL')"
            ).fetchone()
        return count
    except sqlite3.Error:  # the tables may not exist yet
        return 0


@pytest.mark.long
def test_a_search_killed_with_sigkill_loses_no_finished_probe(tmp_path: Path) -> None:
    (tmp_path / "wide.yaml").write_text(WIDE_SPACE)
    args = [
        sys.executable,
        "-m",
        "autofit",
        "search",
        "model=tiny_sana",
        "gpu=a40",
        "space=wide.yaml",
        "jobs=1",
    ]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    db = tmp_path / "results" / "studies.db"
    deadline = time.time() + 300
    while _finished_probes(db) < 3 and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    recorded = _finished_probes(db)
    assert recorded >= 3

    done = autofit("search", "model=tiny_sana", "gpu=a40", "space=wide.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "results" / "tiny_sana-a40-wide" / "summary.json").read_text())
    assert summary["reused_probes"] >= recorded  # every probe that finished before the kill
    assert _finished_probes(db) == summary["n_probes"]  # and none was run twice


@pytest.mark.long
def test_a_bad_space_is_rejected_before_any_probe_naming_the_file_and_key(tmp_path: Path) -> None:
    cases = {
        "unknown_knob.yaml": (
            "batch_size: {min: 1, max: 4}\nknobs:\n  optimiser: [adamw]\n",
            "knobs.optimiser",
        ),
        "bad_value.yaml": ("batch_size: {min: 1, max: 4}\nknobs:\n  optimizer: [adam]\n", "'adam'"),
        "empty.yaml": (
            "batch_size: {min: 1, max: 4}\nknobs:\n  precision: []\n",
            "knobs.precision",
        ),
        "bad_batch.yaml": ("batch_size: {min: 4, max: 2}\n", "min=4"),
        "bad_family.yaml": (
            "batch_size: {min: 1, max: 4}\nfamilies:\n  fluxx:\n    train_mode: [lora]\n",
            "families.fluxx",
        ),
        "bad_family_value.yaml": (
            "batch_size: {min: 1, max: 4}\nfamilies:\n  flux:\n    swap_blocks: [-1]\n",
            "families.flux.swap_blocks",
        ),
        "bad_resolution.yaml": (
            "batch_size: {min: 1, max: 4}\nresolution: [1000]\n",
            "resolution[0]",
        ),
        "min_batch_above.yaml": (
            "batch_size: {min: 1, max: 4}\ntarget: {min_batch: 8}\n",
            "target.min_batch=8 is above batch_size.max=4",
        ),
        "bad_rule.yaml": (
            "batch_size: {min: 1, max: 4}\ntarget: {memory_gain: 1.5}\n",
            "target.memory_gain=1.5 is not valid; expected a share from 0 to 1",
        ),
        "unknown_target.yaml": (
            "batch_size: {min: 1, max: 4}\ntarget: {speed: 0.1}\n",
            "target.speed: unknown setting; valid: resolution, min_batch, speed_tolerance",
        ),
    }
    for name, (text, key) in cases.items():
        (tmp_path / name).write_text(text)
        done = in_process("search", "model=sana_1600m", "gpu=a40", f"space={name}", cwd=tmp_path)
        assert done.returncode == 2, (name, done.stderr)
        line = done.stderr.strip()
        assert len(line.splitlines()) == 1 and name in line and key in line, line
    assert not (tmp_path / "results").exists()  # nothing ran, nothing written
    above = in_process("search", "model=sana_1600m", "gpu=a40", "target.min_batch=65", cwd=tmp_path)
    assert above.returncode == 2 and above.stderr.strip() == (
        "autofit: error: target.min_batch=65 is above space default's largest batch, 64; "
        "valid: 1 to 64"
    )
    assert not (tmp_path / "results").exists()
    for setting, says in {
        "target.speed_tolerance=-0.5": "target.speed_tolerance=-0.5 is not valid; expected a "
        "share from 0 to 1",
        "target.speed_tolrance=0.1": "unknown setting 'target.speed_tolrance' for 'autofit "
        "search' (did you mean 'target.speed_tolerance'?)",
    }.items():
        done = in_process("search", "model=sana_1600m", "gpu=a40", setting, cwd=tmp_path)
        line = done.stderr.strip()
        assert done.returncode == 2 and len(line.splitlines()) == 1 and says in line, line
    unknown = in_process("search", "model=tiny_mlp", "gpu=a40", "space=quik", cwd=tmp_path)
    assert (
        unknown.returncode == 2
        and "unknown space 'quik' (did you mean 'quick'?)" in unknown.stderr
        and "quick" in unknown.stderr
    )


@pytest.mark.long
def test_when_nothing_fits_it_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    done = autofit("search", "model=tiny_mlp", "gpu=l4", "space=quick", "margin=0.98", cwd=tmp_path)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("autofit: error: nothing fits l4")
        and "smallest peak found" in line
        and "budget" in line
    )
    summary = json.loads((tmp_path / "results" / "tiny_mlp-l4-quick" / "summary.json").read_text())
    assert (
        summary["best"] is None
        and summary["nothing_fits"]["smallest_peak_bytes"] > summary["budget_bytes"]
    )


@pytest.mark.long
def test_a_card_without_bf16_searches_fp16_and_one_with_it_leaves_fp16_out(
    tmp_path: Path,
) -> None:
    """The shipped spaces list fp16 for the T4, the V100 and the RTX 20xx cards; where the card
    has bf16, fp16 holds what bf16 holds, and is left out with the reason."""
    done = autofit("search", "model=tiny_mlp", "gpu=t4", "space=quick", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "results" / "tiny_mlp-t4-quick" / "summary.json").read_text())
    assert summary["best"]["config"]["precision"] == "fp16"
    by_precision: dict[str, set[str]] = {}
    for combination in summary["combinations"]:
        by_precision.setdefault(combination["knobs"]["precision"], set()).add(combination["status"])
    assert "exact" in by_precision["fp16"] and by_precision["bf16"] == {"invalid"}
    # without a terminal, the log gives one line per reason, before the first probe
    log = done.stderr.splitlines()
    invalid = [i for i, line in enumerate(log) if "] invalid: " in line]
    assert (
        len(invalid) == 1
        and "invalid: 2 combinations: precision=bf16 needs bf16" in (log[invalid[0]])
    )
    assert invalid[0] < min(i for i, line in enumerate(log) if "] probe 1:" in line)

    from autofit.commands.search import left_out_by
    from autofit.gpus import load_gpu
    from autofit.models import load_preset
    from autofit.search.space import load_space

    space = load_space("default", load_preset("sana_600m"))
    knobs = {name: values[0] for name, values in space.knobs.items()}
    assert left_out_by(space, load_gpu("a40"))({**knobs, "precision": "fp16"}) == (
        "precision=fp16 holds what bf16 holds, at its speed, with loss scaling: searched only on "
        "GPUs without bf16 (NVIDIA A40 has it)"
    )
    assert left_out_by(space, load_gpu("v100_32"))({**knobs, "precision": "fp16"}) is None


@pytest.mark.long
def test_a_sweep_runs_one_search_per_combination(tmp_path: Path) -> None:
    done = autofit("search", "-m", "model=tiny_mlp", "gpu=a40,l4", "space=quick", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for gpu in ("a40", "l4"):
        assert (tmp_path / "results" / f"tiny_mlp-{gpu}-quick" / "summary.json").exists()


@pytest.mark.long
def test_a_changed_preset_is_measured_again_not_reused(tmp_path: Path) -> None:
    first = autofit("search", "model=tiny_sana", "gpu=a40", "space=quick", "study=s", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    changed = autofit(
        "search", "model=tiny_sana", "gpu=a40", "space=quick", "study=s",
        "model.architecture.num_layers=3", cwd=tmp_path,
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    summary = json.loads((tmp_path / "results" / "s" / "summary.json").read_text())
    assert summary["reused_probes"] == 0 and summary["new_probes"] > 0


@pytest.mark.long
def test_a_custom_model_gets_a_study_of_its_own(tmp_path: Path) -> None:
    done = autofit(
        "search", "model=custom", "gpu=l4", "space=quick", "model.entry=custom_models.tiny:build",
        cwd=tmp_path, pythonpath=Path(__file__).parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(
        (
            tmp_path / "results" / "custom-custom_models.tiny.build-l4-quick" / "summary.json"
        ).read_text()
    )
    assert summary["best"]["peak_bytes"] <= summary["budget_bytes"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_combinations_left_time_left_and_the_best_against_the_budget() -> None:
    """On a terminal: combinations done of those to search, an estimate of the time left once
    one is done, probes, the best so far with its peak against the budget; at any width every
    number stays whole and only the best's knob words are cut. Without one: the same count on
    each probe's log line."""
    from autofit.gpus import load_gpu
    from autofit.models import load_preset
    from autofit.records.probe import Outcome, ProbeResult
    from autofit.records.status import Status
    from autofit.search.combination import Combination
    from autofit.search.display import config_words
    from autofit.search.progress import Progress
    from autofit.search.space import load_space

    space = load_space("default", load_preset("sana_1600m"))
    budget = load_gpu("a40").budget_bytes(0.05)
    knobs = {name: values[-1] for name, values in space.knobs.items()}
    fits = ProbeResult(
        outcome=Outcome.OK, backend="simulate", gpu="a40", model="sana_1600m",
        config={**knobs, "batch_size": 8, "resolution": 1024}, budget_bytes=budget,
        peak_bytes=budget - 2 * 2**30, samples_per_s=7.25,
    )  # fmt: skip
    done = Combination(knobs, 1024)
    done.status = Status.EXACT
    for width in (60, 160, 400):
        terminal = _Terminal()
        progress = Progress(terminal, space, list(space.knobs), width=width)
        assert progress.status().startswith("checking combinations | 0 probes")
        progress.on_start(47)
        progress.on_probe(fits, reused=False)
        progress.on_combination(done)
        line = progress.status()
        numbers = (
            "1/47 combinations done, about ", " left | 1 probe (0 reused) | ",
            "best at 1024px: b=8 7.25 samples/s, 40.74 GiB of 42.74 GiB",
        )  # fmt: skip
        assert all(part in line for part in numbers), line
        words = config_words(fits, list(space.knobs))
        assert len(line) <= max(width - 1, line.index("GiB", line.index(" of ")) + 3)
        assert (words in line) == (width == 400) and (line.endswith("...") == (width == 160))
        assert terminal.getvalue().startswith("\r")
    log = io.StringIO()
    progress = Progress(log, space, list(space.knobs))
    progress.on_start(47)
    progress.on_probe(fits, reused=True)
    assert log.getvalue().rstrip().endswith("(reused); 0/47 combinations done")
    # A language model's resolution is tokens.
    tokens = Progress(io.StringIO(), space, list(space.knobs), unit="tokens")
    assert "best at 1024 tokens: none yet" in tokens.status()
    progress.close()


def test_a_search_quiet_for_a_while_says_what_it_is_on() -> None:
    """Off a terminal (a log, CI, SLURM) a long trace writes nothing of its own: after `quiet_s`
    without a line, one says what the workers are on and how far the search is; the lines stop
    with the search."""
    from autofit.models import load_preset
    from autofit.search.progress import Progress
    from autofit.search.space import load_space

    space = load_space("default", load_preset("sana_1600m"))
    log = io.StringIO()
    progress = Progress(log, space, list(space.knobs), quiet_s=0.2)
    progress.on_start(47)
    progress.on_work("precision=bf16 optimizer=adamw @1024px", True)
    deadline = time.monotonic() + 10
    while "working on" not in log.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = log.getvalue().splitlines()[0]
    assert line.startswith("[") and "] working on precision=bf16 optimizer=adamw @1024px; " in line
    assert line.endswith("0/47 combinations done"), line
    progress.on_work("precision=bf16 optimizer=adamw @1024px", False)
    progress.close()
    written = log.getvalue()
    time.sleep(0.5)
    assert log.getvalue() == written  # nothing after the search ends


@pytest.mark.long
def test_a_storage_folder_outside_the_working_folder_is_made_with_a_note(tmp_path: Path) -> None:
    """`sqlite:////x/y.db` (four slashes) is an absolute path: the folder it makes outside the
    working folder is named on stderr; one inside it is made without a word."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "one.yaml").write_text(
        "batch_size: {min: 1, max: 2}\nresolution: [x1]\nknobs: {precision: [bf16]}\n"
    )
    elsewhere = tmp_path / "elsewhere" / "db"
    args = ("search", "model=tiny_mlp", "gpu=a40", "space=one.yaml")
    done = in_process(*args, f"storage=sqlite:///{elsewhere}/studies.db", cwd=work)
    assert done.returncode == 0, done.stderr
    assert (
        f"autofit: note: making {elsewhere} for storage=sqlite:///{elsewhere}/studies.db: it is "
        "outside this folder" in done.stderr
    )
    assert (elsewhere / "studies.db").is_file()
    inside = in_process(*args, "storage=sqlite:///mine/studies.db", cwd=work)
    assert inside.returncode == 0 and "note: making" not in inside.stderr
    assert (work / "mine" / "studies.db").is_file()


@pytest.mark.long
def test_a_search_for_a_trainer_simulates_what_that_trainer_runs(tmp_path: Path) -> None:
    """The diffusers scripts build torch's AdamW told nothing (foreach), which autofit's default
    (fused) is not: with trainer=diffusers every trial runs foreach, the start line says so, and
    the best exports without a refusal. A space that searches the knob keeps it."""
    from autofit.export import TARGETS, trainer_stack
    from autofit.models import load_preset

    space = tmp_path / "lora.yaml"
    space.write_text(
        "batch_size: {min: 1, max: 2}\nresolution: [x1]\n"
        "knobs:\n  train_mode: [lora]\n  optimizer: [adamw]\n  checkpointing: [false]\n"
    )
    done = autofit(
        "search", "model=tiny_sana", "gpu=a40", f"space={space}", "trainer=diffusers",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "optimizer_impl=foreach as diffusers runs it" in done.stdout
    out = tmp_path / "results" / "tiny_sana-a40-lora-diffusers"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"]["config"]["optimizer_impl"] == "foreach"
    assert all(p["config"]["optimizer_impl"] == "foreach" for p in summary["pareto"])
    exported = autofit(
        "export",
        "target=diffusers",
        f"study={out.name}",
        f"out={tmp_path / 'export'}",
        cwd=tmp_path,
    )
    assert exported.returncode == 0, exported.stderr

    searched = {"train_mode": ("lora",), "optimizer_impl": ("fused", "foreach")}
    assert trainer_stack(TARGETS["diffusers"], load_preset("tiny_sana"), searched) == {}
    assert trainer_stack(TARGETS["kohya"], load_preset("flux_dev"), {"train_mode": ("lora",)}) == {}


@pytest.mark.long
def test_a_search_for_trl_simulates_its_fused_lm_head_and_exports_unrefused(
    tmp_path: Path,
) -> None:
    """TRL 1.16 scores tokens through its own fused LM head whatever its config says: with
    trainer=trl every trial runs loss=trl_fused, QLoRA runs as TRL keeps its adapters (bf16, under
    the Trainer's autocast), and the best exports to TRL without a refusal."""
    space = tmp_path / "qlora.yaml"
    space.write_text(
        "batch_size: {min: 1, max: 2}\nresolution: [512]\ntarget: {resolution: 512}\n"
        "knobs:\n  train_mode: [lora, qlora]\n  precision: [bf16, bf16_autocast]\n"
        "  optimizer: [adamw]\n  checkpointing: [true]\n"
    )
    done = autofit(
        "search", "model=llama3_2_1b", "gpu=rtx3060_12", f"space={space}", "trainer=trl",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "loss=trl_fused as trl runs it" in done.stdout
    out = tmp_path / "results" / "llama3_2_1b-rtx3060_12-qlora-trl"
    summary = json.loads((out / "summary.json").read_text())
    runs = [summary["best"], *summary["pareto"]]
    assert all(run["config"]["loss"] == "trl_fused" for run in runs)
    # TRL's pairs: LoRA with fp32 adapters under autocast (bf16), QLoRA with bf16 ones.
    pairs = {(run["config"]["train_mode"], run["config"]["precision"]) for run in runs}
    assert pairs <= {("lora", "bf16"), ("qlora", "bf16_autocast")}, pairs
    exported = autofit("export", f"study={out.name}", f"out={tmp_path / 'export'}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "export" / "sft.yaml").is_file()


def test_nothing_fits_names_the_run_the_search_measured_at_another_resolution() -> None:
    """Where nothing fits at the target resolution but a run the search measured fits at another
    of its resolutions, the line names it and the setting that answers there."""
    from types import SimpleNamespace
    from typing import Any

    from autofit.commands.search import _nothing_fits
    from autofit.gpus import load_gpu
    from autofit.models import load_preset
    from autofit.records.probe import Outcome, ProbeResult
    from autofit.search.space import load_space
    from autofit.units import size

    preset = load_preset("sana_1600m")
    space = load_space("default", preset)  # resolutions 512 and 1024, the target 1024
    gpu = load_gpu("rtx3060_12")
    budget = gpu.budget_bytes(0.05)

    def probe(outcome: Outcome, resolution: int, batch: int, peak: int, speed: float) -> Any:
        return ProbeResult(
            outcome=outcome, backend="simulate", gpu=gpu.name, model=preset.name,
            config={"batch_size": batch, "resolution": resolution}, budget_bytes=budget,
            peak_bytes=peak, samples_per_s=speed,
        )  # fmt: skip

    results = [
        probe(Outcome.OOM, 1024, 1, budget + 2**30, 1.0),
        probe(Outcome.OK, 512, 2, budget - 2**30, 3.0),
        probe(Outcome.OK, 512, 1, budget - 2**31, 2.0),
    ]
    run = SimpleNamespace(space=space, gpu=gpu, preset=preset, margin=0.05, host_budget=None)
    line = str(_nothing_fits(run, SimpleNamespace(results=results), budget + 2**30))
    assert line.startswith("nothing fits rtx3060_12 at 1024px with batch >= 1: the smallest peak")
    assert line.endswith(
        f"; at 512px it fits: batch 2, peak {size(budget - 2**30)} (add target.resolution=512 "
        "for the best there)"
    )
    nowhere = str(_nothing_fits(run, SimpleNamespace(results=results[:1]), budget + 2**30))
    assert "it fits" not in nowhere


def _space(folder: Path, name: str, ema: str, then: str | None = None) -> None:
    """A two-batch space of tiny_mlp's EMA on the host or off, going on to `then` where nothing
    fits."""
    text = f"batch_size: {{min: 1, max: 2}}\nresolution: [x1]\nknobs:\n  ema: ['{ema}']\n"
    (folder / f"{name}.yaml").write_text(text + (f"if_nothing_fits: {then}\n" if then else ""))


@pytest.mark.long
def test_where_nothing_fits_the_search_goes_on_to_the_space_its_space_names(
    tmp_path: Path,
) -> None:
    """A space whose runs the host cannot hold (EMA on the host, 194 KiB, under a 105 KiB host
    budget) names another (EMA off): the first search says nothing fits, the second answers in
    a study and folder of their own, and its rerun line searches the second space; a chain that
    comes back to a space it searched stops there, exit 1. (issue 41 items 2 and 3)"""
    _space(tmp_path, "heavy", "cpu", then="light.yaml")
    _space(tmp_path, "light", "off")
    common = ("model=tiny_mlp", "gpu=a40", "backend=simulate", "jobs=1", "host_memory_gib=0.0001")
    done = in_process("search", *common, "space=heavy.yaml", "study=s", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first, _, second = done.stdout.partition("searching space ")
    assert "\nnothing fits a40 at" in first and "1 run fits the GPU but not the host" in first
    assert second.startswith("light.yaml next, where space heavy has no run (its if_nothing_fits)")
    summary = json.loads((tmp_path / "results" / "s-light" / "summary.json").read_text())
    assert summary["best"]["config"]["ema"] == "off" and summary["space"] == "light"
    assert "space=light.yaml" in summary["rerun"] and "study=s-light" in summary["rerun"]
    assert json.loads((tmp_path / "results" / "s" / "summary.json").read_text())["best"] is None

    _space(
        tmp_path, "light", "cpu", then="heavy.yaml"
    )  # now both fit nothing, each names the other
    done = in_process("search", *common, "space=heavy.yaml", "study=t", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout.count("searching space ") == 1
    assert done.stderr.strip().splitlines()[-1].startswith("autofit: error: nothing fits a40")


def test_a_space_names_the_space_after_it_in_one_checked_line(tmp_path: Path) -> None:
    from autofit.errors import ConfigError
    from autofit.models import load_preset
    from autofit.search.space import load_space

    preset = load_preset("tiny_mlp")
    assert load_space("quick", preset).if_nothing_fits == "small_cards_lora"
    assert load_space("small_cards_lora", preset).if_nothing_fits is None
    for then, words in [
        ("nope", "if_nothing_fits: unknown space 'nope'"),
        ("[1]", "if_nothing_fits=[1] is not valid; expected the name of a space"),
        ("me.yaml", "if_nothing_fits: it names the space itself"),
    ]:
        (tmp_path / "me.yaml").write_text(
            f"batch_size: {{min: 1, max: 2}}\nif_nothing_fits: {then}\n"
        )
        with pytest.raises(ConfigError, match=re.escape(words)):
            load_space(str(tmp_path / "me.yaml"), preset)


def test_for_a_trainer_that_runs_none_of_a_knobs_values_the_search_takes_the_ones_it_runs() -> None:
    """space=quick trains mixed bf16 (fp32 master weights) or fp16; SimpleTuner runs neither, so
    a search for it searches the precisions it runs, rather than nothing (issue 41 item 2)."""
    from autofit.commands.search import _for_trainer
    from autofit.models import load_preset
    from autofit.search.space import load_space

    preset = load_preset("sdxl")
    space = load_space("quick", preset)
    chosen, _, in_place, searched = _for_trainer("simpletuner", preset, space)
    assert in_place == {"precision": ("fp32", "bf16_autocast")}
    assert searched.knobs["precision"] == ("fp32", "bf16_autocast")
    assert _for_trainer("kohya", preset, space)[2] == {}  # kohya runs mixed bf16 and fp16
