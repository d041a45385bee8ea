"""ZeRO with LoRA and QLoRA, ZeRO-Infinity's NVMe offload and activation offloading: the bytes
each keeps where, counted on small models, the time the roofline gives their transfers, and each
combination that cannot run refused in one line."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import autofit, spec, with_blocks

from autofit.backends import cpu, simulate
from autofit.emulations.nvme import (
    MIN_AIO_BYTES,
    OPTIMIZER_BUFFER_COUNT,
    PARAM_BUFFER_COUNT,
    PARAM_BUFFER_SIZE,
    aligned,
    sub_groups,
)
from autofit.emulations.zero import REDUCE_BUCKET_ELEMENTS, share
from autofit.gpus import NVME_GBS, load_gpu
from autofit.knobs import REGISTRY, invalid_reason
from autofit.knobs.base import Refuse, Say, Subject
from autofit.knobs.offload_activations import ActivationOffload
from autofit.models import load_preset
from autofit.run_state import HostTraffic, logical_numel
from autofit.simulator.roofline import RooflineCounter
from autofit.simulator.tracker import round_allocation, round_pinned


def _sana(blocks: int, **knobs: object):
    """Sana 1600M's widths with a few blocks: tensors as large as the real model's."""
    return with_blocks(spec("sana_1600m", resolution=256, **knobs), blocks)


def _emulation(run):
    return run._stepper.optimizer


# -- ZeRO with LoRA and QLoRA ------------------------------------------------------------------


def test_zero2_with_lora_keeps_optimizer_state_and_gradients_for_the_adapters_only() -> None:
    run, tracker = simulate.trace(spec("tiny_sana", zero_stage=2, train_mode="lora"))
    adapters = run.trainable_parameters()
    assert adapters and all(
        "lora_" in n for n, p in run.model.named_parameters() if p.requires_grad
    )
    n = sum(p.numel() for p in adapters)
    # 16-bit adapters; fp32 master weights and two moments; 16-bit and fp32 gradient shares:
    # DeepSpeed's 4 + 16 bytes per trained parameter at one GPU, for the adapters alone.
    assert {p.dtype for p in adapters} == {torch.bfloat16}
    assert tracker.live_bytes("optimizer_state") == 3 * round_allocation(4 * n) + 512
    assert tracker.live_bytes("gradients") == round_allocation(2 * n) + round_allocation(4 * n)
    full, full_tracker = simulate.trace(spec("tiny_sana", zero_stage=2))
    every = sum(p.numel() for p in full.trainable_parameters())
    assert full_tracker.live_bytes("optimizer_state") == 3 * round_allocation(4 * every) + 512
    assert every > 3 * n


@pytest.mark.parametrize("checkpointing", [False, True])
def test_zero3_with_lora_partitions_the_frozen_base_too(checkpointing: bool) -> None:
    # With checkpointing the blocks' forward runs again in backward: the frozen weights it
    # gathers there are dropped again once their backward is done.
    run, tracker = simulate.trace(
        _sana(1, zero_stage=3, world_size=4, train_mode="lora", checkpointing=checkpointing)
    )
    emulation = _emulation(run)
    frozen = [p for p in run.model.parameters() if not p.requires_grad]
    assert frozen and all(p in emulation.shards for p in frozen)
    # Every weight is held as its quarter (DeepSpeed pads to an even split), adapters included.
    assert tracker.live_bytes("parameters") == sum(
        round_allocation(share(logical_numel(p), 4) * p.element_size())
        for p in run.model.parameters()
    )
    adapters = sum(share(logical_numel(p), 4) for p in run.trainable_parameters())
    assert tracker.live_bytes("optimizer_state") == 3 * round_allocation(4 * adapters) + 512
    whole, whole_tracker = simulate.trace(_sana(1, zero_stage=2, train_mode="lora"))
    assert run.param_count == whole.param_count  # weights counted, not the shards' elements
    assert tracker.live_bytes("parameters") < whole_tracker.live_bytes("parameters") / 3.9


def test_zero3_lora_with_checkpointing_regathers_the_frozen_norms_for_recomputation() -> None:
    """A language model's frozen norm weights are saved by the recomputed forward: they stay
    gathered for their backward (the recomputation's check sees the shapes it saw in forward),
    and only the shares are left after the step."""
    probe = with_blocks(
        spec("llama3_2_1b", resolution=128, checkpointing=True, zero_stage=3, world_size=2,
             train_mode="lora"),
        1,
    )  # fmt: skip
    run, tracker = simulate.trace(probe)
    assert tracker.live_bytes("parameters") == sum(
        round_allocation(share(logical_numel(p), 2) * p.element_size())
        for p in run.model.parameters()
    )


def test_zero3_with_qlora_partitions_the_packed_weights_in_the_16_bit_storage_dtype() -> None:
    run, tracker = simulate.trace(_sana(1, zero_stage=3, world_size=4, train_mode="qlora"))
    layers = [m for m in run.model.modules() if type(m).__name__ == "Nf4LinearLayout"]
    assert layers
    for layer in layers:  # bnb_4bit_quant_storage=bfloat16: four 4-bit values per element
        packed = (layer.in_features * layer.out_features + 1) // 2
        shard = _emulation(run).shards[layer.weight]
        assert shard.dtype == torch.bfloat16
        assert shard.numel() == share(-(-packed // 2), 4)
        assert logical_numel(layer.weight) == layer.in_features * layer.out_features
        # the quantization state (scales, codes) is no parameter: whole on every rank
        assert layer.absmax.numel() == -(-layer.in_features * layer.out_features // 64)
    lora, _ = simulate.trace(_sana(1, zero_stage=3, world_size=4, train_mode="lora"))
    assert run.param_count == lora.param_count
    assert run.trainable_param_count == lora.trainable_param_count


def test_zero2_with_qlora_keeps_the_4_bit_base_whole_on_each_gpu() -> None:
    run, tracker = simulate.trace(_sana(1, zero_stage=2, world_size=4, train_mode="qlora"))
    single, single_tracker = simulate.trace(
        _sana(1, zero_stage=2, world_size=1, train_mode="qlora")
    )
    assert tracker.live_bytes("parameters") == single_tracker.live_bytes("parameters")
    assert tracker.live_bytes("optimizer_state") < single_tracker.live_bytes("optimizer_state")


def test_zero3_lora_collectives_carry_every_weight_and_the_adapters_gradients() -> None:
    run, _ = simulate.trace(_sana(1, zero_stage=3, world_size=4, train_mode="lora"))
    # Each rank sends 3/4 of each collective (ring): every weight gathered twice (forward and
    # backward, padded to an even split), the adapters' 16-bit gradients reduced once.
    weights = sum(share(logical_numel(p), 4) * 4 * p.element_size() for p in run.model.parameters())
    gradients = sum(logical_numel(p) * p.element_size() for p in run.trainable_parameters())
    assert run.traffic.peer_bytes == 2 * ((2 * weights + gradients) * 3 // 4)  # two steps


@pytest.mark.long
def test_a_real_zero3_probe_runs_in_a_fresh_process(tmp_path: Path) -> None:
    """zero.Init replaces the tensor constructors; torch imports torch._dynamo lazily, at the
    first module built inside it, and its polyfill then refused DeepSpeed's constructor: a
    cpu (or cuda) probe of zero_stage=3 crashed in a fresh process, where a test process that
    had imported torch._dynamo before passed."""
    done = autofit(
        "probe", "model=tiny_mlp", "backend=cpu", "zero_stage=3", "batch_size=2", cwd=tmp_path
    )
    assert done.returncode == 0 and done.stdout.startswith("tiny_mlp on a40 [cpu]: ok"), (
        done.stdout + done.stderr
    )


@pytest.mark.long
def test_real_deepspeed_zero3_with_lora_holds_the_emulated_model_states() -> None:
    """DeepSpeed 0.19 itself (cpu backend, one process) against the emulation, after the step:
    the same bytes, but for the gradients: DeepSpeed keeps a 16-bit gradient buffer of the
    adapters (2 bytes each) and frees its fp32 gradients after the step, where the emulation
    keeps fp32 gradients (4 bytes, as DeepSpeed's own estimate counts them), and DeepSpeed keeps
    two small flags of its own (512 bytes each)."""
    knobs = dict(batch_size=2, zero_stage=3, train_mode="lora")
    real_run, real = cpu.trace(spec("tiny_sana", backend="cpu", **knobs))
    fake_run, fake = simulate.trace(spec("tiny_sana", **knobs))
    adapters = real_run.trainable_param_count
    assert adapters == fake_run.trainable_param_count
    live = [sum(t.sizes[a] for a in t.live_at(len(t.events) - 1)) for t in (real, fake)]
    assert live[0] - live[1] == 2 * adapters - 4 * adapters + 2 * 512


@pytest.mark.long
@pytest.mark.parametrize("mode", ["lora", "qlora"])
def test_real_deepspeed_zero2_with_lora_frees_what_the_emulation_keeps_after_the_step(
    mode: str,
) -> None:
    """DeepSpeed 0.19 ZeRO-2 (cpu backend, one process; QLoRA on bitsandbytes' real 4-bit
    layers) against the emulation, after the step: the same frozen base, flat adapters, master
    weights and moments, but DeepSpeed frees its reduce bucket and both gradient shares (16-bit
    and fp32: 6 bytes per adapter weight) once the step is done, where the emulation keeps them,
    as DeepSpeed's own estimate counts the gradients; the real run keeps one tensor under 512
    bytes of its own. The emulation overstates the next forward by those bytes, not the
    backward's peak, which holds them in both."""
    knobs = dict(batch_size=2, zero_stage=2, train_mode=mode)
    # Once first: what the libraries make on their first real step in a process (bitsandbytes'
    # small tensors) is then made, whichever test ran before, and not counted in the step's.
    cpu.trace(spec("tiny_sana", backend="cpu", **knobs))
    real_run, real = cpu.trace(spec("tiny_sana", backend="cpu", **knobs))
    fake_run, fake = simulate.trace(spec("tiny_sana", **knobs))
    adapters = real_run.trainable_param_count
    live = [sum(t.sizes[a] for a in t.live_at(len(t.events) - 1)) for t in (real, fake)]
    bucket = round_allocation(REDUCE_BUCKET_ELEMENTS * 2)
    assert live[1] - live[0] == bucket + 6 * adapters - 512
    assert real.live_bytes("optimizer_state") == 2 * round_allocation(4 * adapters) + 512


# -- NVMe (ZeRO-Infinity) ----------------------------------------------------------------------


def test_optimizer_sub_groups_follow_deepspeed() -> None:
    assert sub_groups([600, 500, 100], size=1000) == [[0, 1], [2]]
    assert sub_groups([1000, 5], size=1000) == [[0], [1]]
    assert aligned(1, 4) == 256 and aligned(256, 4) == 256 and aligned(257, 2) == 512


def test_nvme_keeps_the_optimizer_states_out_of_host_memory_but_its_pinned_buffers() -> None:
    run, tracker = simulate.trace(_sana(1, zero_stage=3, offload_optimizer="nvme"))
    emulation = _emulation(run)
    n = sum(share(p.numel(), 1) for p in run.trainable_parameters())
    assert 4 * n >= MIN_AIO_BYTES  # one sub-group, on the drive
    assert emulation.master.numel() == 0 and emulation.exp_avg.numel() == 0
    buffers = emulation.swap.buffers
    assert len(buffers) == OPTIMIZER_BUFFER_COUNT
    assert all(b.numel() == aligned(n, 4) and b.dtype == torch.float32 for b in buffers)
    # Nothing of the optimizer on the GPU, as with ZeRO-Offload to host memory.
    offloaded, offloaded_tracker = simulate.trace(_sana(1, zero_stage=3, offload_optimizer="cpu"))
    assert tracker.live_bytes("optimizer_state") == 0
    assert offloaded_tracker.live_bytes("optimizer_state") == 0
    # Host memory: ZeRO-Offload pins the master weights and gradients and keeps the moments
    # pageable; NVMe keeps only the four pinned buffers (and the step counter).
    assert offloaded_tracker.host_live_bytes(pinned=True) == 2 * round_pinned(4 * n)
    assert offloaded_tracker.host_live_bytes(pinned=False) == 2 * 4 * n + 4
    assert tracker.host_live_bytes(pinned=True) == OPTIMIZER_BUFFER_COUNT * round_pinned(
        aligned(n, 4) * 4
    )
    assert tracker.host_live_bytes(pinned=False) == 4
    # Per step: gradients written in backward, four states read and three written by the step.
    assert run.traffic.nvme_bytes == 2 * 4 * n
    assert run.traffic.nvme_step_bytes == 2 * (16 + 12) * n


def test_nvme_leaves_an_optimizer_sub_group_under_1_mib_in_host_memory() -> None:
    run, _ = simulate.trace(spec("tiny_sana", zero_stage=3, offload_optimizer="nvme"))
    emulation = _emulation(run)
    n = sum(p.numel() for p in run.trainable_parameters())
    assert 4 * n < MIN_AIO_BYTES and not emulation.swap.swapped
    assert emulation.master.numel() == n  # host memory, as offload_optimizer=cpu keeps it
    assert run.traffic.nvme_bytes == run.traffic.nvme_step_bytes == 0


def test_nvme_weights_leave_only_the_trained_shares_and_the_read_buffers_in_host_memory() -> None:
    run, tracker = simulate.trace(
        _sana(1, zero_stage=3, train_mode="lora", offload_optimizer="nvme", offload_params="nvme")
    )
    emulation = _emulation(run)
    frozen = [p for p in run.model.parameters() if not p.requires_grad]
    # A frozen weight of at most stage3_param_persistence_threshold elements keeps its share on
    # the GPU (zero.Init); every other frozen share is on the drive.
    small = [p for p in frozen if p.numel() <= 100_000]
    assert small and all(
        emulation.shards[p].numel() == 0 for p in frozen if all(p is not q for q in small)
    )
    assert all(emulation.shards[p].numel() == p.numel() for p in run.trainable_parameters())
    largest = max(p.numel() for p in run.model.parameters())
    pool = emulation.param_buffers.pool
    assert pool.numel() == PARAM_BUFFER_COUNT * aligned(max(PARAM_BUFFER_SIZE, largest), 2)
    # no other weight stays on the GPU between uses
    assert tracker.live_bytes("parameters") == sum(
        round_allocation(p.numel() * p.element_size()) for p in small
    )
    assert run.traffic.nvme_bytes > 2 * sum(p.numel() * p.element_size() for p in frozen) // 2


def test_the_step_waits_for_nvme_as_the_figures_say() -> None:
    gpu = load_gpu("a40")
    base = RooflineCounter(gpu)
    base.cost.device_seconds = 1.0
    step = RooflineCounter(gpu)
    step.cost.device_seconds = 1.0
    step.add_traffic(0, 0, 0, nvme_step_bytes=int(69e9))
    assert step.cost.step_seconds - base.cost.step_seconds == pytest.approx(69 / NVME_GBS)
    overlapped = RooflineCounter(gpu)
    overlapped.cost.device_seconds = 1.0
    overlapped.add_traffic(0, 0, 0, nvme_bytes=int(NVME_GBS * 1e9 / 2))
    assert overlapped.cost.step_seconds == 1.0  # half a second of reads hides behind compute
    overlapped.add_traffic(0, 0, 0, nvme_bytes=int(NVME_GBS * 1e9))
    assert overlapped.cost.step_seconds == pytest.approx(1.5)
    # A faster drive, as the GPU entry may say (gpu.nvme_gbs=25: the ZeRO-Infinity paper's node).
    striped = RooflineCounter(dataclasses.replace(gpu, nvme_gbs=25.0))
    striped.add_traffic(0, 0, 0, nvme_step_bytes=int(50e9))
    assert striped.cost.step_seconds == pytest.approx(2.0)


def test_nvme_makes_the_simulated_step_slower_than_host_memory() -> None:
    host = simulate.measure(_sana(1, zero_stage=3, offload_optimizer="cpu"))
    nvme = simulate.measure(_sana(1, zero_stage=3, offload_optimizer="nvme"))
    assert nvme.step_time_s > host.step_time_s


# -- activation offloading ---------------------------------------------------------------------


def _offload_run() -> SimpleNamespace:
    traffic = HostTraffic()
    run = SimpleNamespace(
        host=lambda pinned=False: nullcontext(),
        host_device=torch.device("cpu"),
        device=torch.device("cpu"),
        traffic=traffic,
    )
    run.to_device = lambda t: (
        setattr(traffic, "link_bytes", traffic.link_bytes + t.numel() * t.element_size())
        or t.clone()
    )
    return run


def test_activation_offload_copies_each_saved_activation_once_and_no_weight() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    x = torch.randn(4, 256, requires_grad=True)
    run = _offload_run()
    offload = ActivationOffload(run)
    with offload.context():
        loss = model(x).sum()
    # Saved: x (by the first linear), the ReLU's output (by the ReLU and by the second linear,
    # one copy); not the weights' views, nor anything under 1 KiB.
    activation = 4 * 256 * 4
    assert run.traffic.link_bytes == 2 * activation
    loss.backward()
    # Back in backward: x once, the ReLU output once per node that saved it.
    assert run.traffic.link_bytes == 2 * activation + 3 * activation
    assert x.grad is not None and model[0].weight.grad is not None


def test_activation_offload_never_takes_a_new_tensor_for_a_freed_one_at_the_same_address() -> None:
    # Each tensor dies once packed (its copy lives on, as autograd holds it), so the next one's
    # storage usually lands where it was: same address, shape, stride and dtype, yet a different
    # tensor, which needs a copy of its own.
    offload = ActivationOffload(_offload_run())
    saved = []
    for _ in range(20):
        tensor = torch.randn(16, 16)
        saved.append(offload.pack(tensor))
        offload.stash.clear()
        del tensor
    assert len({id(copy) for copy in saved}) == 20


def test_activation_offload_moves_activations_off_the_gpu_into_pinned_host_memory() -> None:
    kept, kept_tracker = simulate.trace(spec("tiny_sana", batch_size=2))
    run, tracker = simulate.trace(spec("tiny_sana", batch_size=2, offload_activations="cpu"))
    kept_peak, peak = kept_tracker.peak_report(), tracker.peak_report()
    assert peak.peak_allocated_bytes < kept_peak.peak_allocated_bytes
    assert peak.breakdown["activations"] < kept_peak.breakdown["activations"] / 10
    assert run.traffic.link_bytes > 0 and kept.traffic.link_bytes == 0
    host = tracker.host_report()
    assert (
        host.pinned_bytes > 0 and host.pageable_bytes == kept_tracker.host_report().pageable_bytes
    )


def test_activation_offload_with_checkpointing_offloads_the_block_inputs() -> None:
    plain, plain_tracker = simulate.trace(spec("tiny_sana", batch_size=2, checkpointing=True))
    run, tracker = simulate.trace(
        spec("tiny_sana", batch_size=2, checkpointing=True, offload_activations="cpu")
    )
    everything, _ = simulate.trace(spec("tiny_sana", batch_size=2, offload_activations="cpu"))
    assert 0 < run.traffic.link_bytes < everything.traffic.link_bytes / 4
    assert tracker.peak < plain_tracker.peak


def test_activation_offload_counts_alike_on_fake_and_real_tensors() -> None:
    probe = dict(batch_size=2, offload_activations="cpu")
    _, fake = simulate.trace(spec("tiny_sana", **probe))
    _, real = cpu.trace(spec("tiny_sana", backend="cpu", **probe))
    assert fake.peak_report().peak_allocated_bytes == real.peak_report().peak_allocated_bytes


def test_activation_offload_costs_link_time() -> None:
    base = simulate.measure(spec("tiny_sana", batch_size=4, gpu="rtx4090"))
    offloaded = simulate.measure(
        spec("tiny_sana", batch_size=4, gpu="rtx4090", offload_activations="cpu")
    )
    assert offloaded.step_time_s >= base.step_time_s


# -- rules and trainers' words -----------------------------------------------------------------

INVALID = [
    ({"zero_stage": 2, "offload_optimizer": "nvme"}, "simulate", "offload_optimizer=nvme needs zero_stage=3"),
    ({"zero_stage": 2, "offload_params": "nvme"}, "simulate", "offload_params=nvme needs zero_stage=3"),
    ({"offload_optimizer": "nvme"}, "simulate", "offload_optimizer=nvme is ZeRO-Offload"),
    ({"zero_stage": 3, "offload_optimizer": "nvme"}, "cpu", "emulated only"),
    ({"zero_stage": 3, "train_mode": "qlora"}, "cpu", "train_mode=qlora is emulated only"),
    ({"offload_activations": "cpu", "fsdp": "full_shard", "world_size": 2}, "simulate", "fsdp=full_shard is not modelled"),
]  # fmt: skip


@pytest.mark.parametrize("knobs,backend,words", INVALID)
def test_new_impossible_combinations_are_refused_in_one_line(
    knobs: dict, backend: str, words: str
) -> None:
    values = spec("sana_1600m", **knobs).knobs
    reason = invalid_reason(values, load_gpu("a40"), load_preset("sana_1600m"), backend)
    assert reason and words in reason and "\n" not in reason, reason


def test_zero_with_lora_and_qlora_is_allowed() -> None:
    for mode in ("lora", "qlora"):
        for stage in (1, 2, 3):
            values = spec("sana_1600m", zero_stage=stage, train_mode=mode).knobs
            assert (
                invalid_reason(values, load_gpu("a40"), load_preset("sana_1600m"), "simulate")
                is None
            )


def _subject(**knobs: object) -> Subject:
    probe = spec("sana_1600m", **knobs)
    return Subject(config=probe.knobs, preset=load_preset("sana_1600m"))


def test_deepspeed_config_says_nvme_and_what_lora_and_qlora_ask_of_ones_code() -> None:
    subject = _subject(
        zero_stage=3, train_mode="qlora", offload_optimizer="nvme", offload_params="nvme"
    )
    words = REGISTRY["zero_stage"].express("deepspeed", 3, subject, own_code=True)
    assert isinstance(words, Say)
    zero = words.settings["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "nvme"
    assert zero["offload_optimizer"]["nvme_path"] and zero["offload_param"]["nvme_path"]
    assert "bnb_4bit_quant_storage" in words.note and "nvme_path" in words.note
    accelerate = REGISTRY["zero_stage"].express("accelerate", 3, subject, own_code=True)
    block = accelerate.settings["deepspeed_config"]
    assert block["offload_optimizer_device"] == "nvme" and block["offload_param_nvme_path"]
    refused = REGISTRY["zero_stage"].express("simpletuner", 3, subject)
    assert isinstance(refused, Refuse) and "bnb_4bit_quant_storage" in refused.why


def test_deepspeed_accepts_the_exported_nvme_block() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    subject = _subject(zero_stage=3, offload_optimizer="nvme", offload_params="nvme")
    words = REGISTRY["zero_stage"].express("deepspeed", 3, subject, own_code=True)
    parsed = DeepSpeedZeroConfig(**words.settings["zero_optimization"])
    assert parsed.offload_optimizer.device == "nvme" and parsed.offload_param.device == "nvme"
    assert parsed.offload_optimizer.buffer_count == OPTIMIZER_BUFFER_COUNT
    assert parsed.offload_param.buffer_size == PARAM_BUFFER_SIZE
    assert parsed.sub_group_size == 1_000_000_000


def test_trainers_without_activation_offloading_refuse_it_with_the_reason() -> None:
    knob = REGISTRY["offload_activations"]
    subject = _subject(offload_activations="cpu", checkpointing=True)
    for target in ("kohya", "simpletuner", "sana", "diffusers"):
        words = knob.express(target, "cpu", subject)
        assert isinstance(words, Refuse) and words.why, target
    assert "cpu_offload_checkpointing" in knob.express("kohya", "cpu", subject).why
    note = knob.express("accelerate", "cpu", subject, own_code=True)
    assert isinstance(note, Say) and "pinned host memory" in note.note


def test_a_stored_study_predating_the_knob_ran_without_activation_offloading() -> None:
    assert REGISTRY["offload_activations"].default == "off"


@pytest.mark.parametrize("sharding", [{"zero_stage": 3}, {"fsdp": "full_shard"}])
def test_a_sharded_qlora_base_never_sits_whole_on_one_gpu(sharding: dict) -> None:
    """Under ZeRO-3 or FSDP the 4-bit base is quantized in host memory and only each weight's
    shard reaches the GPU, as zero.Init and FSDP-QLoRA's loading do: over 8 GPUs the setup peak
    of QLoRA stays within LoRA's (its 16-bit shards are twice the 4-bit ones) plus the
    quantization state, which every rank holds whole."""
    qlora, qlora_tracker = simulate.trace(
        _sana(2, world_size=8, train_mode="qlora", precision="bf16", optimizer="adamw", **sharding)
    )
    _, lora_tracker = simulate.trace(
        _sana(2, world_size=8, train_mode="lora", precision="bf16", optimizer="adamw", **sharding)
    )
    layers = [m for m in qlora.model.modules() if type(m).__name__ == "Nf4LinearLayout"]
    state = sum(round_allocation(b.numel() * b.element_size()) for m in layers for b in m.buffers())
    assert qlora_tracker.phase_peaks["setup"] <= lora_tracker.phase_peaks["setup"] + state
