"""`autofit calibrate`: the set, the CSV, the figures, resuming, and the errors a user meets."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import autofit, in_process

from autofit.calibration.rows import figures
from autofit.calibration.sets import load_set

TWO_CASES = """cases:
  - model: tiny_mlp
    knobs: {precision: fp32}
    vary: {batch_size: [1, 8]}
"""


def test_the_shipped_set_covers_what_calibration_needs() -> None:
    cases = load_set("default")
    assert len(cases) >= 30
    models = {case.model for case in cases}
    assert {"tiny_sana", "tiny_mlp", "sana_600m", "sana_1600m", "flux_dev", "llama3_8b"} <= models
    sana = [c.knobs for c in cases if c.model == "sana_1600m"]
    assert {k.get("batch_size", 1) for k in sana} >= {1, 4, 8}
    assert {k.get("checkpointing", False) for k in sana} == {False, True}
    assert len({k.get("precision", "bf16") for k in sana}) >= 2
    assert len({k.get("optimizer", "adamw") for k in sana}) >= 3
    assert any(c.knobs.get("swap_blocks") for c in cases if c.model == "flux_dev")
    assert any(c.knobs.get("train_mode") == "lora" for c in cases if c.model == "llama3_8b")
    assert {c.target for c in cases} >= {None, "a40", "rtx4090"}  # emulated smaller targets
    assert len({c.key("h100_80") for c in cases}) == len(cases)  # every case has its own row


def test_a_bad_case_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "cases:\n  - model: tiny_mlp\n  - model: tiny_mlp\n    vary: {optimizer: [adamw, adam]}\n"
    )
    done = in_process("calibrate", f"set={bad}", "measure=cpu", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "case 2" in done.stderr and "'adam'" in done.stderr and "adamw8bit" in done.stderr


def test_without_a_gpu_measure_cuda_says_what_to_do(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = in_process("calibrate", "gpu=h100_80", cwd=tmp_path)
    assert done.returncode == 2 and "measure=cpu" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "calibration").exists()


def test_published_rows_rerun_for_real_are_cases_named_by_their_ids(tmp_path: Path) -> None:
    """`set=published rerun=true`: each row's closest knobs on its own card (emulated on a larger
    GPU), simulated and run for real, into calibration/<gpu>-published.csv."""
    done = in_process(
        "calibrate", "set=published", "rerun=true", "only=[N-OTI1,ST-SD3-01-h100]",
        "dry_run=true", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("[1/2] N-OTI1: sdxl@rtx4090 batch_size=4 ")
    assert "optimizer_impl=for_loop precision=fp16" in lines[0]
    assert lines[1].startswith("[2/2] ST-SD3-01-h100: sd35_medium@h100_80 ")
    assert lines[2] == "2 cases; the CSV would be calibration/h100_80-published.csv"


def test_a_dry_run_of_the_published_set_counts_it_and_says_what_the_rest_need(
    tmp_path: Path,
) -> None:
    from autofit.calibration.published import load_published

    rows = load_published()
    done = in_process("calibrate", "set=published", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    expressible = sum(r.expressible for r in rows)
    (count,) = [i for i, line in enumerate(lines) if " rows expressible; " in line]
    assert lines[count].startswith(f"{expressible} of {len(rows)} rows expressible")
    assert (
        lines[count + 1] == f"not expressible ({len(rows) - expressible} rows), by what they need:"
    )
    grouped = [int(line.split()[0]) for line in lines[count + 2 :]]
    assert sum(grouped) == len(rows) - expressible and grouped == sorted(grouped, reverse=True)


@pytest.mark.parametrize(
    ("words", "named"),
    [
        (["set=tiny", "rerun=true"], "set='tiny'"),
        (["set=tiny", "only=[PF2]"], "only="),
        (["set=published", "rerun=true", "only=[NOPE]"], "only=NOPE"),
    ],
    ids=["rerun-of-a-set", "only-of-a-set", "unknown-row"],
)
def test_rerun_and_only_belong_to_the_published_set(
    tmp_path: Path, words: list[str], named: str
) -> None:
    done = in_process("calibrate", *words, "measure=cpu", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert named in done.stderr


@pytest.mark.long
def test_calibrating_against_real_cpu_tensors_writes_rows_and_figures_and_resumes(
    tmp_path: Path,
) -> None:
    cases = tmp_path / "two.yaml"
    cases.write_text(TWO_CASES)
    out = tmp_path / "cal.csv"
    done = in_process(
        "calibrate", "gpu=a40", f"set={cases}", "measure=cpu", f"out={out}", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["batch_size"] for r in rows] == ["1", "8"]
    for r in rows:
        assert r["sim_outcome"] == r["real_outcome"] == "ok"
        # The simulator's fake tensors and the CPU's real ones go through the same accounting:
        # they agree to the byte (what a GPU adds is what measure=cuda is for).
        assert r["sim_peak_bytes"] == r["real_peak_bytes"] and float(r["peak_error"]) == 0.0
        assert r["throughput_error"] == ""  # a CPU's speed says nothing of a GPU's
        assert r["torch"] and r["device"] == "cpu"
        assert int(r["sim_context_bytes"]) == 500 * 2**20  # the A40 entry's estimate
    assert int(rows[1]["real_allocated_bytes"]) > int(rows[0]["real_allocated_bytes"])
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["figures"]["peak"]["n"] == 2 and summary["figures"]["false_fits"] == []
    assert "peak_bytes      median |error| 0.0%" in done.stdout

    again = in_process(
        "calibrate", "gpu=a40", f"set={cases}", "measure=cpu", f"out={out}", cwd=tmp_path
    )
    assert again.returncode == 0 and "2 already there are kept" in again.stdout
    assert "[1/2]" not in again.stdout  # nothing probed again
    assert len(list(csv.DictReader(out.open()))) == 2

    # A row whose real run crashed (a bug since fixed, say) says nothing: it is run again, once.
    rows = list(csv.DictReader(out.open()))
    rows[0].update(real_outcome="crash", real_peak_bytes="", real_error="AssertionError: x")
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    third = in_process(
        "calibrate", "gpu=a40", f"set={cases}", "measure=cpu", f"out={out}", cwd=tmp_path
    )
    assert third.returncode == 0, third.stderr
    assert "1 already there are kept, 1 that crashed or timed out are run again" in third.stdout
    assert "[1/2]" in third.stdout and "[2/2]" not in third.stdout
    rows = list(csv.DictReader(out.open()))
    assert sorted(r["batch_size"] for r in rows) == ["1", "8"]
    assert {r["real_outcome"] for r in rows} == {"ok"}


def test_figures_count_false_fits_and_errors() -> None:
    def row(case: str, sim: str, real: str, peak: str = "", speed: str = "") -> dict[str, str]:
        return {"case": case, "sim_outcome": sim, "real_outcome": real, "peak_error": peak,
                "allocated_error": peak, "throughput_error": speed}  # fmt: skip

    result = figures(
        [
            row("a", "ok", "ok", "0.01", "-0.10"),
            row("b", "ok", "ok", "-0.03", "0.20"),
            row("c", "ok", "ok", "0.02"),
            row("d", "ok", "oom"),
            row("e", "oom", "ok"),
            row("f", "ok", "crash"),
        ]
    )
    assert result["peak"]["n"] == 3
    assert result["peak"]["median_abs"] == pytest.approx(0.02)
    assert result["peak"]["max_abs"] == pytest.approx(0.03)
    assert result["throughput"]["median_abs"] == pytest.approx(0.15)
    assert result["false_fits"] == ["d"] and result["false_ooms"] == ["e"]
    assert result["unanswered"] == ["f: simulated ok, real crash"]


@pytest.mark.cuda
def test_calibrating_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "cal.csv"
    done = autofit("calibrate", "gpu=l4", "set=tiny", f"out={out}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(load_set("tiny"))
    for r in rows:
        assert r["real_outcome"] == "ok", r["real_error"]
        assert r["cuda"] and r["driver"] and r["device"] != "cpu"
        assert int(r["real_reserved_bytes"]) >= int(r["real_allocated_bytes"]) > 0
        assert int(r["real_context_bytes"]) > 0  # measured, where the simulator has an estimate


def test_a_calibration_begun_before_a_knob_existed_keeps_its_rows(tmp_path: Path) -> None:
    from autofit.calibration.rows import append_row, columns, read_rows

    path = tmp_path / "old.csv"
    older = [c for c in columns() if c != "ema"]  # written by an autofit without the ema knob
    path.write_text(
        ",".join(older) + "\n" + ",".join("1" if c == "case" else "x" for c in older) + "\n"
    )
    append_row(path, {c: "2" if c == "case" else "y" for c in columns()})
    rows = read_rows(path)
    assert [r["case"] for r in rows] == ["1", "2"]
    assert rows[0]["ema"] == "" and rows[1]["ema"] == "y"
    assert all(rows[0][c] == "x" for c in older if c != "case")
