"""DeepSpeed ZeRO: optimizer state, gradients and weights partitioned across the run's GPUs.

- `zero_stage`: 0 (off), 1 (optimizer state partitioned), 2 (and gradients), 3 (and weights).
- `offload_optimizer`: `none` or `cpu` (ZeRO-Offload: optimizer state and update in host memory).
- `offload_params`: `none` or `cpu` (stage 3 only: the weight shares in host memory too).
- `world_size`: GPUs per run; memory figures are per GPU, throughput for the whole run.

The `cpu` and `cuda` backends run real DeepSpeed (one process, world size 1, with the configured
optimizer handed to it); `simulate`, and any world size above one, use the emulation in
autofit/zero.py, which lays out one rank's memory as DeepSpeed does. ZeRO runs the model in 16-bit
with fp32 master weights in the optimizer (precision bf16 or fp16) and its own fused AdamW.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class ZeroStage(Technique):
    knob = Knob(
        "zero_stage", 0, "DeepSpeed ZeRO stage: 0 (off) | 1 | 2 | 3", kind=int, choices=(0, 1, 2, 3)
    )

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # With one GPU, ZeRO partitions nothing and only adds its own buffers: it saves memory
        # only through offload, which the offload knobs carry; across GPUs each stage saves over
        # the one below at the cost of more communication.
        lower = [v for v in searched if v < value]
        return max(lower) if value and lower else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        knobs = context.knobs
        if not value:
            if knobs.get("offload_optimizer", "none") != "none":
                return "offload_optimizer=cpu is ZeRO-Offload: it needs zero_stage 1, 2 or 3"
            if knobs.get("offload_params", "none") != "none":
                return "offload_params=cpu needs zero_stage=3"
            return None
        if knobs.get("offload_params", "none") != "none" and value != 3:
            return "offload_params=cpu needs zero_stage=3"
        if knobs.get("precision") not in ("bf16", "fp16"):
            return f"zero_stage={value} runs DeepSpeed's 16-bit model with fp32 master weights: use precision=bf16 or fp16"
        if knobs.get("optimizer") != "adamw":
            return f"zero_stage={value} runs DeepSpeed's fused AdamW: optimizer={knobs.get('optimizer')} is not supported with it"
        for knob, off in (("train_mode", "full"), ("swap_blocks", 0), ("ema", "off")):
            if knobs.get(knob, off) != off:
                return f"zero_stage={value} with {knob}={knobs[knob]} is not modelled"
        if value == 3 and knobs.get("validation") == "on":
            return "zero_stage=3 with validation=on is not modelled (the pipeline needs gathered weights)"
        return None

    def before_build(self, run: TrainingRun, value: Any) -> None:

        if value:  # DeepSpeed keeps the model itself in 16-bit (bf16 or fp16: invalid_reason)
            run.param_dtype = run.frozen_dtype
        if value == 3:
            # ZeRO-3 partitions weights as the model is constructed (zero.Init): no GPU ever
            # holds the whole model. The emulation builds it in host memory, then shards it.
            if run.fake or run.knobs["world_size"] > 1:
                run.build_contexts.append(run.host())
            else:
                import deepspeed

                _single_process_group(run.device)
                run.build_contexts.append(
                    deepspeed.zero.Init(config_dict_or_path=_config(run, value))
                )

    def after_build(self, run: TrainingRun, value: Any) -> None:
        if not value:
            return
        run.autocast_dtype = None  # the model is 16-bit already: no autocast, no GradScaler
        run.scaler = None
        knobs = run.knobs
        offload_optimizer = knobs["offload_optimizer"] == "cpu"
        offload_params = knobs["offload_params"] == "cpu"
        if run.fake or knobs["world_size"] > 1:
            from autofit.simulator.zero import ZeroEmulation

            run.optimizer = ZeroEmulation(
                run, value, knobs["world_size"], offload_optimizer, offload_params
            )
        else:
            _deepspeed_engine(run, value)


def _deepspeed_engine(run: TrainingRun, stage: int) -> None:
    import deepspeed

    _single_process_group(run.device)
    engine, optimizer, _, _ = deepspeed.initialize(
        model=run.model, optimizer=run.optimizer, config=_config(run, stage)
    )
    run.model, run.optimizer, run.engine = engine, optimizer, engine


def _config(run: TrainingRun, stage: int) -> dict[str, Any]:
    """The DeepSpeed config of the run: this rank's batch, 16-bit mode, ZeRO stage and offload."""
    precision = "fp16" if run.knobs["precision"] == "fp16" else "bf16"
    zero: dict[str, Any] = {"stage": stage}
    if run.knobs["offload_optimizer"] == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if run.knobs["offload_params"] == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": run.knobs["batch_size"],
        "gradient_accumulation_steps": 1,
        precision: {"enabled": True},
        "zero_optimization": zero,
        # The configured optimizer (torch's fused AdamW) is handed over, also when offloaded:
        # DeepSpeed's own CPU Adam needs a compiled extension.
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
    }


def _single_process_group(device: Any) -> None:
    import deepspeed
    import torch

    if torch.distributed.is_initialized():
        return
    for key, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29517"),
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
    ):
        os.environ.setdefault(key, value)
    if device.type == "cpu":
        # One process has no peer to share memory with, and building DeepSpeed's shared-memory
        # extension takes minutes.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")


class OffloadOptimizer(Technique):
    knob = Knob(
        "offload_optimizer",
        "none",
        "ZeRO-Offload: optimizer state and update in host memory: none | cpu",
        choices=("none", "cpu"),
    )

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "none" if value == "cpu" else None


class OffloadParams(Technique):
    knob = Knob(
        "offload_params",
        "none",
        "ZeRO-3 weight shares in host memory: none | cpu",
        choices=("none", "cpu"),
    )

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "none" if value == "cpu" else None


class WorldSize(Technique):
    knob = Knob("world_size", 1, "GPUs per run (ZeRO partitions across them)", kind=int, minimum=1)

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value > 1 and context.backend in ("cpu", "cuda"):
            return f"world_size={value}: a probe runs one process, so only the simulate backend models {value} GPUs"
        if value > 1 and not context.knobs.get("zero_stage"):
            return f"world_size={value} without ZeRO runs the same memory on each GPU as world_size=1: use zero_stage 1-3"
        return None
