"""zero_stage: DeepSpeed ZeRO, which partitions optimizer state (stage 1), gradients (2) and
weights (3) across the run's GPUs.

The `cpu` and `cuda` backends run real DeepSpeed (one process, world size 1, with the configured
optimizer handed to it); `simulate`, and any world size above one, use the emulation in
autofit/emulations/zero.py, which lays out one rank's memory as DeepSpeed does. ZeRO runs the
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
from autofit.knobs.zero3_params import ZERO3_SETTINGS
from autofit.trainers import SIMPLETUNER_ENV

if TYPE_CHECKING:
    from autofit.run_state import RunState

# DeepSpeed clips gradients at 1.0 unless told otherwise; exports write it out so the file says it.
GRADIENT_CLIPPING = 1.0


def zero_rule(config: Mapping[str, Any]) -> str | None:
    """Why ZeRO's knobs cannot go together as set, or None: offload is ZeRO-Offload, weights
    are offloaded by stage 3 only, NVMe is stage 3's (ZeRO-Infinity), and ZeRO runs a 16-bit
    model with fp32 master weights."""
    stage = config.get("zero_stage", 0)
    optimizer = config.get("offload_optimizer", "none")
    if not stage and optimizer != "none":
        return f"offload_optimizer={optimizer} is ZeRO-Offload: it needs zero_stage 1, 2 or 3"
    if optimizer == "nvme" and stage != 3:
        # deepspeed/runtime/zero/stage_1_and_2.py takes any offload device as the CPU: the
        # state would sit in host memory, not on the drive.
        return f"offload_optimizer=nvme needs zero_stage=3 (DeepSpeed's stage {stage} keeps it in host memory)"
    params = config.get("offload_params", "none")
    if params != "none" and stage != 3:
        return f"offload_params={params} needs zero_stage=3"
    if stage and config.get("precision") not in ("bf16", "fp16"):
        return f"zero_stage={stage} runs DeepSpeed's 16-bit model with fp32 master weights: use precision=bf16 or fp16"
    return None


def sixteen_bit_block(precision: str) -> dict[str, Any]:
    """DeepSpeed's mixed-precision block: a 16-bit model, fp32 master weights in its optimizer."""
    block: dict[str, Any] = {"enabled": True}
    if precision == "fp16":
        block["loss_scale"] = 0  # 0: dynamic loss scaling, as the probe's GradScaler
    return {precision: block}


# Where ZeRO-Infinity's exported config puts its swap files: a directory on a local NVMe drive,
# which the user must name (DeepSpeed's own tutorial writes /local_nvme).
NVME_PATH = "/local_nvme"


def live_parameters(config: Mapping[str, Any]) -> dict[str, int]:
    """The `stage3_*` entries of DeepSpeed's `zero_optimization` block (a configuration stored
    before these knobs ran with DeepSpeed's defaults)."""
    return {knob.key: config.get(knob.name, knob.default) for knob in ZERO3_SETTINGS}


def zero_optimization(config: Mapping[str, Any], pin_memory: bool) -> dict[str, Any]:
    """DeepSpeed's `zero_optimization` block: the stage, where offloaded state lives (the
    NVMe buffers at DeepSpeed's defaults, which autofit/emulations/nvme.py emulates) and, for
    stage 3, what stays gathered (the zero3_* knobs)."""
    zero: dict[str, Any] = {"stage": config["zero_stage"]}
    if config["zero_stage"] == 3:
        zero.update(live_parameters(config))
    for knob, key in (
        ("offload_optimizer", "offload_optimizer"),
        ("offload_params", "offload_param"),
    ):
        device = config[knob]
        if device != "none":
            zero[key] = {"device": device, "pin_memory": pin_memory}
            if device == "nvme":
                zero[key]["nvme_path"] = NVME_PATH
    return zero


NVME_NOTE = (
    f"NVMe offload: point nvme_path ({NVME_PATH}) at a directory on a local NVMe drive with room "
    "for the offloaded states; offload_param.buffer_size must hold the largest weight's share "
    "(DeepSpeed asserts it)"
)


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

    # lazy: the knobs load without torch (docs/contributing.md)
    from autofit.distributed import join_group_of_one

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)  # DeepSpeed's engine reads its rank from these
    if torch.distributed.is_initialized():
        return
    if device.type == "cpu":
        # One process has no peer to share memory with, and building DeepSpeed's shared-memory
        # extension takes minutes.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    join_group_of_one(device)  # DeepSpeed takes over a group torch already has
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")


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
    for knob in ("offload_optimizer", "offload_params"):
        if s.config[knob] == "nvme":
            key = "offload_optimizer" if knob == "offload_optimizer" else "offload_param"
            block[f"{key}_nvme_path"] = NVME_PATH
    if stage == 3:
        block["zero3_save_16bit_model"] = True
    return say(note=_lora_note(stage, s), distributed_type="DEEPSPEED", deepspeed_config=block)


def _lora_note(stage: Any, s: Subject) -> str:
    """What one's own code must do for ZeRO with adapters, and for NVMe offload (nothing of it
    is a DeepSpeed key: the 4-bit storage dtype is an argument of the model's loading)."""
    notes = []
    if s.config.get("train_mode") in ("lora", "qlora"):
        notes.append(
            "ZeRO with LoRA: give the optimizer only the adapters (peft's get_peft_model freezes "
            "the base); DeepSpeed keeps master weights, moments and gradients for them alone"
        )
    if stage == 3 and s.config.get("train_mode") == "qlora":
        notes.append(
            "ZeRO-3 with QLoRA: load the base with BitsAndBytesConfig(..., "
            "bnb_4bit_quant_storage=torch.bfloat16) and torch_dtype=torch.bfloat16 (the 16-bit "
            "dtype) so ZeRO-3 can partition the packed 4-bit weights, as peft's DeepSpeed guide says"
        )
    if "nvme" in (s.config.get("offload_optimizer"), s.config.get("offload_params")):
        notes.append(NVME_NOTE)
    return "; ".join(notes)


def _deepspeed(stage: Any, s: Subject) -> Say:
    return say(
        note=_lora_note(stage, s) if stage else "",
        zero_optimization=zero_optimization(s.config, pin_memory=True),
    )


def _kohya(stage: Any, s: Subject) -> Say:
    if not stage:
        return Say()
    return say(
        deepspeed=True, zero_stage=stage, **({"zero3_init_flag": True} if stage == 3 else {})
    )


# torchtune 0.6.1 has no DeepSpeed: its distributed recipes shard with FSDP2 (training/_distributed.py).
TORCHTUNE_NO_ZERO = Refuse(
    "torchtune has no DeepSpeed ZeRO or ZeRO-Offload; its distributed recipes shard with FSDP2",
    "fsdp=full_shard or shard_grad_op, with fsdp_offload=cpu for host offload",
)
# litgpt 0.5.13's finetune scripts choose Lightning's strategy themselves: FSDP on several devices.
LITGPT_NO_ZERO = Refuse("LitGPT's finetune scripts shard with FSDP, never DeepSpeed ZeRO")
NO_DEEPSPEED = Refuse(
    "Sana's train.py shards with FSDP (train.use_fsdp), not DeepSpeed ZeRO"
)  # and offload


class ZeroStage(Knob):
    name = "zero_stage"
    depends_on = (
        "batch_size",
        "ema",
        "offload_optimizer",
        "offload_params",
        "optimizer",
        "precision",
        "swap_blocks",
        "train_mode",
        "validation",
        "world_size",
        "zero3_max_live_params",
        "zero3_max_reuse_distance",
        "zero3_persistence_threshold",
        "zero3_prefetch_bucket",
    )
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
        mode = knobs.get("train_mode", "full")
        if mode not in ("full", "lora", "qlora"):
            return f"zero_stage={value} with train_mode={mode} is not modelled"
        if mode == "qlora" and value == 3 and context.backend != "simulate":
            # ZeRO-3 partitions only weights stored in the 16-bit dtype (bnb_4bit_quant_storage);
            # the bitsandbytes layers the real backends build keep theirs in uint8, which
            # DeepSpeed's zero.Init cannot partition (stages 1 and 2 run for real).
            return "zero_stage=3 with train_mode=qlora is emulated only (the 4-bit weights in 16-bit storage): use backend=simulate"
        for knob, off in (("swap_blocks", 0), ("ema", "off")):
            if knobs.get(knob, off) != off:
                return f"zero_stage={value} with {knob}={knobs[knob]} is not modelled"
        nvme = [k for k in ("offload_optimizer", "offload_params") if knobs.get(k) == "nvme"]
        if nvme and context.backend != "simulate":
            return f"{nvme[0]}=nvme needs DeepSpeed's async I/O op and a drive: it is emulated only, use backend=simulate"
        if value == 3 and knobs.get("validation", "off") != "off":
            return f"zero_stage=3 with validation={knobs['validation']} is not modelled (the pipeline needs gathered weights)"
        return None

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value != 3:
            return None
        # ZeRO-3 partitions weights as the model is constructed (zero.Init): no GPU ever holds
        # the whole model. The emulation builds it in host memory, then shards it.
        if run.sharding_emulated:
            return run.host()
        import deepspeed
        import torch._dynamo  # noqa: F401

        # torch._dynamo must be imported before zero.Init replaces the tensor constructors:
        # torch imports it lazily, at the first module built inside, and its polyfill of
        # Tensor.__new__ then refuses DeepSpeed's replacement (a TypeError in a fresh process).
        _single_process_group(run.device)
        return deepspeed.zero.Init(config_dict_or_path=probe_config(run.knobs))

    def apply(self, run: RunState, value: Any) -> None:
        if not value:
            return
        knobs = run.knobs
        if run.sharding_emulated:
            # lazy: the knobs load without torch (docs/contributing.md)
            from autofit.emulations.zero import ZeroEmulation
            from autofit.emulations.zero_gather import LiveParams
            from autofit.run_state import PlainStep

            live = live_parameters(knobs)
            emulation = ZeroEmulation(
                run, value, knobs["world_size"], knobs["offload_optimizer"], knobs["offload_params"],
                LiveParams(
                    live["stage3_prefetch_bucket_size"], live["stage3_max_live_parameters"],
                    live["stage3_max_reuse_distance"], live["stage3_param_persistence_threshold"],
                ),
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
        "deepspeed": zero_checked(_deepspeed),
        "kohya": zero_checked(_kohya),
        "simpletuner": zero_checked(
            lambda v, s: (
                _no_quant_storage(v, s, "SimpleTuner")
                or (
                    say(deepspeed_config=f"config/{SIMPLETUNER_ENV}/ds_config.json") if v else Say()
                )
            )
        ),
        "sana": {0: Say(), 1: NO_DEEPSPEED, 2: NO_DEEPSPEED, 3: NO_DEEPSPEED},
        # The accelerate config the script is launched with carries it (its accelerate words).
        "diffusers": zero_checked(
            lambda v, s: _no_quant_storage(v, s, "the diffusers example scripts") or Say()
        ),
        # The accelerate config TRL's train.py is launched with carries it (its accelerate words).
        "trl": zero_checked(lambda v, s: Say()),
        # axolotl's `deepspeed` names the DeepSpeed JSON written beside its config (the layout's).
        "axolotl": zero_checked(lambda v, s: Say()),
        "torchtune": lambda v, s: Say() if not v else TORCHTUNE_NO_ZERO,
        "litgpt": {0: Say(), 1: LITGPT_NO_ZERO, 2: LITGPT_NO_ZERO, 3: LITGPT_NO_ZERO},
        # LLaMA-Factory's `deepspeed` names the DeepSpeed JSON written beside its config (the
        # layout's); it keeps a 4-bit base in its compute dtype (bnb_4bit_quant_storage,
        # model/model_utils/quantization.py), which ZeRO-3 partitions.
        "llamafactory": zero_checked(lambda v, s: Say()),
    }


def _no_quant_storage(stage: Any, s: Subject, trainer: str) -> Refuse | None:
    """ZeRO-3 partitions a 4-bit base only if it is stored in the 16-bit dtype, a loading
    argument a trainer without a setting for it cannot give."""
    if stage == 3 and s.config.get("train_mode") == "qlora":
        return Refuse(
            f"{trainer} cannot set bnb_4bit_quant_storage, which ZeRO-3 needs to partition a "
            "4-bit base",
            "zero_stage=0, 1, 2",
        )
    return None
