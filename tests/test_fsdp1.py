"""FSDP1 (`FullyShardedDataParallel`, flat parameters): the emulation against torch's own FSDP1
to the byte, at one GPU (where FSDP1 runs NO_SHARD) and at 2 and 4 (a fake process group: real
CPU tensors, collectives that move nothing), the root unit kept gathered, and its exports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_fsdp import _live_at_phase_end, _log, _point, tiny

from autofit.backends import simulate
from autofit.distributed import fake_group
from autofit.run_state import RunState
from autofit.simulator.tracker import round_allocation

REAL_VS_EMULATED = [
    pytest.param(1, {"fsdp": "full_shard"}, id="no_shard-1gpu"),
    pytest.param(2, {"fsdp": "full_shard"}, id="full_shard-2"),
    pytest.param(4, {"fsdp": "shard_grad_op"}, id="shard_grad_op-4"),
]


@pytest.mark.parametrize("world,knobs", REAL_VS_EMULATED)
def test_fsdp1_for_real_allocates_what_the_emulation_lays_out(world, knobs, monkeypatch) -> None:
    """torch's FullyShardedDataParallel on real CPU tensors (in a fake group of `world` ranks, as
    the cpu backend runs a group of one) against the emulation on fake tensors: every allocation
    and free of build and steps, in order, with its size and category; peaks per phase; host
    memory."""
    import peft  # noqa: F401  (it makes tensors when first imported: not the step's)

    import autofit.emulations.fsdp1_real as fsdp1
    from autofit.backends.cpu import trace as cpu_trace

    probe = tiny(True, fsdp_version=1, world_size=world, **knobs)
    if world > 1:  # the cpu backend runs the library itself, in a group of `world`
        group = fake_group(world)
        real_shard = fsdp1.shard_fsdp1_for_real
        monkeypatch.setattr(RunState, "sharding_emulated", property(lambda self: self.fake))
        monkeypatch.setattr(
            fsdp1, "shard_fsdp1_for_real", lambda run, reshard: real_shard(run, reshard, group)
        )
    real_run, real = cpu_trace(dataclasses.replace(probe, backend="cpu"))
    monkeypatch.undo()
    flat = [p for n, p in real_run.model.named_parameters()]
    assert flat and all(n.endswith("_flat_param") for n, _ in real_run.model.named_parameters())
    _, fake = simulate.trace(probe)
    assert real.peak_report() == fake.peak_report()
    assert real.host_report() == fake.host_report()
    assert real.phase_changes == fake.phase_changes
    assert _log(real) == _log(fake)


def test_the_root_unit_stays_gathered_from_forward_into_backward() -> None:
    world = 4
    run, one = simulate.trace(tiny(False, fsdp="full_shard", fsdp_version=1, world_size=world))
    _, two = simulate.trace(tiny(False, fsdp="full_shard", world_size=world))
    root = run.model._flat_param  # embedding, final norm and head, flattened: rank 0's shard
    shard = root.numel()
    # At the end of forward FSDP1 still holds the root's padded gathered flat parameter in bf16
    # (the policy's dtype) beside every unit's fp32 shard; FSDP2 holds the tail (norm, head).
    gathered = round_allocation(2 * shard * world)
    held = _live_at_phase_end(one, "forward", "parameters")
    shards = sum(round_allocation(4 * p.numel()) for p in run.model.parameters())
    buffers = sum(round_allocation(b.numel() * b.element_size()) for b in run.model.buffers())
    assert held == shards + buffers + gathered
    assert one.peak > two.peak


def test_accelerate_fsdp1_config_passes_accelerates_own_parser(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    from autofit.export import TARGETS, write_export

    point = _point(
        {"fsdp": "full_shard", "fsdp_version": 1, "fsdp_offload": "cpu", "world_size": 4}
    )
    write_export(TARGETS["accelerate"].run(point, tmp_path / "out"))
    path = tmp_path / "out" / "accelerate_config.yaml"
    config = load_config_from_file(str(path))
    assert config.fsdp_config["fsdp_version"] == 1
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)  # what `accelerate launch` hands the training process
    assert env["FSDP_VERSION"] == "1"
    assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
    assert env["FSDP_BACKWARD_PREFETCH"] == "BACKWARD_PRE"
    assert env["FSDP_USE_ORIG_PARAMS"] == "false"
    assert env["FSDP_OFFLOAD_PARAMS"] == "true"
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"


def test_simpletuner_refuses_fsdp1(tmp_path: Path) -> None:
    from autofit.errors import ConfigError
    from autofit.export import TARGETS

    point = _point(
        {"fsdp": "full_shard", "fsdp_version": 1, "world_size": 2, "precision": "fp32"},
        "sana_1600m",
    )
    with pytest.raises(ConfigError, match="FSDP2 only"):
        TARGETS["simpletuner"].run(point, tmp_path / "out")


def test_gathers_and_reductions_come_from_their_own_streams_pools() -> None:
    """FSDP1 all-gathers on its unshard stream and reduces on its post-backward stream: each
    unit's padded flat parameter is allocated on the one, the gradient's reduce-scatter on the
    other, and the caching allocator's model keeps their freed blocks for their own stream, so
    the run reserves more than with every block reusable by any request."""
    from autofit.emulations.fsdp1 import POST_BACKWARD, UNSHARD
    from autofit.simulator.allocator_replay import replay

    world = 4
    _, log = simulate.trace(tiny(True, fsdp="full_shard", fsdp_version=1, world_size=world))
    assert UNSHARD in log.streams and POST_BACKWARD in log.streams
    shared = replay(log.events, log.sizes).peak_reserved_bytes
    own = replay(log.events, log.sizes, streams=log.streams).peak_reserved_bytes
    assert own > shared
