"""Host memory: every probe reports the host's peak (pinned and pageable), a host budget per run,
and `oom_host` when the run does not fit it; the search treats that like `oom`.

Exact bytes on models small enough to count by hand: tiny_mlp's four tensors are 64x256 and
256x64 weights and biases of 256 and 64 (33,088 parameters); pinned host memory is rounded up to
the next power of two, as torch's caching host allocator rounds it (tracker.py)."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import in_process, spec, with_blocks
from test_search_engine import CurveProber, truth
from test_search_engine import space as synthetic_space

from autofit.backends import cpu, simulate
from autofit.emulations.zero import share
from autofit.host import GIB, HOST_MEMORY_GIB, NOT_STATED, host_memory, loader_shard_bytes
from autofit.probe.summary import summarize
from autofit.probe.worker import execute
from autofit.records.probe import Outcome, ProbeResult
from autofit.run_state import logical_numel
from autofit.search.engine import Search
from autofit.search.keys import probe_key
from autofit.search.pareto import best_config, pareto_front
from autofit.simulator.tracker import round_pinned

MLP_SHAPES = [(256, 64), (256,), (64, 256), (64,)]  # hidden.0 weight and bias, out weight and bias
MLP_PARAMS = 64 * 256 + 256 + 256 * 64 + 64  # 33,088


def _bytes(shape: tuple[int, ...], element: int) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * element


def test_pinned_requests_round_to_a_power_of_two() -> None:
    assert [round_pinned(n) for n in (0, 1, 512, 513, 65536, 66176)] == [
        0, 1, 512, 1024, 65536, 131072,
    ]  # fmt: skip


def test_a_run_with_nothing_on_the_host_holds_no_host_memory() -> None:
    measured = simulate.measure(spec("tiny_mlp"))
    assert (measured.host_peak_bytes, measured.host_pinned_bytes) == (0, 0)


def test_ema_on_the_cpu_holds_a_pinned_copy_and_one_weight_in_flight() -> None:
    """The average is one pinned fp32 copy of the weights (tiny_mlp's sizes are powers of two:
    no rounding shows); each update copies one weight at a time to the host, and the previous
    weight's copy is freed once the next exists, so two are in flight at most: the 64x256 weight
    and a bias, 65,536 + 1,024 bytes."""
    measured = simulate.measure(spec("tiny_mlp", ema="cpu"))
    assert measured.host_pinned_bytes == 4 * MLP_PARAMS == 132_352
    assert measured.host_pageable_bytes == 65_536 + 1_024
    assert measured.host_peak_bytes == 198_912
    assert measured.host_phase == "optimizer"
    assert measured.host_phase_peaks["setup"] == 132_352  # the average, made as the run starts


def test_ema_on_the_cpu_of_a_model_with_odd_sizes_pays_the_pinned_rounding() -> None:
    run, tracker = simulate.trace(spec("tiny_sana", ema="cpu"))
    params = run.trainable_parameters()
    raw = sum(p.numel() * p.element_size() for p in params)
    pinned = sum(round_pinned(p.numel() * p.element_size()) for p in params)
    report = tracker.host_report()
    assert report.pinned_bytes == pinned > raw


def test_zero_offload_keeps_deepspeeds_pinned_shares_and_pageable_moments() -> None:
    """ZeRO-2 with offload_optimizer=cpu on one GPU, tiny_mlp in bf16: DeepSpeed pins the fp32
    master share (4 B/param), the fp32 gradient share (4) and a 16-bit share (2: the emulation's
    16-bit gradients, DeepSpeed's param_buffer_of_bit16_for_cpu_offload), each one flat tensor;
    DeepSpeedCPUAdam's moments (2 x 4) are zeros_like of the master, pageable, and so is the step
    counter (4 bytes). Updated weights go back through one 16-bit host copy of a weight at a time
    (the largest, 64x256: 32,768 bytes)."""
    measured = simulate.measure(
        spec("tiny_mlp", precision="bf16", zero_stage=2, offload_optimizer="cpu")
    )
    assert measured.host_pinned_bytes == 2 * round_pinned(4 * MLP_PARAMS) + round_pinned(
        2 * MLP_PARAMS
    )
    assert measured.host_pinned_bytes == 2 * 262_144 + 131_072
    assert measured.host_pageable_bytes == 8 * MLP_PARAMS + 4 + 2 * 64 * 256
    assert measured.host_peak_bytes == 952_836
    assert measured.host_phase == "optimizer"


def _swap_figures() -> tuple[Any, Any, list[Any]]:
    run, tracker = simulate.trace(spec("tiny_sana", swap_blocks=1))
    block = list(run.model.transformer_blocks[1].parameters())
    return run, tracker, block


def test_block_swap_holds_two_blocks_pinned_and_the_host_update_pageable() -> None:
    """tiny_sana with its last block swapped, full fine-tune: the block's weights live in pinned
    host memory, and an exchange makes the evicted block's pinned copies before it frees the
    incoming block's (sd-scripts does the same: .to("cpu", non_blocking=True) for the evicted
    weights, then the incoming block's copy dropped), so the host allocator's cache ends up with
    two blocks' worth, each tensor rounded to a power of two. The swapped block is updated on the
    host: its gradients (4 B/param) and AdamW's moments and step counters there, pageable."""
    run, tracker, block = _swap_figures()
    raw = sum(p.numel() * p.element_size() for p in block)
    report = tracker.host_report()
    assert report.pinned_bytes == 2 * sum(round_pinned(p.numel() * p.element_size()) for p in block)
    assert report.pageable_bytes == 3 * raw + 4 * len(block)
    assert report.peak_bytes == 403_532
    # First reached in the first step's update, when the moments join the host gradients.
    assert report.phase == "optimizer"


def test_the_model_as_a_trainer_loads_it_counts_one_shard_at_a_time() -> None:
    """swap_blocks builds the whole model on the host and loads all but the swapped block onto
    the GPU. A trainer reads a checkpoint a shard at a time: with a shard smaller than the model
    the setup peak is one shard of loader working set on top of what stays (the swapped block's
    pinned copy, made while its host-built weights were still there); tiny_sana is far smaller
    than diffusers' 10 GB shard, so by default the whole model counts."""
    run, tracker, block = _swap_figures()
    model = sum(p.numel() * p.element_size() for p in run.model.parameters())
    pinned_block = sum(round_pinned(p.numel() * p.element_size()) for p in block)
    assert tracker.host_report(loader_cap=4096).phase_peaks["setup"] == pinned_block + 4096
    assert tracker.host_report().phase_peaks["setup"] == model  # no cap: all of it
    assert model < loader_shard_bytes("sana")
    assert tracker.host_report(loader_shard_bytes("sana")).phase_peaks["setup"] == model
    assert loader_shard_bytes("llm") == 5 * 10**9 and loader_shard_bytes("flux") == 10 * 10**9


@pytest.mark.parametrize("backend", ["simulate", "cpu"])
@pytest.mark.parametrize("budget,phase", [(150_000, "optimizer"), (100_000, "setup")])
def test_a_host_budget_too_small_is_oom_host(backend: str, budget: int, phase: str) -> None:
    probe = dataclasses.replace(
        spec("tiny_mlp", backend=backend, ema="cpu"), host_memory_bytes=budget
    )
    result = execute(probe)
    assert result.outcome is Outcome.OOM_HOST, result.error
    assert result.phase == phase  # where the host first went over
    assert (result.host_peak_bytes, result.host_budget_bytes) == (198_912, budget)
    assert result.peak_bytes is not None and result.peak_bytes <= result.budget_bytes
    text = summarize(result)
    assert "host budget" in text and "does not fit" in text
    roomy = execute(dataclasses.replace(probe, host_memory_bytes=198_912))
    assert roomy.outcome is Outcome.OK


def test_the_cpu_backend_counts_the_host_as_simulate_does() -> None:
    probe = spec("tiny_sana", ema="cpu", swap_blocks=1)
    simulated = simulate.measure(probe)
    real = cpu.measure(dataclasses.replace(probe, backend="cpu"))
    assert real.host_peak_bytes == simulated.host_peak_bytes
    assert real.host_pinned_bytes == simulated.host_pinned_bytes


def test_without_a_stated_budget_the_summary_says_so() -> None:
    result = execute(spec("tiny_mlp", ema="cpu"))
    assert result.outcome is Outcome.OK and result.host_budget_bytes is None
    assert f"host budget: {NOT_STATED}" in summarize(result)


# -- DeepSpeed's own CPU-memory estimates ---------------------------------------------------


def _zero_host(stage: int, offload_params: str) -> tuple[Any, Any, int]:
    probe = spec(
        "sana_1600m", resolution=256, zero_stage=stage, world_size=4,
        offload_optimizer="cpu", offload_params=offload_params,
    )  # fmt: skip
    probe = dataclasses.replace(probe, model=with_blocks(probe, 2).model)
    run, tracker = simulate.trace(probe)
    host = host_memory(tracker, probe)
    steps = max(peak for phase, peak in host.phase_peaks.items() if phase != "setup")
    return run, host, steps


@pytest.mark.parametrize(
    "stage,offload_params",
    [
        pytest.param(2, "none", marks=pytest.mark.slow),  # ~35 s: sana_1600m's widths in stage 2
        (3, "none"),
        (3, "cpu"),
    ],
)
def test_zero_offload_host_memory_against_deepspeeds_estimates(
    stage: int, offload_params: str
) -> None:
    """DeepSpeed's estimate_zero{2,3}_model_states_mem_needs give the host memory of a node's
    model states: per parameter, 16 bytes with offload_optimizer=cpu (fp32 master weights, fp32
    gradients, two fp32 Adam moments), 18 with ZeRO-3's offload_param=cpu too (the 16-bit
    weights), times additional_buffer_factor=1.5, its allowance for buffers. (Without ZeRO-3's
    zero.Init its stage-2 figure is max(4 x GPUs per node, 16): each GPU's process holds the
    model in fp32 while loading, 16 B/param at 4 GPUs; autofit's ZeRO-2 builds the model on the
    GPU and has no host loader.)

    autofit's node figure is the rank's host memory times the 4 processes on the machine, during
    the steps (setup, with its loader, is apart). Against DeepSpeed's states without the 1.5:
    - it holds all of DeepSpeed's bytes, plus, in stage 2, DeepSpeed's pinned 16-bit staging
      share of the weights (2 B/param; stage_1_and_2.py param_buffer_of_bit16_for_cpu_offload),
      which the estimate leaves out; plus the step counter and one weight's 16-bit host copy on
      its way back to the GPU;
    - the pinned shares (master and gradients; stage 2's staging share; ZeRO-3's weight shares)
      are rounded up to powers of two by torch's caching host allocator, which DeepSpeed pins
      through (get_accelerator().pin_memory); the moments are DeepSpeedCPUAdam's zeros_like of
      the master, pageable, as is what they hold exactly.
    Tolerance: without the rounding autofit's bytes are DeepSpeed's per-parameter bytes within
    0.01% (the even split's padding and the small extras); with it, the node stays within
    DeepSpeed's own 1.5 allowance for this model."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    gpus = 4
    run, host, steps = _zero_host(stage, offload_params)
    total = run.param_count
    if stage == 2:
        cpu_mem, _ = estimate_zero2_model_states_mem_needs(total, gpus, 1, cpu_offload=True)
    else:
        largest = max(
            sum(logical_numel(p) for p in m.parameters(recurse=False)) for m in run.model.modules()
        )
        cpu_mem, _, _ = estimate_zero3_model_states_mem_needs(
            total, largest, gpus, 1, cpu_offload=True,
            cpu_offload_params=offload_params == "cpu",
        )  # fmt: skip
    states = cpu_mem / 1.5  # DeepSpeed's bytes per parameter, without its buffer allowance

    shares = [share(logical_numel(p), gpus) for p in run.trainable_parameters()]
    s = sum(shares)  # elements of this rank's flat partition
    staging = 2 * s if stage == 2 else 0
    weights = 2 * s if offload_params == "cpu" else 0
    unrounded = gpus * (4 * s + 4 * s + 8 * s + staging + weights)
    assert unrounded == pytest.approx(states + gpus * staging, rel=1e-4)

    pinned = 2 * round_pinned(4 * s) + (round_pinned(staging) if staging else 0)
    if weights:  # ZeRO-3 pins each weight's share on its own
        pinned += sum(
            round_pinned(2 * share(logical_numel(p), gpus)) for p in run.model.parameters()
        )
    in_flight = steps - gpus * (pinned + 8 * s + 4)  # updated weights' 16-bit host copies
    assert 0 < in_flight <= gpus * 2 * max(shares)  # one weight's share at a time, at most
    assert states <= steps <= cpu_mem


# -- the search --------------------------------------------------------------------------------

HOST_PER_SAMPLE = GIB  # a made-up run whose host memory grows with the batch
HOST_BUDGET = 5 * GIB


class HostCurveProber(CurveProber):
    """The synthetic curve of test_search_engine, with host memory of 1 GiB per sample against a
    5 GiB host budget: batches above 5 fit the GPU but not the host."""

    def __call__(self, knobs: dict[str, Any]) -> tuple[ProbeResult, bool]:
        result, reused = super().__call__(knobs)
        result.host_peak_bytes = HOST_PER_SAMPLE * result.config["batch_size"]
        result.host_budget_bytes = HOST_BUDGET
        if result.outcome is Outcome.OK and result.host_peak_bytes > HOST_BUDGET:
            result.outcome = Outcome.OOM_HOST
        return result, reused


def test_the_search_keeps_to_the_runs_the_host_can_hold() -> None:
    prober = HostCurveProber()
    result = Search(synthetic_space(), prober, jobs=1).run()  # type: ignore[arg-type]
    over = [r for r in result.results if r.outcome is Outcome.OOM_HOST]
    assert over  # some batches fit the GPU and not the host ...
    for combination in result.combinations:  # ... so no combination goes beyond 5
        if combination.status == "exact":
            gpu_only = truth(combination.knobs, combination.resolution, 64)
            assert gpu_only is not None
            assert combination.best_batch == min(gpu_only, 5), combination
    front = [r for runs in pareto_front(result.results).values() for r in runs]
    assert front and all(r.outcome is Outcome.OK for r in front)
    assert result.best is not None and result.best.config["batch_size"] <= 5
    assert result.best is best_config(result.results, 1024, 1)


def _old_format(folder: Path) -> None:
    """Rewrite a study's files as an autofit from before host memory writes them."""
    summary = json.loads((folder / "summary.json").read_text())
    summary.pop("schema_version", None)  # from before it was written too
    summary.pop("host_budget_bytes", None)
    for run in [summary.get("best"), *summary.get("pareto", [])]:
        if run:
            run.pop("host_peak_bytes", None)
            run.pop("host_pinned_bytes", None)
    (folder / "summary.json").write_text(json.dumps(summary))
    for name in ("trials.csv", "pareto.csv"):
        with (folder / name).open(newline="") as f:
            rows = list(csv.DictReader(f))
        columns = [c for c in rows[0] if not c.startswith("host_")]
        with (folder / name).open("w", newline="") as f:
            writer = csv.DictWriter(f, columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


@pytest.mark.long
def test_a_search_with_a_small_host_budget_leaves_out_what_the_host_cannot_hold(
    tmp_path: Path,
) -> None:
    """tiny_mlp with EMA off or on the CPU: the CPU copy needs 198,912 bytes of host memory, over
    a 0.0001 GiB (107,374-byte) budget, so every EMA-on-CPU probe is oom_host and the best run
    keeps no EMA; the files say so, and read back once rewritten as an older autofit wrote them."""
    (tmp_path / "space.yaml").write_text(
        "batch_size: {min: 1, max: 2}\nresolution: [x1]\nknobs:\n  ema: ['off', cpu]\n"
    )
    search = in_process(
        "search", "model=tiny_mlp", "gpu=a40", "backend=simulate", "space=space.yaml",
        "study=host", "jobs=1", "host_memory_gib=0.0001", cwd=tmp_path,
    )  # fmt: skip
    assert search.returncode == 0, search.stderr
    assert "host budget" in search.stdout
    folder = tmp_path / "results" / "host"
    with (folder / "trials.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    outcomes = {(row["ema"], row["outcome"]) for row in rows}
    assert ("cpu", "oom_host") in outcomes and ("cpu", "ok") not in outcomes
    assert {row["host_peak_bytes"] for row in rows if row["ema"] == "cpu"} == {"198912"}
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["best"]["config"]["ema"] == "off"
    (lost,) = [c for c in summary["combinations"] if c["knobs"]["ema"] == "cpu"]
    assert lost["status"] == "none_fit" and "host memory (oom_host)" in lost["reason"]
    assert summary["host_budget_bytes"] == int(0.0001 * GIB)

    _old_format(folder)
    assert in_process("report", "study=host", cwd=tmp_path).returncode == 0
    exported = in_process("export", "target=hydra", "study=host", "out=x", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr


def test_results_and_keys_from_before_host_memory_still_read() -> None:
    old = {"outcome": "ok", "backend": "simulate", "gpu": "a40", "model": "m",
           "config": {"batch_size": 1, "resolution": 64}, "budget_bytes": 100, "peak_bytes": 50}  # fmt: skip
    result = ProbeResult.from_dict(old)
    assert result.host_peak_bytes is None and "host" not in summarize(result).split("\n")[-1]
    knobs = {"batch_size": 1}
    # No host budget stated: the key an older autofit wrote, so its probes are reused.
    assert probe_key(knobs, "simulate", 100, "m", "g") == probe_key(
        knobs, "simulate", 100, "m", "g", None
    )
    assert "host_budget" not in probe_key(knobs, "simulate", 100, "m", "g")
    assert probe_key(knobs, "simulate", 100, "m", "g", 1 << 30) != probe_key(
        knobs, "simulate", 100, "m", "g"
    )


# -- the setting ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["-1", "0", "abc", "true", "inf"])
def test_a_bad_host_memory_gib_is_a_one_line_error(bad: str, tmp_path: Path) -> None:
    for command in ("probe", "search"):
        done = in_process(
            command, "model=tiny_mlp", "gpu=a40", "backend=simulate", f"host_memory_gib={bad}",
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        shown = lines[0].replace("'", "").lower()
        assert len(lines) == 1 and f"host_memory_gib={bad}" in shown, lines


def test_host_memory_gib_takes_positive_numbers() -> None:
    def check_host_memory(value: object) -> object:
        return HOST_MEMORY_GIB("host_memory_gib", value)

    assert check_host_memory(64) == 64.0 and check_host_memory(0.5) == 0.5
    assert check_host_memory(None) is None


def test_a_real_gpu_run_takes_the_process_figure_where_it_is_larger() -> None:
    """The cuda backend's reading of its own process (no GPU needed to read it): the peak resident
    set since the reset after the build, times the processes of the run, raises the ledger's
    figure; where the peak cannot be reset, the ledger stands alone."""
    from autofit.backends.cuda import _peak_rss, _reset_peak_rss, _with_process
    from autofit.simulator.tracker import HostReport

    ledger = HostReport(4096, 1024, 3072, 0, "optimizer", {"setup": 1024, "optimizer": 4096})
    assert _with_process(ledger, False, 2) is ledger
    if not _reset_peak_rss():
        pytest.skip("this kernel cannot reset the peak resident set size")
    raised = _with_process(ledger, True, 2)
    rss = _peak_rss()
    assert rss is not None and raised.peak_bytes <= 2 * rss  # the peak only grows since
    assert raised.peak_bytes > ledger.peak_bytes and raised.phase == "training steps (measured)"
    assert raised.pinned_bytes + raised.pageable_bytes == raised.peak_bytes


def test_under_zero3_rank_0_alone_reads_a_transformers_checkpoint_whole() -> None:
    """transformers under ZeRO-3 materialises every checkpoint file on rank 0 and gives the other
    ranks shapes only; otherwise each process reads a shard at a time."""
    from autofit.host import loader

    assert loader("llm", {"zero_stage": 3, "world_size": 8, "train_mode": "full"}) == (None, 1)
    assert loader("llm", {"zero_stage": 3, "world_size": 8, "train_mode": "qlora"}) == (
        5 * 10**9,
        8,
    )
    assert loader("sana", {"zero_stage": 3, "world_size": 8}) == (10 * 10**9, 8)
    assert loader("llm", {"zero_stage": 0, "world_size": 2}) == (5 * 10**9, 2)
    _, tracker, _ = _swap_figures()
    one = tracker.host_report()
    both = tracker.host_report(None, ranks=2, loader_ranks=1)
    # Setup: two processes' resident bytes, one process's loader (here the whole tiny model).
    assert both.phase_peaks["optimizer"] == 2 * one.phase_peaks["optimizer"]
    assert both.phase_peaks["setup"] < 2 * one.phase_peaks["setup"]


def test_a_simulated_card_is_held_to_the_ram_of_its_usual_machine(tmp_path: Path) -> None:
    """Without host_memory_gib=, a probe simulated for a card takes the RAM its entry states (a
    12 GB GeForce: a 32 GB home desktop; an A10G: AWS's 16 GiB g5.xlarge); the setting wins; a
    card file that states none has no host limit. (issue 41 item 8)"""
    from autofit.commands.probe import probe_settings, spec_of
    from autofit.config import compose_config
    from autofit.gpus import HOST_FIELDS, load_gpu
    from autofit.host import budget_words, host_budget_basis

    def budget(*overrides: str) -> int | None:
        cfg = compose_config("probe", ["model=tiny_mlp", "backend=simulate", *overrides])
        return spec_of(probe_settings(cfg)).host_memory_bytes

    assert budget("gpu=rtx3060_12") == 32 * GIB
    assert budget("gpu=a10g") == 16 * GIB
    assert budget("gpu=rtx3060_12", "host_memory_gib=64") == 64 * GIB
    card = {k: v for k, v in load_gpu("rtx3060_12").to_dict().items() if k not in HOST_FIELDS}
    (tmp_path / "card.yaml").write_text(json.dumps(card))
    assert budget(f"gpu={tmp_path / 'card.yaml'}") is None

    rtx = load_gpu("rtx3060_12")
    words = budget_words(32 * GIB, host_budget_basis(None, "simulate", rtx))
    assert words == (
        "32.00 GiB (a typical machine for rtx3060_12: a home desktop with 32 GB of RAM; "
        "set host_memory_gib= for yours)"
    )
    assert host_budget_basis(48.0, "simulate", rtx) == "as host_memory_gib= sets it"
    assert host_budget_basis(None, "cuda", rtx) == "this machine's RAM"
