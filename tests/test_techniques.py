"""Each knob moves the breakdown in the direction and by the amount physics says, counted in
bytes on small models, and each impossible combination is invalid with its reason."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import spec, with_blocks

from autofit.backends import cpu, simulate
from autofit.backends.base import model_gpu_memory
from autofit.emulations.zero import REDUCE_BUCKET_ELEMENTS, share
from autofit.gpus import load_gpu
from autofit.knobs import invalid_reason
from autofit.models import load_preset
from autofit.probe.worker import execute
from autofit.run_state import logical_numel
from autofit.simulator.allocator_replay import required_memory
from autofit.simulator.tracker import round_allocation


def _bytes(tensors) -> int:
    return sum(round_allocation(t.numel() * t.element_size()) for t in tensors)


def test_lora_trains_exactly_its_adapters() -> None:
    run, tracker = simulate.trace(spec("tiny_sana", train_mode="lora", lora_rank=8))
    targets = [
        m
        for n, m in run.model.named_modules()
        if n.rsplit(".", 1)[-1] in ("to_q", "to_k", "to_v") or n.endswith("to_out.0")
    ]
    expected = sum(8 * (m.in_features + m.out_features) for m in targets)
    assert run.trainable_param_count == expected
    assert all("lora_" in n for n, p in run.model.named_parameters() if p.requires_grad)
    # Under mixed precision the adapters train in fp32 on a bf16 base.
    assert {p.dtype for p in run.trainable_parameters()} == {torch.float32}
    assert {p.dtype for p in run.model.parameters() if not p.requires_grad} == {torch.bfloat16}


def test_qlora_keeps_4_bit_weights() -> None:
    """On Sana's widths the 4-bit linear layers take about a quarter of their bf16 bytes (their
    scales and codes add a little); on tiny layers those per-layer extras would dominate."""
    lora_probe = dataclasses.replace(
        spec("sana_1600m", resolution=256, train_mode="lora"), model=_two_block_sana()
    )
    lora, lora_tracker = simulate.trace(lora_probe)
    run, tracker = simulate.trace(
        dataclasses.replace(lora_probe, knobs={**lora_probe.knobs, "train_mode": "qlora"})
    )
    linears = [m for m in run.model.modules() if type(m).__name__ == "Nf4LinearLayout"]
    assert linears
    for layer in linears:  # half a byte per weight
        assert layer.weight.numel() == math.ceil(layer.in_features * layer.out_features / 2)
    assert run.trainable_param_count == lora.trainable_param_count
    saved = lora_tracker.live_bytes("parameters") - tracker.live_bytes("parameters")
    bf16_linears = sum(2 * m.in_features * m.out_features for m in linears)
    assert 0.70 * bf16_linears < saved < 0.75 * bf16_linears  # 16 bits down to 4.1-4.5
    # Each weight is quantized on its way to the GPU: the 16-bit base is never there whole.
    setup = tracker.peak_report().phase_peaks["setup"]
    assert setup < lora_tracker.peak_report().phase_peaks["setup"] - 0.70 * bf16_linears
    assert run.param_count == lora.param_count  # weights counted, not the bytes packing them


def test_qlora_base_is_counted_alike_on_fake_and_real_tensors() -> None:
    """bitsandbytes' real NF4 layers (cpu backend) and the stand-in keep the same bytes, and the
    real loader path never holds the 16-bit base on the device either."""
    probe = spec("tiny_sana", batch_size=2, train_mode="qlora")
    fake_run, fake = simulate.trace(probe)
    real_run, real = cpu.trace(probe)
    assert fake.live_bytes("parameters") == real.live_bytes("parameters")
    assert fake_run.param_count == real_run.param_count
    full, _ = simulate.trace(spec("tiny_sana", batch_size=2, train_mode="lora"))
    assert real_run.param_count == full.param_count


def test_swap_blocks_removes_the_swapped_blocks_parameters_from_the_gpu() -> None:
    run, swapped = simulate.trace(spec("tiny_sana", swap_blocks=1))
    _, resident = simulate.trace(spec("tiny_sana"))
    block = run.model.transformer_blocks[-1]
    assert resident.live_bytes("parameters") - swapped.live_bytes("parameters") == _bytes(
        block.parameters()
    )
    # ... and its optimizer state with them (the block trains on the host): AdamW's two moments
    # and a 0-d step counter per tensor
    params = list(block.parameters())
    assert resident.live_bytes("optimizer_state") - swapped.live_bytes(
        "optimizer_state"
    ) == 2 * _bytes(params) + 512 * len(params)
    assert run.traffic.link_bytes > 0 and run.traffic.host_compute_bytes > 0


def _fp8_probe(**knobs: object):
    probe = spec("sana_1600m", resolution=256, train_mode="lora", **knobs)
    return dataclasses.replace(probe, model=_two_block_sana())


def test_fp8_base_stores_each_frozen_weight_in_one_byte() -> None:
    lora, lora_tracker = simulate.trace(_fp8_probe())
    run, tracker = simulate.trace(_fp8_probe(base_precision="fp8"))
    layers = [m for m in run.model.modules() if type(m).__name__.startswith("Float8")]
    assert layers and all(m.weight.dtype == torch.float8_e4m3fn for m in layers)
    assert run.trainable_param_count == lora.trainable_param_count
    assert run.param_count == lora.param_count
    # Two bytes per weight down to one, to the allocator's rounding.
    saved = lora_tracker.live_bytes("parameters") - tracker.live_bytes("parameters")
    weights = [m.weight for m in layers]
    assert saved == sum(
        round_allocation(2 * w.numel()) - round_allocation(w.numel()) for w in weights
    )
    # Cast on the way to the GPU: the 16-bit base never sits there whole.
    assert (
        tracker.peak_report().phase_peaks["setup"] < lora_tracker.peak_report().phase_peaks["setup"]
    )


def test_fp8_base_is_counted_alike_on_fake_and_real_tensors() -> None:
    probe = spec("tiny_sana", batch_size=2, train_mode="lora", base_precision="fp8")
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.live_bytes("parameters") == real.live_bytes("parameters")
    assert fake.peak == real.peak


def test_fp8_upcast_copies_live_until_backward_unless_checkpointed() -> None:
    """The matmul saves the 16-bit copy of its weight for the input's gradient, as kohya's fp8
    base under autocast does: without checkpointing every layer's copy is an activation."""
    _, same = simulate.trace(_fp8_probe())
    _, fp8 = simulate.trace(_fp8_probe(base_precision="fp8"))
    grown = fp8.peak_report().breakdown["activations"] - same.peak_report().breakdown["activations"]
    assert grown > 0
    _, same_ckpt = simulate.trace(_fp8_probe(checkpointing=True))
    _, fp8_ckpt = simulate.trace(_fp8_probe(base_precision="fp8", checkpointing=True))
    assert fp8_ckpt.peak < same_ckpt.peak  # one block's copies at a time: the base's bytes win


def _fused_probe(fused: str):
    probe = spec(
        "sana_1600m", resolution=256, precision="bf16_pure", optimizer="adafactor",
        checkpointing=True, fused_backward=fused,
    )  # fmt: skip
    return dataclasses.replace(probe, model=_two_block_sana())


def test_fused_backward_never_holds_the_whole_models_gradients() -> None:
    run, off = simulate.trace(_fused_probe("off"))
    _, per_parameter = simulate.trace(_fused_probe("parameter"))
    _, per_block = simulate.trace(_fused_probe("block"))
    gradients = sum(_bytes([p]) for p in run.trainable_parameters())
    assert off.peak_report().breakdown["gradients"] == gradients  # the unfused step's peak
    assert per_parameter.peak_report().breakdown["gradients"] == 0
    assert off.peak - per_parameter.peak > 0.75 * gradients
    # A block's gradients wait for the block: between the two.
    block = max(sum(_bytes([p]) for p in b.parameters()) for b in run.model.transformer_blocks)
    assert per_parameter.peak < per_block.peak <= per_parameter.peak + block
    # The same update ran: the same optimizer state.
    assert per_parameter.live_bytes("optimizer_state") == off.live_bytes("optimizer_state")


def test_fused_backward_runs_for_real_on_the_cpu() -> None:
    probe = spec("tiny_sana", precision="bf16_pure", optimizer="adafactor", fused_backward="block")
    _, real = cpu.trace(probe)
    _, fake = simulate.trace(probe)
    assert real.peak == fake.peak


def test_encoders_online_add_exactly_the_companions_weights() -> None:
    online, with_encoders = simulate.trace(spec("tiny_sana", encoders="online"))
    _, cached = simulate.trace(spec("tiny_sana"))
    companions = [
        p
        for module in online.companions.values()
        for p in (*module.parameters(), *module.buffers())
    ]
    assert set(online.companions) == {"text_encoder", "vae"}
    assert with_encoders.live_bytes("parameters") - cached.live_bytes("parameters") == _bytes(
        companions
    )
    weights = [p for module in online.companions.values() for p in module.parameters()]
    assert {p.dtype for p in weights} == {
        torch.bfloat16
    }  # in their own dtype (RoPE tables stay fp32)


def test_ema_on_the_gpu_adds_one_copy_of_the_trained_weights_and_on_the_cpu_none() -> None:
    run, gpu = simulate.trace(spec("tiny_sana", ema="gpu"))
    _, cpu = simulate.trace(spec("tiny_sana", ema="cpu"))
    _, off = simulate.trace(spec("tiny_sana"))
    assert gpu.live_bytes("optimizer_state") - off.live_bytes("optimizer_state") == _bytes(
        run.trainable_parameters()
    )
    assert cpu.live_bytes("optimizer_state") == off.live_bytes("optimizer_state")


def test_math_attention_keeps_the_attention_matrix() -> None:
    fused = simulate.measure(spec("tiny_sana", resolution=256))
    math_path = simulate.measure(spec("tiny_sana", resolution=256, attention="math"))
    assert math_path.peak_allocated_bytes > fused.peak_allocated_bytes


def _two_block_sana():
    """Sana 1600M's widths with two blocks: large tensors, so flat partitions dominate."""
    return with_blocks(spec("sana_1600m", resolution=256), 2).model


def _zero(stage: int, world_size: int, **knobs):
    probe = spec("sana_1600m", resolution=256, zero_stage=stage, world_size=world_size, **knobs)
    return simulate.trace(dataclasses.replace(probe, model=_two_block_sana()))


def test_zero2_across_four_gpus_divides_gradients_and_optimizer_state_by_four() -> None:
    run, tracker = _zero(2, 4)
    shares = sum(share(logical_numel(p), 4) for p in run.trainable_parameters())
    assert tracker.live_bytes("gradients") == round_allocation(2 * shares) + round_allocation(
        4 * shares
    )
    # fp32 master weights and two moments, plus the step counter
    assert tracker.live_bytes("optimizer_state") == 3 * round_allocation(4 * shares) + 512
    run1, one = _zero(2, 1)
    assert one.live_bytes("optimizer_state") / tracker.live_bytes(
        "optimizer_state"
    ) == pytest.approx(4, rel=1e-4)
    assert one.live_bytes("gradients") / tracker.live_bytes("gradients") == pytest.approx(
        4, rel=1e-4
    )
    assert tracker.live_bytes("parameters") == one.live_bytes(
        "parameters"
    )  # weights are whole in stage 2


@pytest.mark.parametrize(
    "stage,offload_optimizer,offload_params",
    [
        (2, "none", "none"),
        (2, "cpu", "none"),
        (3, "none", "none"),
        (3, "cpu", "none"),
        (3, "cpu", "cpu"),
    ],
)
def test_zero_model_states_agree_with_deepspeeds_estimates(
    stage: int, offload_optimizer: str, offload_params: str
) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    world = 4
    run, tracker = _zero(
        stage, world, offload_optimizer=offload_optimizer, offload_params=offload_params
    )
    total = run.param_count
    states = sum(tracker.live_bytes(c) for c in ("parameters", "gradients", "optimizer_state"))
    if stage == 2:
        _, expected = estimate_zero2_model_states_mem_needs(
            total, world, 1, cpu_offload=offload_optimizer == "cpu"
        )
    else:
        largest = max(
            sum(logical_numel(p) for p in m.parameters(recurse=False)) for m in run.model.modules()
        )
        _, gpu_mem, largest_layer = estimate_zero3_model_states_mem_needs(
            total,
            largest,
            world,
            1,
            cpu_offload=offload_optimizer == "cpu",
            cpu_offload_params=offload_params == "cpu",
        )
        expected = (
            gpu_mem - largest_layer
        )  # the largest layer's gathered weights and gradients are transient
        # ... and the peak did hold at least that layer gathered
        assert tracker.peak >= states + largest_layer // 2
    # DeepSpeed's figures leave out per-tensor rounding and the step counter: within 0.01%.
    assert states == pytest.approx(expected, rel=1e-4, abs=4096)
    bucket = round_allocation(REDUCE_BUCKET_ELEMENTS * 2)
    assert tracker.peak >= states + bucket  # the default reduce bucket is real memory too


def test_offload_and_swap_cost_time_on_the_host_link_and_cpu() -> None:
    base = simulate.measure(spec("tiny_sana", batch_size=4))
    swapped = simulate.measure(spec("tiny_sana", batch_size=4, swap_blocks=1))
    assert swapped.step_time_s > base.step_time_s
    ema_cpu = simulate.measure(spec("tiny_sana", batch_size=4, ema="cpu"))
    ema_gpu = simulate.measure(spec("tiny_sana", batch_size=4, ema="gpu"))
    assert ema_cpu.step_time_s > ema_gpu.step_time_s


def test_validation_can_run_out_of_memory_after_training_fits() -> None:
    """tiny_sana at 256 px: the validation decode needs more than the training step. With a
    budget between the two, the probe is oom in phase validation."""
    probe = spec("tiny_sana", resolution=256, checkpointing=True, validation="on")
    _, tracker = simulate.trace(probe)
    start = next(index for index, phase in tracker.phase_changes if phase == "validation")
    workspace = probe.gpu_spec.cublas_workspace_bytes
    training = required_memory(tracker.events[:start], tracker.sizes, [workspace], 1 << 40).required
    everything = required_memory(tracker.events, tracker.sizes, [workspace], 1 << 40).required
    assert everything > training
    gpu = dataclasses.replace(load_gpu("a40"), cuda_context_mib=0)
    budget = (training + everything) // 2
    gpu = dataclasses.replace(gpu, memory_mib=math.ceil(budget / (1 << 20)))
    probe = dataclasses.replace(probe, gpu=gpu.to_dict(), margin=0.0)
    memory = model_gpu_memory(tracker, gpu, probe.budget_bytes)
    assert memory.over_budget_phase == "validation"
    result = execute(probe)
    assert result.outcome.value == "oom" and result.phase == "validation"


def _validation_peak(**knobs: object) -> int:
    """The tracked tensor peak within the validation phase."""
    _, tracker = simulate.trace(spec("tiny_sana", encoders="online", **knobs))
    return tracker.peak_report().phase_peaks["validation"]


def test_validation_reload_holds_a_second_pair_of_text_encoders() -> None:
    # With encoders=online the text encoder is resident; validation=on reuses it, reload loads
    # another (diffusers' Flux LoRA script): the validation peak grows by about its weights.
    from autofit.models import load_preset
    from autofit.workloads.companions import build_companion

    with torch.device("meta"):
        encoder = build_companion(load_preset("tiny_sana").companions["text_encoder"])
    weights = sum(p.numel() * p.element_size() for p in encoder.parameters())
    on, reload = _validation_peak(validation="on"), _validation_peak(validation="reload")
    assert reload - on == pytest.approx(weights, rel=0.05)


def test_validation_at_the_native_resolution_renders_more_pixels() -> None:
    # Trained at 32 px, rendered at the preset's native 64 px (the diffusers pipelines' default).
    training = _validation_peak(resolution=32, validation="on")
    native = _validation_peak(resolution=32, validation="on", validation_resolution="native")
    assert native > training
    assert _validation_peak(resolution=64, validation="on", validation_resolution="native") == (
        _validation_peak(resolution=64, validation="on")
    )


def _companions(model: str, dtype: torch.dtype | None = None) -> dict[str, torch.nn.Module]:
    """The model's companions, built on the meta device (in their own dtype unless `dtype`)."""
    from autofit.workloads.companions import build_companion

    with torch.device("meta"):
        return {
            name: build_companion(companion, dtype)
            for name, companion in load_preset(model).companions.items()
        }


def _weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


@pytest.mark.long
def test_validation_offload_holds_one_loaded_component_at_a_time() -> None:
    # With cached encoders, validation=on loads the text encoder and the VAE onto the GPU for the
    # pass; offload keeps both in host memory and copies each in only while it runs (diffusers'
    # enable_model_cpu_offload). The peak is the decode's, with the VAE, the larger: offload's
    # lacks the text encoder, the offloaded weights less the largest. Each weight crosses the
    # host link twice, and the cpu backend holds the same bytes.
    loaded = [_weights(module) for module in _companions("tiny_sana").values()]
    weights = [_bytes(tensors) for tensors in loaded]
    moved = sum(t.numel() * t.element_size() for tensors in loaded for t in tensors)
    peak, link = {}, {}
    for value in ("on", "offload"):
        run, tracker = simulate.trace(spec("tiny_sana", validation=value))
        peak[value] = tracker.peak_report().phase_peaks["validation"]
        link[value] = run.traffic.link_bytes
    assert peak["on"] - peak["offload"] == sum(weights) - max(weights)
    assert link["offload"] - link["on"] == 2 * moved
    _, real = cpu.trace(spec("tiny_sana", backend="cpu", validation="offload"))
    assert real.peak_report().phase_peaks["validation"] == peak["offload"]
    # With encoders=online training holds both on the GPU and the pipeline runs them there.
    assert _validation_peak(validation="offload") == _validation_peak(validation="on")


def test_sd3_controlnet_validation_offload_adds_only_t5_and_the_autocast_casts() -> None:
    # The seed case's pipeline, offloaded, steers the frozen transformer training holds (no second
    # one) and moves its own text encoders and VAE in one at a time. Its peak is the end of T5's
    # forward: T5's fp32 weights beside the training state, with the fp16 copies autocast cached
    # of every linear weight the three encoders ran (kept until the pipeline call returns). Two
    # blocks at 256 px stand in for the model: what validation adds does not depend on them.
    probe = spec(
        "sd3_controlnet", gpu="a100_80", precision="fp32", resolution=256, validation="offload"
    )
    _, tracker = simulate.trace(with_blocks(probe, 2))
    start = next(index for index, phase in tracker.phase_changes if phase == "validation")
    held = sum(tracker.sizes[a] for a in tracker.live_at(start - 1))
    added = tracker.peak_report().phase_peaks["validation"] - held
    encoders = _companions("sd3_controlnet", torch.float32)
    linears = [
        m.weight for e in encoders.values() for m in e.modules() if type(m) is torch.nn.Linear
    ]
    casts = sum(round_allocation(w.numel() * 2) for w in linears)
    t5 = _bytes(_weights(encoders["text_encoder_3"]))
    assert t5 + casts < added < 1.01 * (t5 + casts)


@pytest.mark.slow  # the 3 B model at 1024 px: about 30 s
def test_sd3_controlnet_seed_case_fits_an_a100_80gb_with_validation_offload() -> None:
    # diffusers issue #11225's run (published row DF-5) with the pipeline offloaded: it fits.
    knobs = dict(batch_size=1, resolution=1024, precision="fp32", optimizer="adamw")
    knobs.update(optimizer_impl="foreach", checkpointing=False, validation="offload")
    result = execute(spec("sd3_controlnet", gpu="a100_80", **knobs))
    assert result.outcome.value == "ok", result.error
    assert result.phase == "validation"  # its peak is still the validation pass


INVALID = [
    ({"precision": "bf16"}, "t4", "simulate", "bf16"),
    ({"optimizer": "adamw_bf16"}, "a40", "simulate", "bf16_pure"),
    ({"optimizer": "paged_adamw8bit"}, "a40", "cpu", "cuda"),
    ({"offload_params": "cpu", "zero_stage": 2}, "a40", "simulate", "zero_stage=3"),
    ({"offload_optimizer": "cpu"}, "a40", "simulate", "zero_stage"),
    ({"zero_stage": 2, "precision": "bf16_pure"}, "a40", "simulate", "precision=bf16"),
    ({"zero_stage": 2, "optimizer": "lion"}, "a40", "simulate", "AdamW"),
    ({"zero_stage": 2, "world_size": 4}, "a40", "cpu", "simulate"),
    ({"world_size": 2}, "a40", "simulate", "zero_stage"),
    ({"swap_blocks": 19}, "a40", "simulate", "at most 18"),
    ({"validation_resolution": "native"}, "a40", "simulate", "validation on, reload or offload"),
    ({"base_precision": "fp8"}, "a40", "simulate", "train_mode=full has no frozen base"),
    ({"base_precision": "fp8", "train_mode": "qlora"}, "a40", "simulate", "4-bit base"),
    ({"fused_backward": "parameter", "precision": "fp16"}, "a40", "simulate", "loss scaler"),
    ({"fused_backward": "block", "zero_stage": 2}, "a40", "simulate", "ZeRO"),
]


@pytest.mark.parametrize("knobs,gpu,backend,words", INVALID)
def test_impossible_combinations_are_invalid_with_the_reason(
    knobs: dict, gpu: str, backend: str, words: str
) -> None:
    values = spec("sana_1600m", **knobs).knobs
    reason = invalid_reason(values, load_gpu(gpu), load_preset("sana_1600m"), backend)
    assert reason and words in reason, reason


def test_models_without_encoders_or_lora_targets_say_so() -> None:
    mlp = load_preset("tiny_mlp")
    assert "text encoders" in invalid_reason(
        spec("tiny_mlp", encoders="online").knobs, load_gpu("a40"), mlp, "simulate"
    )
    assert "VAE" in invalid_reason(
        spec("tiny_mlp", validation="on").knobs, load_gpu("a40"), mlp, "simulate"
    )


def test_flux_swap_counts_as_sd_scripts_does() -> None:
    flux = load_preset("flux_dev")
    # N//2 double blocks and 2*(N - N//2) single ones; at 35, two of each list stay.
    assert flux.swapped_per_list(16) == [8, 16]
    assert flux.swapped_per_list(35) == [17, 36]
    assert load_preset("sd35_large").swapped_per_list(36) == [36]


def test_block_ring_holds_the_resident_count_and_exchanges_oldest_first() -> None:
    from torch import nn

    from autofit.techniques.streaming import BlockRing

    blocks = [nn.Linear(4, 4) for _ in range(5)]
    exchanges: list[tuple[float, float, int]] = []
    clock = iter(range(1000))
    ring = BlockRing(
        blocks, 2, lambda b: list(b.parameters()), lambda t: t.clone(), lambda t: t.clone(),
        lambda: float(next(clock)), lambda *e: exchanges.append(e),
    )  # fmt: skip
    x = torch.randn(1, 4, requires_grad=True)
    for block in blocks:
        x = block(x)
        assert len(ring.present) == 2 and block in ring.present
    assert list(ring.present) == blocks[-2:]  # forward ends with the last two
    x.sum().backward()
    assert list(ring.present) == [blocks[1], blocks[0]]  # backward ends with the first two
    # Three exchanges each way, every one both ways: 2 x (weight + bias) x 4 bytes x 2 tensors.
    assert len(exchanges) == 6
    assert all(moved == 2 * (16 + 4) * 4 for _, _, moved in exchanges)
    assert all(ready <= needed for ready, needed, _ in exchanges)


@pytest.mark.long
def test_swapping_more_blocks_of_flux_is_never_faster_at_one_batch() -> None:
    probe = spec("flux_dev", resolution=256, train_mode="lora", checkpointing=True)
    times = [
        simulate.measure(
            dataclasses.replace(with_blocks(probe, 6), knobs={**probe.knobs, "swap_blocks": n})
        ).step_time_s
        for n in (0, 2, 4)
    ]
    assert times == sorted(times)
