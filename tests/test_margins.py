"""The default margin earned from the published set's errors (autofit/calibration/margins.py): a
class of run takes the smallest margin at which none of its published runs is a false fit, a
class with little evidence the widest, and every command states the margin it used."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from autofit.calibration.margins import (
    FLOOR,
    MIN_EVIDENCE,
    RUN_CLASSES,
    chosen_margin,
    classes_spanned,
    derive_margins,
    load_figures,
    load_margins,
    run_class,
)  # fmt: skip
from autofit.calibration.published import judged, load_published
from autofit.gpus import load_gpu
from autofit.models import load_preset
from tests.helpers import autofit

GIB = 1 << 30


def test_a_run_s_class_follows_its_family_mode_and_sharding() -> None:
    assert run_class("flux", {"train_mode": "lora"}) == "diffusion_adapter"
    assert run_class("sdxl", {"train_mode": "full"}) == "diffusion_full"
    assert run_class("llm", {"train_mode": "qlora"}) == "llm_kbit"
    assert run_class("llm", {"train_mode": "dora"}) == "llm_adapter"
    assert run_class("llm", {"train_mode": "peft"}) == "llm_peft"
    assert run_class("llm", {}) == "llm_full"  # train_mode's default is full
    assert run_class("llm", {"train_mode": "lora", "zero_stage": 2, "world_size": 8}) == "zero"
    assert run_class("sana", {"fsdp": "full_shard", "world_size": 2}) == "fsdp"
    assert run_class("custom", {"train_mode": "lora"}) == "other"
    spanned = classes_spanned("llm", {"train_mode": ("lora", "qlora"), "zero_stage": (0,)})
    assert spanned == ["llm_adapter", "llm_kbit"]


def _outcome(id_: str, klass: str, gpu: str, **fields: Any) -> dict[str, Any]:
    base = {"id": id_, "run_class": klass, "gpu": gpu, "crash": "", "error": None,
            "measure": "allocated", "simulated_bytes": None, "published_bytes": None,
            "sim_peak_bytes": None, "sim_outcome": "ok"}  # fmt: skip
    return {**base, **fields}


def _figure(id_: str, klass: str, error: float, gpu: str = "a100_80") -> dict[str, Any]:
    published = 20 * GIB
    return _outcome(id_, klass, gpu, error=error, published_bytes=published,
                    simulated_bytes=round(published * (1 + error)))  # fmt: skip


def test_a_class_s_margin_covers_its_worst_under_prediction_and_its_out_of_memory_runs() -> None:
    # Five LoRA figures, the worst 7.2% low: 7.5% covers it (rounded up to half a percent).
    lora = [
        _figure(f"L{i}", "llm_adapter", e) for i, e in enumerate((0.01, -0.02, -0.072, 0.0, -0.03))
    ]
    # A 4-bit run that ran out of memory on a 24 GB card, simulated at 21 GiB of its 23.99: only
    # a margin over 12.5% calls it out of memory.
    card = load_gpu("rtx4090")
    oom = _outcome("K0", "llm_kbit", "rtx4090", measure="oom", sim_peak_bytes=21 * GIB)
    table = derive_margins([*lora, oom], {"L1": True, "L3": True})
    assert table["llm_adapter"].needed == pytest.approx(0.075)
    assert table["llm_adapter"].margin == pytest.approx(0.075)
    assert table["llm_adapter"].held_out == 2 and table["llm_adapter"].figures == 5
    assert table["llm_adapter"].worst_under == pytest.approx(0.072)
    assert table["llm_adapter"].set_by == "L2" and table["llm_kbit"].set_by == "K0"
    needed = 1 - (21 * GIB + card.reserved_bytes) / card.memory_bytes
    assert needed < table["llm_kbit"].needed <= needed + 0.005
    # One run is too little evidence: the class takes the widest margin of any (its own here),
    # and a class no run backs takes it too, never less than the floor.
    assert not table["llm_kbit"].enough and table["llm_kbit"].margin == table["llm_kbit"].needed
    assert table["diffusion_full"].runs == 0
    assert table["diffusion_full"].margin == max(c.needed for c in table.values())
    assert min(c.margin for c in table.values()) >= FLOOR


def test_a_verdict_is_judged_at_a_margin_by_its_simulated_peak() -> None:
    under = _figure("F", "llm_adapter", -0.10)  # the simulation 10% low
    assert judged(under, 0.05)["false_fit"]  # 5% does not cover it
    assert not judged(under, 0.11)["false_fit"]
    ran = _outcome("R", "llm_adapter", "rtx4090", measure="ran", sim_peak_bytes=22 * GIB)
    assert not judged(ran, 0.05)["false_oom"] and judged(ran, 0.10)["false_oom"]
    oom = _outcome("O", "llm_adapter", "rtx4090", measure="oom", sim_peak_bytes=22 * GIB)
    assert judged(oom, 0.05)["false_fit"] and not judged(oom, 0.10)["false_fit"]


def test_auto_takes_the_class_margin_and_a_search_the_widest_of_its_classes() -> None:
    table = load_margins()
    for name in RUN_CLASSES:
        chosen = chosen_margin("auto", "llm", [name])
        assert chosen.value == table[name].margin
        c = table[name]
        assert f"class {name}: {c.runs} published runs ({c.figures} with a figure)" in chosen.basis
        if c.set_by:
            assert f"; set by {c.set_by}" in chosen.basis
        if not table[name].enough:
            assert f"fewer than {MIN_EVIDENCE}" in chosen.basis
    both = chosen_margin("auto", "llm", ["llm_adapter", "llm_kbit"])
    assert both.value == max(table["llm_adapter"].margin, table["llm_kbit"].margin)
    assert "the widest of the search's classes llm_adapter, llm_kbit" in both.basis
    assert chosen_margin(0.12, "llm", ["llm_kbit"]).words() == "12% (as set)"


def test_the_committed_table_counts_the_published_set_as_it_stands() -> None:
    """calibration/margins.yaml was derived from today's published set: each class counts the
    expressible rows of that class (a row added since, or a changed `use`, needs a rerun of
    `autofit calibrate set=published`)."""
    rows = [r for r in load_published() if r.expressible]
    counted: Counter[str] = Counter()
    held: Counter[str] = Counter()
    for row in rows:
        klass = run_class(load_preset(row.model).family, row.knobs)
        counted[klass] += 1
        held[klass] += row.held_out
    table = load_margins()
    assert {n: c.runs for n, c in table.items() if c.runs} == dict(counted)
    assert {n: c.held_out for n, c in table.items() if c.held_out} == {
        k: v for k, v in held.items() if v
    }
    figures = load_figures()
    assert figures["all"]["runs"] == len(rows)
    assert figures["held_out"]["runs"] == sum(r.held_out for r in rows)
    assert figures["all"]["false_fits"] == 0  # the margins are derived to leave none


@pytest.mark.long
def test_probe_states_its_margin_and_refuses_a_bad_one(tmp_path: Path) -> None:
    done = autofit("probe", "model=tiny_mlp", "gpu=rtx4090", "out=r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    other = load_margins()["other"]
    assert f"  margin     {other.margin * 100:g}% (class other: " in done.stdout
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["budget_bytes"] == load_gpu("rtx4090").budget_bytes(other.margin)
    bad = autofit("probe", "model=tiny_mlp", "gpu=rtx4090", "margin=wide", cwd=tmp_path)
    assert (
        bad.returncode != 0
        and "margin='wide' is not valid; expected auto or a fraction" in bad.stderr
    )
