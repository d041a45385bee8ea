"""fsdp: PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`), which shards every parameter, its
gradient and its optimizer state across the run's GPUs, beside DeepSpeed ZeRO.

- `off`: no FSDP.
- `full_shard`: `fully_shard` on each transformer block (the preset's `blocks`) and on the rest,
  with `reshard_after_forward=True`: a block's weights are all-gathered before its forward, freed
  after it, and gathered again for its backward (FSDP1's FULL_SHARD; ZeRO-3's layout).
- `shard_grad_op`: the same groups with `reshard_after_forward=False`: a block's gathered weights
  stay from its forward to its backward (FSDP1's SHARD_GRAD_OP; one all-gather fewer per step).

Every group follows accelerate 1.15's `fsdp2_prepare_model` (accelerate/utils/fsdp_utils.py): the
blocks, a language model's untied input embedding, the tail (final norm and output head, with the
input embedding when tied) never resharded after forward, and the root for what is left, which
FSDP2 itself never reshards after forward (torch/distributed/fsdp/_fully_shard/_fsdp_state.py).

The mixed-precision policy follows the precision knob, as accelerate builds it from its
`mixed_precision`: under mixed precision (`bf16`, `fp16`) the sharded weights stay fp32 and are
gathered in the 16-bit dtype, gradients reduced in it (`MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=bf16)`), the step runs on the fp32 shards; `bf16_pure` shards bf16 weights and
gathers them as they are (no policy); `fp32` gathers fp32. The companion `fsdp_offload` keeps
the shards, their gradients and the optimizer step in host memory (FSDP2's CPUOffloadPolicy).

`simulate`, and every world size above one, use the emulation in autofit/emulations/fsdp.py (one
rank's memory, byte for byte as FSDP2 lays it out); the `cpu` and `cuda` backends run
`fully_shard` itself in a one-process group (on the CPU: gloo), where the tracker follows the
gathered weights FSDP2 frees and re-allocates by resizing their storage, and counts a DTensor's
local shard (tests/test_fsdp.py compares the two to the byte). LoRA and QLoRA shard every weight
and train only the adapters; a QLoRA base shards its packed 4-bit weights stored as bf16
(bitsandbytes' `bnb_4bit_quant_storage=bfloat16`, as FSDP-QLoRA needs).

The knob is here with the diffusion trainers' and accelerate's words; the language-model trainers'
words are in language_models.py, what both read (the rules, the block classes) in shared.py.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.fsdp import language_models
from autofit.knobs.fsdp.shared import (
    NOT_FSDP,
    RESHARD_AFTER_FORWARD,
    block_classes,
    checked,
    checked_all,
    fsdp_rule,
    ram_efficient,
)
from autofit.knobs.train_mode import FOUR_BIT_MODES

if TYPE_CHECKING:
    from autofit.run_state import RunState


def _accelerate_fsdp1(value: Any, s: Subject) -> Say | Refuse:
    """accelerate's FSDP1 keys (accelerate/utils/dataclasses.py, FullyShardedDataParallelPlugin),
    as the emulation runs it: flat parameters, BACKWARD_PRE, MixedPrecision from mixed_precision
    over trained flat parameters accelerate holds in fp32."""
    block = {
        "fsdp_version": 1,
        "fsdp_sharding_strategy": "FULL_SHARD" if RESHARD_AFTER_FORWARD[value] else "SHARD_GRAD_OP",
        "fsdp_offload_params": s.config["fsdp_offload"] == "cpu",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": block_classes(s.preset),
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_forward_prefetch": False,
        "fsdp_use_orig_params": False,
        "fsdp_sync_module_states": True,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": ram_efficient(s),
        "fsdp_activation_checkpointing": False,
    }
    note = ""
    if s.config["train_mode"] != "full":
        note = (
            f"train_mode={s.config['train_mode']} under FSDP1 with use_orig_params=false: wrap "
            "each adapter layer in its own unit (peft.utils.other.fsdp_auto_wrap_policy; the HF "
            "Trainer does this itself for a PEFT model)"
        )
    return say(note=note, distributed_type="FSDP", fsdp_config=block)


def _accelerate(value: Any, s: Subject) -> Say | Refuse:
    if s.config["precision"] == "bf16_autocast":
        # FSDP2: fsdp2_prepare_model; FSDP1: Accelerator.prepare_model, "DeepSpeed's strategy to
        # hold the parameters in full precision" (accelerate 1.15, accelerator.py)
        return Refuse(
            "under FSDP with mixed precision accelerate upcasts the trained weights to fp32, "
            "so the run is precision=bf16, not bf16 weights",
            NOT_FSDP,
        )
    if s.config.get("fsdp_version", 2) == 1:
        return _accelerate_fsdp1(value, s)
    block = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": RESHARD_AFTER_FORWARD[value],
        "fsdp_offload_params": s.config["fsdp_offload"] == "cpu",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": block_classes(s.preset),
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": ram_efficient(s),
        # The training code checkpoints the blocks itself (the checkpointing knob's note).
        "fsdp_activation_checkpointing": False,
    }
    note = ""
    if s.config["train_mode"] in FOUR_BIT_MODES:
        note = (
            f"train_mode={s.config['train_mode']} under FSDP: load the 4-bit base with "
            "BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16), so fully_shard can "
            "shard its packed weights (uint8 ones it leaves whole on every GPU)"
        )
    return say(note=note, distributed_type="FSDP", fsdp_config=block)


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    """SimpleTuner's FSDP2 flags (documentation/FSDP2.md; its 4.10.1 option list): full-model
    runs only."""
    if s.config.get("fsdp_version", 2) == 1:
        return Refuse(
            "autofit writes SimpleTuner's FSDP flags for FSDP2 only (documentation/FSDP2.md)",
            "fsdp_version=2",
        )
    if s.config["train_mode"] != "full":
        return Refuse("SimpleTuner enables FSDP2 only for model_type=full", NOT_FSDP)
    if s.config["precision"] in ("bf16_pure", "bf16_autocast"):
        return Refuse(
            "under FSDP2 accelerate upcasts SimpleTuner's bf16 trained weights to fp32 master "
            "weights (fsdp2_prepare_model): the run is precision=bf16, not bf16 weights",
            NOT_FSDP,
        )
    return say(
        fsdp_enable=True,
        fsdp_version=2,
        fsdp_reshard_after_forward=RESHARD_AFTER_FORWARD[value],
        fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        fsdp_transformer_layer_cls_to_wrap=block_classes(s.preset),
        fsdp_state_dict_type="SHARDED_STATE_DICT",
        fsdp_cpu_ram_efficient_loading=True,
    )


FSDP1_ONLY = Refuse(
    "Sana's train.use_fsdp runs accelerate's FSDP1 (set_fsdp_env in train_scripts/train.py sets "
    "no FSDP_VERSION), whose flat parameters lay memory out otherwise than the FSDP2 measured",
    NOT_FSDP,
)
NO_FSDP = "sd-scripts has no FSDP (it shards with DeepSpeed)"
ZERO_NOT_FSDP = "DeepSpeed shards with ZeRO, not FSDP"


class Fsdp(Knob):
    name = "fsdp"
    depends_on = (
        "base_precision",
        "ema",
        "fsdp_offload",
        "fsdp_version",
        "fused_backward",
        "optimizer",
        "precision",
        "swap_blocks",
        "train_mode",
        "validation",
        "world_size",
        "zero_stage",
    )
    default = "off"
    help = "PyTorch FSDP2 (fully_shard) across the run's GPUs: off | full_shard | shard_grad_op"
    values = {
        "off": "no FSDP",
        "full_shard": "FSDP2 fully_shard on each transformer block and the root, "
        "reshard_after_forward=True (weights gathered for forward, freed, gathered again for "
        "backward); mixed precision as the precision knob says (fp32 shards gathered in bf16)",
        "shard_grad_op": "FSDP2 fully_shard on each transformer block and the root, "
        "reshard_after_forward=False (gathered weights kept from forward to backward)",
    }
    reads = ("optimizer",)  # fully_shard's parameters replace the ones it was built over
    after = ("train_mode", "base_precision")  # it shards the weights as they are stored

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # Across GPUs resharding saves the gathered blocks at one more all-gather per block; with
        # one GPU FSDP shards nothing and only adds its buffers.
        if value == "full_shard" and "shard_grad_op" in searched:
            return "shard_grad_op"
        return None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        broken = fsdp_rule(context.knobs, context.backend)
        if broken or value == "off":
            return broken
        if not context.model.blocks:
            return f"fsdp={value} shards per transformer block, and {context.model.name} lists none"
        return None

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value == "off":
            return None
        # The model is built in host memory and each weight's shard placed on the GPU (accelerate's
        # cpu_ram_efficient_loading, meta-device init): no GPU holds the whole model. fully_shard
        # itself moves the weights it shards to its mesh's device.
        return run.host() if run.sharding_emulated else run.built_on_host()

    def apply(self, run: RunState, value: Any) -> None:
        if value == "off":
            return
        offload = run.knobs["fsdp_offload"] == "cpu"
        if run.knobs.get("fsdp_version", 2) == 1:
            # lazy: the knobs load without torch (docs/contributing.md)
            from autofit.emulations.fsdp1 import Fsdp1Emulation
            from autofit.emulations.fsdp1_real import shard_fsdp1_for_real

            if run.sharding_emulated:
                world = run.knobs["world_size"]
                Fsdp1Emulation(run, RESHARD_AFTER_FORWARD[value], world, offload)
            else:
                shard_fsdp1_for_real(run, RESHARD_AFTER_FORWARD[value])
            return
        if run.sharding_emulated:
            # lazy: the knobs load without torch (docs/contributing.md)
            from autofit.emulations.fsdp import FsdpEmulation

            FsdpEmulation(run, RESHARD_AFTER_FORWARD[value], run.knobs["world_size"], offload)
            return
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.emulations.fsdp_real import shard_for_real

        shard_for_real(run, RESHARD_AFTER_FORWARD[value])

    trainers = {
        "accelerate": checked(_accelerate),
        # The accelerate config the script is launched with carries it.
        "diffusers": checked(lambda v, s: Say()),
        "simpletuner": checked(_simpletuner),
        "sana": {"off": Say(), "full_shard": FSDP1_ONLY, "shard_grad_op": FSDP1_ONLY},
        "deepspeed": {
            "off": Say(),
            "full_shard": Refuse(ZERO_NOT_FSDP, "fsdp=off, with zero_stage=3"),
            "shard_grad_op": Refuse(ZERO_NOT_FSDP, "fsdp=off, with zero_stage=2"),
        },
        "kohya": {"off": Say(), "full_shard": Refuse(NO_FSDP), "shard_grad_op": Refuse(NO_FSDP)},
        # The accelerate config TRL's train.py is launched with carries it.
        "trl": checked(lambda v, s: Say()),
        "axolotl": checked(language_models.axolotl),
        "torchtune": checked_all(language_models.torchtune),
        "litgpt": checked(language_models.litgpt),
        # The accelerate config LLaMA-Factory is launched with carries it, where it runs as measured.
        "llamafactory": checked(language_models.llamafactory),
    }
