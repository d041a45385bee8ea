"""The published set (calibration/published.csv): its rows are well formed, and the simulator
stays within the issue's bounds on a fast subset of them. The whole set runs in
`benchmarks/published_set.py`."""

from __future__ import annotations

import pytest

from autofit.calibration.published import MEASURES, load_published, published_figures, simulate_rows


@pytest.fixture(scope="module")
def rows() -> list:
    return load_published()


def test_every_row_names_its_source_and_what_its_figure_is(rows: list) -> None:
    assert len(rows) >= 40
    for row in rows:
        assert row.settings["source"].strip(), row.id
        assert row.measure in MEASURES, row.id
        assert row.settings["measure_note"].strip() or row.measure in ("ran", "oom"), row.id
        # A figure is a number for the measures that have one, and absent for ran / oom.
        assert (row.figure_bytes is None) == (row.measure in ("ran", "oom")), row.id
        # Each row either says how autofit runs it or what autofit lacks to run it.
        assert row.expressible or row.needs, row.id


def test_the_set_covers_every_family_autofit_has(rows: list) -> None:
    families = {row.family for row in rows}
    assert {"llm", "sana", "sd3", "sdxl", "flux"} <= families


@pytest.mark.long
def test_a_fast_subset_stays_within_the_bounds() -> None:
    # An LLM row measured by reserved bytes, a diffusion row by allocated bytes, and a run the
    # source saw run out of memory: one of each kind of comparison.
    chosen = {r.id: r for r in load_published()}
    subset = [chosen[i] for i in ("PF2", "ST-SD3-03-l40s", "DF-15")]
    outcomes = simulate_rows(subset)
    figures = published_figures(outcomes, subset)
    assert figures["crashed"] == []
    assert figures["false_fits"] == [] and figures["false_ooms"] == []
    assert figures["compared"] == 2 and figures["throughput_compared"] == 2
    for outcome in outcomes:
        if outcome["error"] is not None:
            assert abs(outcome["error"]) <= 0.05, outcome
        if outcome["throughput_error"] is not None:
            assert abs(outcome["throughput_error"]) <= 0.20, outcome


def test_published_speeds_are_samples_per_second_of_the_autofit_run(rows: list) -> None:
    by_id = {r.id: r for r in rows}
    # 7075 tokens/s at 4096 tokens a sample; 0.529 s per optimizer step of 3 samples; 41 minutes
    # for 700 optimizer steps of 4 accumulated samples.
    assert by_id["TF2"].samples_per_s == pytest.approx(7075 / 4096)
    assert by_id["ST-SD3-01-h100"].samples_per_s == pytest.approx(3 / 0.529)
    assert by_id["HF-1"].samples_per_s == pytest.approx(700 * 4 / (41 * 60), rel=1e-3)


def test_a_reserved_figure_is_bounded_by_the_card_it_was_taken_on() -> None:
    """With memory to spare the run would reserve 90 GiB; it fits an 80 GB card (its least need
    is under it), where the allocator gives its cache back when short: the reserved figure
    taken there is compared with what the card holds besides the CUDA context. A run that does
    not fit keeps its own figure; an allocated figure is never bounded."""
    from autofit.calibration.published import PublishedRow, simulated_figure
    from autofit.gpus import load_gpu
    from autofit.records.probe import Outcome, ProbeResult

    card = load_gpu("h100_80").memory_bytes
    context = 500 << 20

    def result(needs: int) -> ProbeResult:
        return ProbeResult(
            outcome=Outcome.OK, backend="simulate", gpu="h100_80", model="llama3_8b", config={},
            budget_bytes=card, peak_bytes=needs, peak_allocated_bytes=70 << 30,
            peak_reserved_bytes=90 << 30, overhead_detail={"cuda_context": context},
        )  # fmt: skip

    def row(measure: str) -> PublishedRow:
        return PublishedRow("X", "llm", measure, 1 << 30, "llama3_8b", "h100_80")

    assert simulated_figure(row("reserved"), result(75 << 30)) == card - context
    assert simulated_figure(row("nvidia_smi"), result(75 << 30)) == card
    assert simulated_figure(row("reserved"), result(card + 1)) == 90 << 30
    assert simulated_figure(row("allocated"), result(75 << 30)) == 70 << 30
