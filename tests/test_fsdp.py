"""FSDP2 (`fully_shard`): one rank's memory byte for byte at 1 to 8 GPUs, the gathered groups
forward and backward, CPU offload, LoRA and QLoRA under it, its rules, the real `fully_shard` in
a one-process group, and its exports."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import spec

from autofit.backends import simulate
from autofit.emulations.fsdp import shard_rows
from autofit.emulations.fsdp_groups import fsdp_groups
from autofit.gpus import load_gpu
from autofit.knobs import invalid_reason
from autofit.models import load_preset
from autofit.simulator.tracker import CATEGORIES, round_allocation

LLAMA = "llama3_2_1b"
TINY = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def tiny(tied: bool = True, **knobs: Any):
    """Llama 3.2 1B's layer types at a width small enough to count by hand, 32 tokens."""
    probe = spec(LLAMA, resolution=32, **knobs)
    arch = copy.deepcopy(probe.model["architecture"])
    arch["config"].update(TINY, tie_word_embeddings=tied)
    return dataclasses.replace(probe, model={**probe.model, "architecture": arch})


def _shard_bytes(param: torch.nn.Parameter, world: int, itemsize: int) -> int:
    shape = param.shape
    return round_allocation(shard_rows(shape[0], world) * shape[1:].numel() * itemsize)


def _full_model(probe):
    """The tiny model as built, unsharded (for its shapes)."""
    from autofit.workloads import workload_for

    preset = dataclasses.replace(load_preset(LLAMA), architecture=probe.model["architecture"])
    return workload_for(preset).build_model(torch.float32), preset


def _live_at_phase_end(tracker, phase: str, category: str) -> int:
    """Bytes of `category` live when `phase` of the last step ended."""
    starts = [i for i, name in tracker.phase_changes if name == phase]
    end = next(i for i, _ in tracker.phase_changes if i > starts[-1]) - 1
    index = CATEGORIES.index(category)
    return sum(tracker.sizes[a] for a in tracker.live_at(end) if tracker.categories[a] == index)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shards_gradients_and_state_divide_by_the_gpu_count(world: int) -> None:
    probe = tiny(fsdp="full_shard", world_size=world)
    run, tracker = simulate.trace(probe)
    model, _ = _full_model(probe)
    params = list(dict.fromkeys(model.parameters()))  # the tied weight once
    buffers = sum(round_allocation(b.numel() * b.element_size()) for b in run.model.buffers())
    # fp32 shards (mixed bf16: fp32 weights), every one resharded after the step
    shards = sum(_shard_bytes(p, world, 4) for p in params)
    assert tracker.live_bytes("parameters") == shards + buffers
    # AdamW's two moments per shard, and fused AdamW's step counter per tensor
    state = sum(2 * _shard_bytes(p, world, 4) + 512 for p in params)
    assert tracker.live_bytes("optimizer_state") == state
    assert run.param_count == sum(p.numel() for p in params)  # weights, not shard elements
    # Gradients after backward: one flat fp32 shard per group with gradients.
    groups = fsdp_groups(model, load_preset(LLAMA), True)
    grads = sum(
        round_allocation(
            4 * sum(shard_rows(p.shape[0], world) * p.shape[1:].numel() for p in g.params)
        )
        for g in groups
        if g.params
    )
    assert _live_at_phase_end(tracker, "backward", "gradients") == grads


def test_reshard_after_forward_false_holds_every_gathered_block_until_backward() -> None:
    world = 4
    _, full = simulate.trace(tiny(fsdp="full_shard", world_size=world))
    run, kept = simulate.trace(tiny(fsdp="shard_grad_op", world_size=world))
    # At the end of forward shard_grad_op still holds each block's gathered weights, in bf16
    # (the policy's param dtype), every rank's padded chunk.
    blocks = [p for block in run.model.model.layers for p in block.parameters()]
    model, _ = _full_model(tiny())
    gathered = sum(
        round_allocation(2 * shard_rows(p.shape[0], world) * world * p.shape[1:].numel())
        for block in model.model.layers
        for p in block.parameters()
    )
    assert blocks
    held = _live_at_phase_end(kept, "forward", "parameters")
    assert held - _live_at_phase_end(full, "forward", "parameters") == gathered
    assert kept.peak > full.peak
    # Resharding costs a second all-gather of every block in backward.
    assert (
        run.traffic.peer_bytes
        < simulate.trace(tiny(fsdp="full_shard", world_size=world))[0].traffic.peer_bytes
    )


def test_cpu_offload_keeps_shards_gradients_and_state_on_the_host() -> None:
    world = 2
    on_gpu, gpu = simulate.trace(tiny(fsdp="full_shard", world_size=world))
    run, host = simulate.trace(tiny(fsdp="full_shard", fsdp_offload="cpu", world_size=world))
    buffers = sum(round_allocation(b.numel() * b.element_size()) for b in run.model.buffers())
    assert host.live_bytes("parameters") == buffers  # every shard is in host memory
    assert host.live_bytes("optimizer_state") == 0
    assert gpu.live_bytes("optimizer_state") > 0
    assert host.peak < gpu.peak
    assert run.traffic.link_bytes > 0 and run.traffic.host_compute_bytes > 0
    assert on_gpu.traffic.link_bytes == 0


def test_lora_shards_every_weight_and_trains_only_the_adapters() -> None:
    world = 4
    run, tracker = simulate.trace(tiny(fsdp="full_shard", world_size=world, train_mode="lora"))
    adapters = run.trainable_parameters()
    assert adapters and all(
        "lora_" in n for n, p in run.model.named_parameters() if p.requires_grad
    )
    # fused AdamW states for the adapters' fp32 shards only
    state = sum(
        2 * round_allocation(4 * p.numel()) + 512 for p in adapters
    )  # each parameter's data is its shard after the step
    assert tracker.live_bytes("optimizer_state") == state
    # every weight is its shard: the bf16 base's rows divided by four
    for name, param in run.model.named_parameters():
        if "lora_" not in name and "embed" in name:
            assert param.shape[0] == shard_rows(TINY["vocab_size"], world)


def test_qlora_shards_the_packed_4bit_weights_as_bf16() -> None:
    world = 4
    run, tracker = simulate.trace(tiny(fsdp="full_shard", world_size=world, train_mode="qlora"))
    _, lone = simulate.trace(tiny(train_mode="qlora"))
    layers = [m for m in run.model.modules() if type(m).__name__ == "Nf4LinearLayout"]
    assert layers
    for layer in layers:  # half a byte per weight, in bf16 elements, a quarter of the rows
        packed = -(-(layer.in_features * layer.out_features) // 2)
        assert layer.weight.dtype == torch.bfloat16
        assert layer.weight.shape[0] == shard_rows(-(-packed // 2), world)
    assert tracker.live_bytes("parameters") < lone.live_bytes("parameters")


def test_groups_are_the_ones_accelerate_makes() -> None:
    model, preset = _full_model(tiny(tied=False))
    groups = fsdp_groups(model, preset, True)
    names = [[type(m).__name__ for m in g.modules] for g in groups]
    assert names == [
        ["LlamaDecoderLayer"], ["LlamaDecoderLayer"], ["Embedding"],
        ["LlamaRMSNorm", "Linear"], ["LlamaForCausalLM"],
    ]  # fmt: skip
    assert [g.reshard_after_forward for g in groups] == [True, True, True, False, False]
    tied_model, _ = _full_model(tiny())
    tied = fsdp_groups(tied_model, preset, True)
    assert [type(m).__name__ for m in tied[2].modules] == ["LlamaRMSNorm", "Embedding", "Linear"]
    assert sum(len(g.params) for g in tied) == len(list(tied_model.parameters()))


@pytest.mark.parametrize(
    "knobs,backend,message",
    [
        ({"fsdp": "full_shard", "zero_stage": 2}, "simulate", "fsdp=full_shard with zero_stage=2"),
        ({"fsdp": "full_shard", "swap_blocks": 2}, "simulate", "block swap is not modelled"),
        ({"fsdp": "full_shard", "fused_backward": "parameter"}, "simulate", "fused into backward"),
        ({"fsdp_offload": "cpu"}, "simulate", "it needs fsdp=full_shard or shard_grad_op"),
        ({"fsdp": "full_shard", "fsdp_offload": "cpu"}, "cpu", "pins host memory"),
        ({"fsdp": "full_shard", "train_mode": "qlora"}, "cpu", "fully_shard cannot shard"),
        ({"fsdp": "full_shard", "optimizer": "lion"}, "cpu", "only torch's optimizers"),
        ({"fsdp": "full_shard", "optimizer": "lion"}, "cuda", "only torch's optimizers"),
        ({"world_size": 2}, "simulate", "use zero_stage 1-3 or fsdp"),
    ],
)
def test_rules(knobs: dict, backend: str, message: str) -> None:
    from autofit.knobs import defaults

    preset = load_preset(LLAMA)
    config = {**defaults(), "resolution": 512, **knobs}
    reason = invalid_reason(config, load_gpu("a40"), preset, backend)
    assert reason and message in reason and "\n" not in reason
    assert (
        invalid_reason(
            {**defaults(), "resolution": 512, "fsdp": "full_shard", "world_size": 8},
            load_gpu("a40"),
            preset,
            "simulate",
        )
        is None
    )
    cpu = {**defaults(), "resolution": 512, "fsdp": "shard_grad_op"}
    assert invalid_reason(cpu, load_gpu("a40"), preset, "cpu") is None  # run for real
    assert "lists none" in invalid_reason(
        {**defaults(), "resolution": 64, "fsdp": "full_shard"},
        load_gpu("a40"),
        load_preset("tiny_mlp"),
        "simulate",
    )


def _log(tracker) -> list[tuple[int, int, int]]:
    """The event log as (sign, bytes, category), each run of frees in one order: the order in
    which Python drops references freed together (a group's originals) is no memory."""
    log: list[tuple[int, int, int]] = []
    frees: list[tuple[int, int, int]] = []
    for event in tracker.events:
        aid = event if event >= 0 else ~event
        entry = (1 if event >= 0 else -1, tracker.sizes[aid], tracker.categories[aid])
        if event < 0:
            frees.append(entry)
            continue
        log += sorted(frees) + [entry]
        frees = []
    return log + sorted(frees)


REAL_VS_EMULATED = [
    pytest.param({"fsdp": "full_shard"}, True, id="full_shard"),
    pytest.param({"fsdp": "shard_grad_op", "train_mode": "lora"}, False, id="shard_grad_op-lora"),
    pytest.param({"fsdp": "full_shard", "precision": "bf16_pure"}, True, id="bf16_pure",
                 marks=pytest.mark.slow),
    pytest.param({"fsdp": "full_shard", "precision": "fp32"}, True, id="fp32",
                 marks=pytest.mark.slow),
    pytest.param({"fsdp": "shard_grad_op", "optimizer": "sgd"}, False, id="shard_grad_op-sgd",
                 marks=pytest.mark.slow),
]  # fmt: skip


@pytest.mark.parametrize("knobs,tied", REAL_VS_EMULATED)
def test_fully_shard_for_real_measures_what_the_emulation_lays_out(knobs: dict, tied: bool) -> None:
    """torch 2.13 runs FSDP2 on the CPU in a gloo group of one: the same groups and policy as
    the emulation, the optimizer stepping the DTensor shards. The tracker follows each gathered
    weight FSDP2 frees and gathers back by resizing its storage, and counts DTensors by their
    local shards: every allocation and free of the real steps is the emulation's, so peaks,
    phases and breakdowns (GPU and host) are equal to the byte."""
    import peft  # noqa: F401  (it makes tensors when first imported: not the step's)

    from autofit.backends.cpu import trace as cpu_trace

    probe = tiny(tied, **knobs)
    real_run, real = cpu_trace(dataclasses.replace(probe, backend="cpu"))
    assert all(type(p).__name__ == "DTensor" for p in real_run.model.parameters())
    assert all(p.to_local().shape == p.shape for p in real_run.model.parameters())  # one rank
    _, fake = simulate.trace(probe)
    assert real.peak_report() == fake.peak_report()
    assert real.host_report() == fake.host_report()
    assert real.phase_changes == fake.phase_changes
    assert _log(real) == _log(fake)
    # What the breakdown holds: fp32 or bf16 shards (the weights' own dtype), whole at one rank.
    shards = sum(
        round_allocation(p.numel() * p.element_size()) for p in real_run.model.parameters()
    )
    buffers = sum(round_allocation(b.numel() * b.element_size()) for b in real_run.model.buffers())
    assert real.live_bytes("parameters") == shards + buffers


# --- exports -----------------------------------------------------------------------------------


def _point(config: dict[str, Any], model: str = LLAMA):
    from autofit.export.point import StudyPoint
    from autofit.knobs import defaults

    preset = load_preset(model)
    return StudyPoint(
        study="fsdp", summary_path=Path("fsdp/summary.json"), preset=preset,
        gpu="a40", backend="simulate", label="best",
        config={**defaults(), "resolution": preset.resolution, **config}, peak_bytes=1, budget_bytes=2,
        samples_per_s=1.0,
    )  # fmt: skip


def test_accelerate_fsdp_config_passes_accelerates_own_parser(tmp_path: Path, monkeypatch) -> None:
    import yaml
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    from autofit.export import TARGETS, write_export

    point = _point({"fsdp": "full_shard", "fsdp_offload": "cpu", "world_size": 8})
    write_export(TARGETS["accelerate"].run(point, tmp_path / "out"))
    path = tmp_path / "out" / "accelerate_config.yaml"
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.value == "FSDP" and config.num_processes == 8
    assert config.fsdp_config["fsdp_version"] == 2
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp
    # What `accelerate launch` hands the training process, and the plugin accelerate builds.
    env = prepare_multi_gpu_env(args)
    for key, value in env.items():
        if key.startswith(("FSDP_", "ACCELERATE_")):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True
    assert type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy"
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.cpu_ram_efficient_loading is True
    assert yaml.safe_load(path.read_text())["mixed_precision"] == "bf16"


@pytest.mark.parametrize(
    "target,model,config,message",
    [
        (
            "deepspeed",
            LLAMA,
            {"fsdp": "full_shard", "world_size": 2},
            "DeepSpeed shards with ZeRO, not FSDP",
        ),
        (
            "accelerate",
            LLAMA,
            {"fsdp": "full_shard", "precision": "bf16_autocast"},
            "upcasts the trained weights",
        ),
        (
            "simpletuner",
            "sana_1600m",
            {"fsdp": "full_shard", "train_mode": "lora", "precision": "fp32"},
            "only for model_type=full",
        ),
        ("sana", "sana_1600m", {"fsdp": "full_shard"}, "runs accelerate's FSDP1"),
        ("kohya", "flux_dev", {"fsdp": "full_shard"}, "sd-scripts has no FSDP"),
    ],
)
def test_targets_that_cannot_run_fsdp_refuse(
    tmp_path: Path, target: str, model: str, config: dict, message: str
) -> None:
    from autofit.errors import ConfigError
    from autofit.export import TARGETS

    with pytest.raises(ConfigError, match=message):
        TARGETS[target].run(_point(config, model), tmp_path / "out")


def test_simpletuner_says_fsdp2_in_its_own_flags(tmp_path: Path) -> None:
    from autofit.knobs import REGISTRY, Subject

    point = _point({"fsdp": "shard_grad_op", "fsdp_offload": "cpu", "world_size": 4}, "sana_1600m")
    subject = Subject(point.config, point.preset)
    words = REGISTRY["fsdp"].express("simpletuner", "shard_grad_op", subject)
    assert words.settings["fsdp_version"] == 2
    assert words.settings["fsdp_reshard_after_forward"] is False
    assert words.settings["fsdp_transformer_layer_cls_to_wrap"] == "SanaTransformerBlock"
    offload = REGISTRY["fsdp_offload"].express("simpletuner", "cpu", subject)
    assert offload.settings == {"fsdp_cpu_offload": True}
