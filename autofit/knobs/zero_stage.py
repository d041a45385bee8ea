"""zero_stage: DeepSpeed ZeRO, which partitions optimizer state (stage 1), gradients (2) and
weights (3) across the run's GPUs.

The `cpu` and `cuda` backends run real DeepSpeed (one process, world size 1, with the configured
optimizer handed to it); `simulate`, and any world size above one, use the emulation in
autofit/simulator/zero.py, which lays out one rank's memory as DeepSpeed does. ZeRO runs the
model in 16-bit with fp32 master weights in the optimizer (precision bf16 or fp16) and its own
fused AdamW. Its companions: `offload_optimizer`, `offload_params` and `world_size`.

This module is also where DeepSpeed's configuration is written, for the probe and for every
export that carries one: the rules ZeRO's knobs obey (`zero_rule`) and the config blocks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.trainers import SIMPLETUNER_ENV

if TYPE_CHECKING:
    from autofit.run_state import RunState

# DeepSpeed clips gradients at 1.0 unless told otherwise; exports write it out so the file says it.
GRADIENT_CLIPPING = 1.0


def zero_rule(config: Mapping[str, Any]) -> str | None:
    """Why ZeRO's knobs cannot go together as set, or None: offload is ZeRO-Offload, weights
    are offloaded by stage 3 only, and ZeRO runs a 16-bit model with fp32 master weights."""
    stage = config.get("zero_stage", 0)
    if not stage and config.get("offload_optimizer", "none") != "none":
        return "offload_optimizer=cpu is ZeRO-Offload: it needs zero_stage 1, 2 or 3"
    if config.get("offload_params", "none") != "none" and stage != 3:
        return "offload_params=cpu needs zero_stage=3"
    if stage and config.get("precision") not in ("bf16", "fp16"):
        return f"zero_stage={stage} runs DeepSpeed's 16-bit model with fp32 master weights: use precision=bf16 or fp16"
    return None


def sixteen_bit_block(precision: str) -> dict[str, Any]:
    """DeepSpeed's mixed-precision block: a 16-bit model, fp32 master weights in its optimizer."""
    block: dict[str, Any] = {"enabled": True}
    if precision == "fp16":
        block["loss_scale"] = 0  # 0: dynamic loss scaling, as the probe's GradScaler
    return {precision: block}


def zero_optimization(config: Mapping[str, Any], pin_memory: bool) -> dict[str, Any]:
    """DeepSpeed's `zero_optimization` block: the stage and where offloaded state lives."""
    zero: dict[str, Any] = {"stage": config["zero_stage"]}
    if config["offload_optimizer"] == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if config["offload_params"] == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    return zero


def probe_config(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config a probe runs: this rank's batch, the 16-bit mode, ZeRO and offload.
    Host buffers are not pinned (the CPU backend has nothing to pin them for), and the
    configured optimizer (torch's fused AdamW) is handed over, also when offloaded: DeepSpeed's
    own CPU Adam needs a compiled extension."""
    precision = "fp16" if knobs["precision"] == "fp16" else "bf16"
    return {
        "train_micro_batch_size_per_gpu": knobs["batch_size"],
        "gradient_accumulation_steps": 1,
        **sixteen_bit_block(precision),
        "zero_optimization": zero_optimization(knobs, pin_memory=False),
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
    }


class DeepSpeedStep:
    """A DeepSpeed engine driving backward and the update (it clears gradients itself)."""

    def __init__(self, engine: Any, optimizer: Any) -> None:
        self.module, self.optimizer = engine, optimizer

    @property
    def state(self) -> dict[Any, Any]:
        return self.optimizer.state

    def backward(self, loss: Any) -> None:
        self.module.backward(loss)

    def step(self) -> None:
        self.module.step()


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


def _emulated(run: RunState) -> bool:
    return run.fake or run.knobs["world_size"] > 1


# -- trainers ---------------------------------------------------------------------------------


def zero_checked(words: Any = None) -> Any:
    """Trainer words for one of ZeRO's knobs that first check ZeRO's rules (an export may read a
    hand-edited study). Without `words`, nothing of its own to write: zero_stage's block, or the
    config file it goes in, carries it."""

    def express(value: Any, s: Subject) -> Say | Refuse:
        broken = zero_rule(s.config)
        if broken:
            return Refuse(broken)
        return words(value, s) if words else Say()

    return express


def _accelerate(stage: Any, s: Subject) -> Say:
    world = s.world_size
    if not stage:
        return say(distributed_type="MULTI_GPU" if world > 1 else "NO")
    block: dict[str, Any] = {
        "gradient_accumulation_steps": s.accumulation,
        "gradient_clipping": GRADIENT_CLIPPING,
        "offload_optimizer_device": s.config["offload_optimizer"],
        "offload_param_device": s.config["offload_params"],
        # ZeRO-3 builds the model already partitioned; otherwise each rank would first hold all.
        "zero3_init_flag": stage == 3,
        "zero_stage": stage,
    }
    if stage == 3:
        block["zero3_save_16bit_model"] = True
    return say(distributed_type="DEEPSPEED", deepspeed_config=block)


def _kohya(stage: Any, s: Subject) -> Say:
    if not stage:
        return Say()
    return say(
        deepspeed=True, zero_stage=stage, **({"zero3_init_flag": True} if stage == 3 else {})
    )


NO_DEEPSPEED = Refuse(
    "Sana's train.py shards with FSDP (train.use_fsdp), not DeepSpeed ZeRO"
)  # and offload


class ZeroStage(Knob):
    name = "zero_stage"
    default = 0
    help = "DeepSpeed ZeRO stage: 0 (off) | 1 | 2 | 3"
    kind = int
    values = {
        0: "no ZeRO",
        1: "DeepSpeed ZeRO stage 1 (optimizer state partitioned)",
        2: "DeepSpeed ZeRO stage 2 (optimizer state and gradients partitioned)",
        3: "DeepSpeed ZeRO stage 3 (optimizer state, gradients and weights partitioned)",
    }
    reads = ("optimizer",)  # DeepSpeed wraps it (the emulation keeps its own fused AdamW)
    writes = ("stepper",)
    after = ("train_mode",)  # it partitions the parameters that train

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # With one GPU, ZeRO partitions nothing and only adds its own buffers: it saves memory
        # only through offload, which the offload knobs carry; across GPUs each stage saves over
        # the one below at the cost of more communication.
        lower = [v for v in searched if v < value]
        return max(lower) if value and lower else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        knobs = context.knobs
        broken = zero_rule(knobs)
        if broken or not value:
            return broken
        if knobs.get("optimizer") != "adamw":
            return f"zero_stage={value} runs DeepSpeed's fused AdamW: optimizer={knobs.get('optimizer')} is not supported with it"
        for knob, off in (("train_mode", "full"), ("swap_blocks", 0), ("ema", "off")):
            if knobs.get(knob, off) != off:
                return f"zero_stage={value} with {knob}={knobs[knob]} is not modelled"
        if value == 3 and knobs.get("validation", "off") != "off":
            return f"zero_stage=3 with validation={knobs['validation']} is not modelled (the pipeline needs gathered weights)"
        return None

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value != 3:
            return None
        # ZeRO-3 partitions weights as the model is constructed (zero.Init): no GPU ever holds
        # the whole model. The emulation builds it in host memory, then shards it.
        if _emulated(run):
            return run.host()
        import deepspeed

        _single_process_group(run.device)
        return deepspeed.zero.Init(config_dict_or_path=probe_config(run.knobs))

    def apply(self, run: RunState, value: Any) -> None:
        if not value:
            return
        knobs = run.knobs
        if _emulated(run):
            from autofit.run_state import PlainStep
            from autofit.simulator.zero import ZeroEmulation

            emulation = ZeroEmulation(
                run, value, knobs["world_size"], knobs["offload_optimizer"] == "cpu",
                knobs["offload_params"] == "cpu",
            )  # fmt: skip
            run.stepper = PlainStep(emulation, None, grads_set_to_none=True)
            return
        import deepspeed

        _single_process_group(run.device)
        engine, optimizer, _, _ = deepspeed.initialize(
            model=run.model, optimizer=run.optimizer, config=probe_config(knobs)
        )
        run.stepper = DeepSpeedStep(engine, optimizer)

    trainers = {
        "accelerate": zero_checked(_accelerate),
        "deepspeed": zero_checked(
            lambda v, s: say(zero_optimization=zero_optimization(s.config, pin_memory=True))
        ),
        "kohya": zero_checked(_kohya),
        "simpletuner": zero_checked(
            lambda v, s: (
                say(deepspeed_config=f"config/{SIMPLETUNER_ENV}/ds_config.json") if v else Say()
            )
        ),
        "sana": {0: Say(), 1: NO_DEEPSPEED, 2: NO_DEEPSPEED, 3: NO_DEEPSPEED},
        # The accelerate config the script is launched with carries it (its accelerate words).
        "diffusers": zero_checked(),
    }
