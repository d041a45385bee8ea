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
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.optimizer import PAGED
from autofit.knobs.train_mode import FOUR_BIT_MODES
from autofit.workloads import workload_for

if TYPE_CHECKING:
    from autofit.models import ModelPreset
    from autofit.run_state import RunState

RESHARD_AFTER_FORWARD = {"full_shard": True, "shard_grad_op": False}
NOT_FSDP = "fsdp=off"
# Knobs FSDP is not modelled with, at the value that asks nothing of it.
NOT_WITH = (
    ("zero_stage", 0, "DeepSpeed ZeRO shards the same states: use one or the other"),
    ("swap_blocks", 0, "block swap is not modelled with it"),
    ("fused_backward", "off", "the step fused into backward is not modelled with it"),
    ("ema", "off", "an EMA copy of sharded weights is not modelled"),
    ("validation", "off", "validation with sharded weights is not modelled"),
    ("base_precision", "same", "an fp8 base is not modelled with it"),
)


def fsdp_rule(config: Mapping[str, Any], backend: str = "simulate") -> str | None:
    """Why FSDP's knobs cannot go together as set, or None."""
    value = config.get("fsdp", "off")
    if value == "off":
        if config.get("fsdp_offload", "none") != "none":
            return (
                "fsdp_offload=cpu is FSDP2's CPU offload: it needs fsdp=full_shard or shard_grad_op"
            )
        return None
    for knob, off, why in NOT_WITH:
        if config.get(knob, off) != off:
            return f"fsdp={value} with {knob}={config[knob]}: {why}"
    optimizer = config.get("optimizer", "")
    if config.get("fsdp_offload", "none") == "cpu" and optimizer in PAGED:
        unpaged = optimizer.removeprefix("paged_")
        return f"fsdp_offload=cpu steps on the host, where {optimizer} has no GPU pages to page: use {unpaged}"
    # The cpu and cuda backends run fully_shard itself in a one-process group (shard_for_real;
    # torch 2.13 runs it on the CPU over gloo), whose resized storages and DTensors the tracker
    # follows (autofit/simulator/tracker.py).
    if backend not in ("cpu", "cuda"):
        return None
    if backend == "cpu" and config.get("fsdp_offload", "none") == "cpu":
        return (
            f"fsdp={value} with fsdp_offload=cpu on the cpu backend: FSDP2's CPU offload pins "
            "host memory, which needs a GPU (use simulate, or cuda)"
        )
    if config.get("train_mode") in FOUR_BIT_MODES:
        return (
            f"fsdp={value} with train_mode={config['train_mode']} on the {backend} backend: its "
            "bitsandbytes layers keep 4-bit weights as uint8, which fully_shard cannot shard"
        )
    if config.get("optimizer") not in ("adamw", "sgd"):
        return (
            f"fsdp={value} on the {backend} backend runs fully_shard itself, whose DTensor "
            "parameters only torch's optimizers step here (optimizer adamw or sgd; or use simulate)"
        )
    return None


_BLOCK_CLASSES: dict[str, tuple[str, ...]] = {}  # preset fingerprint -> class names


def _block_classes(preset: ModelPreset) -> tuple[str, ...]:
    known = _BLOCK_CLASSES.get(preset.fingerprint())
    if known is not None:
        return known
    import torch

    with torch.device("meta"):  # no memory: only the classes are wanted
        model = workload_for(preset).build_model(torch.bfloat16)
    names: dict[str, None] = {}
    for path in preset.blocks:
        names.update(dict.fromkeys(type(block).__name__ for block in model.get_submodule(path)))
    _BLOCK_CLASSES[preset.fingerprint()] = tuple(names)
    return tuple(names)


def block_classes(preset: ModelPreset) -> str:
    """The class names of the preset's transformer blocks, comma-separated, as accelerate's
    `fsdp_transformer_layer_cls_to_wrap` takes them (Flux: its double and single blocks)."""
    return ",".join(_block_classes(preset))


# -- trainers ---------------------------------------------------------------------------------


def checked(words: Any) -> Any:
    """Trainer words that first check FSDP's rules (an export may read a hand-edited study)."""

    def express(value: Any, s: Subject) -> Say | Refuse:
        broken = fsdp_rule(s.config)
        if broken:
            return Refuse(broken, NOT_FSDP)
        return Say() if value == "off" else words(value, s)

    return express


def checked_all(words: Any) -> Any:
    """As `checked`, for a trainer whose words for fsdp=off say something too."""

    def express(value: Any, s: Subject) -> Say | Refuse:
        broken = fsdp_rule(s.config)
        return Refuse(broken, NOT_FSDP) if broken else words(value, s)

    return express


def _ram_efficient(s: Subject) -> bool:
    # accelerate loads a 4-bit base whole on every GPU before sharding it (fsdp2_prepare_model
    # skips cpu_ram_efficient_loading for Params4bit); any other model is built on the meta
    # device and its shards loaded from rank 0, as the probe builds it on the host.
    return s.config["train_mode"] not in FOUR_BIT_MODES


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
        "fsdp_cpu_ram_efficient_loading": _ram_efficient(s),
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
        "fsdp_cpu_ram_efficient_loading": _ram_efficient(s),
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
# axolotl 0.19 loads the model in its 16-bit dtype, keeps norms in fp32 where fp32_norms asks and
# shards through accelerate with policies of its own (loaders/model.py, monkeypatch/accelerate/
# fsdp2.py): autofit has not matched that layout to the FSDP2 one it measures.
AXOLOTL_FSDP = Refuse(
    "autofit has not matched axolotl's FSDP setup (a 16-bit load sharded by its own accelerate "
    "patches) to the FSDP2 layout it measures",
    "fsdp=off (DeepSpeed ZeRO through its deepspeed setting)",
)
# LLaMA-Factory 0.9.5 runs FSDP through an accelerate config of its own, on a model it loads in its
# checkpoint's dtype and whose trained weights it casts to fp32 (model/adapter.py): autofit has not
# matched that to the FSDP2 layout it measures.
LLAMAFACTORY_FSDP = Refuse(
    "autofit has not matched LLaMA-Factory's FSDP setup (accelerate's FSDP on a model loaded in "
    "its checkpoint's dtype, its trained weights cast to fp32) to the FSDP2 layout it measures",
    "fsdp=off (DeepSpeed ZeRO through its deepspeed setting)",
)
ZERO_NOT_FSDP = "DeepSpeed shards with ZeRO, not FSDP"


def _torchtune(value: Any, s: Subject) -> Say | Refuse:
    """torchtune 0.6.1's distributed recipes always shard with FSDP2 (training/_distributed.py
    shard_model): fully_shard on each layer, on the modules custom_sharded_layers names, then on
    the root, which FSDP2 never reshards after forward, all with fsdp_reshard_after_forward. An
    untied input embedding sharded on its own leaves the final norm and output head (and a tied
    embedding) to the root: the groups accelerate makes, which autofit measures. The model is
    built in its dtype, sharded and gathered as it is (no mixed-precision policy: precision's
    words keep it fp32 or bf16_pure)."""
    if value == "off":
        if s.world_size > 1:
            return Refuse(
                "torchtune's distributed recipes shard with FSDP2 always (no plain data parallel)",
                "fsdp=full_shard, shard_grad_op",
            )
        return Say()
    if s.world_size == 1:
        return Refuse(
            "torchtune shards across the processes of its distributed recipes; one GPU runs its "
            "single-device recipes, unsharded",
            NOT_FSDP,
        )
    hf_config = s.preset.architecture.get("config", {})  # the model's transformers config
    tied = bool(hf_config.get("tie_word_embeddings", False))
    return say(
        fsdp_reshard_after_forward=RESHARD_AFTER_FORWARD[value],
        custom_sharded_layers=[] if tied else ["tok_embeddings"],
    )


TORCHTUNE_FSDP1 = Refuse(
    "torchtune shards with FSDP2's fully_shard (training/_distributed.py shard_model)",
    "fsdp_version=2",
)


def _litgpt(value: Any, s: Subject) -> Say | Refuse:
    """litgpt 0.5.13 shards exactly when it runs on more than one device, with no setting of its
    own: finetune_full through Lightning's FSDPStrategy (FSDP1, FULL_SHARD, each Block a unit,
    cpu_offload=False, use_orig_params=True: finetune/full.py, lightning/fabric/strategies/
    fsdp.py), finetune_lora with fully_shard on each block and on the root (parallelize_fn)."""
    if s.world_size == 1:
        return Refuse(
            "LitGPT runs Lightning's single-device strategy on one GPU: it shards nothing"
        )
    if s.config["train_mode"] != "full":
        return Refuse(
            "LitGPT's finetune_lora shards each block and the root alone (parallelize_fn): the "
            "token embedding and output head stay in the root, where the measured FSDP2 gave "
            "them groups of their own"
        )
    if value == "shard_grad_op":
        return Refuse("Lightning's FSDPStrategy in LitGPT's finetune_full shards FULL_SHARD")
    return Say(
        warning="Lightning's FSDPStrategy runs FSDP1 with use_orig_params=True, whose "
        "per-parameter alignment padding autofit's FSDP1 layout leaves out"
    )


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
        "axolotl": {"off": Say(), "full_shard": AXOLOTL_FSDP, "shard_grad_op": AXOLOTL_FSDP},
        "torchtune": checked_all(_torchtune),
        "litgpt": checked(_litgpt),
        "llamafactory": {
            "off": Say(),
            "full_shard": LLAMAFACTORY_FSDP,
            "shard_grad_op": LLAMAFACTORY_FSDP,
        },
    }
