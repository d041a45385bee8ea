"""train_mode: which weights train.

- `full`: every weight of the model trains.
- `lora`: the model's weights are frozen in 16-bit (its half dtype under mixed precision) and
  LoRA adapters of rank `lora_rank` on the preset's target modules train, through peft; under
  mixed precision the adapters are fp32, as the diffusers scripts cast them.
- `qlora`: as `lora`, on a base whose linear layers are quantized to 4-bit NF4 with double
  quantization through bitsandbytes (a stand-in with the same layout on fake tensors).
- `dora`, `qdora`: as `lora` and `qlora`, with peft's weight-decomposed adapters (DoRA,
  `use_dora=True`; peft/tuners/lora/dora.py). Besides the adapters each adapted layer trains a
  magnitude vector (one value per output feature), and its forward rebuilds the whole weight:
  B@A through the adapters applied to an identity matrix (in_features squared), the 16-bit (or
  dequantized 4-bit) base weight plus the scaled product, and its row norms. Those are
  temporaries of the layer's forward (the norm is detached, so autograd keeps none of them), and
  gradient checkpointing recomputes them in backward. What it keeps for backward is per sample:
  the base layer's output and the adapter's output, each the size of the layer's output, which
  plain LoRA does not keep. peft runs DoRA on bitsandbytes' 4-bit layers (QDoRA, dequantizing
  the weight for every forward; peft/tuners/lora/bnb.py); it refuses it only on
  nn.MultiheadAttention and on parameters targeted directly, which autofit's targets never are.
- `freeze`: freeze tuning (LLaMA-Factory's `finetuning_type: freeze`): the last
  `trainable_layers` blocks train in full, the rest of the model (the earlier blocks, the
  embeddings, the output head) is frozen in its 16-bit dtype with no gradient or optimizer state.
  Under mixed precision the trained blocks are kept in fp32, as full fine-tuning keeps its
  weights (LLaMA-Factory's `cast_trainable_params_to_fp32`). No gradient flows into the frozen
  blocks before the first trained one, so autograd keeps none of their activations.
- `peft`: the adapters of any PEFT method, as the PEFT config file `peft_config` declares them,
  built by PEFT's own classes on the frozen 16-bit model (autofit/knobs/peft_config.py).
- `lycoris`: a LyCORIS network (LoKr, LoHa, LoCon, ...), as the SimpleTuner lycoris_config file
  `lycoris_config` declares it, built by the lycoris-lora library on the frozen 16-bit model
  (autofit/knobs/lycoris_config.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from autofit.families import diffusers, diffusers_script, kohya, musubi, onetrainer_part
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.lora_targets import ADAPTER_MODES, target_modules
from autofit.knobs.lycoris_config import LYCORIS_MODE, add_lycoris_network
from autofit.knobs.peft_config import PEFT_MODE, add_peft_adapters
from autofit.knobs.train_mode import language_models
from autofit.knobs.train_mode.shared import (
    DORA_MODES,
    FOUR_BIT_MODES,
    NO_LYCORIS_FILE,
    NO_PEFT_FILE,
)
from autofit.knobs.trainable_layers import last_blocks

if TYPE_CHECKING:
    from autofit.run_state import RunState


# -- trainers ---------------------------------------------------------------------------------

NO_DORA_KOHYA = Refuse(
    "sd-scripts' own LoRA networks have no DoRA (LyCORIS's dora_wd, which it can load, "
    "decomposes the weight its own way, not as peft's DoRA autofit measured)"
)
NO_FREEZE_KOHYA = Refuse(
    "sd-scripts trains every block of the model it fine-tunes (sd3_train.py's "
    "num_last_block_to_freeze freezes the last blocks, the opposite of training them)"
)


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    if value == "qlora":
        return Refuse(
            "sd-scripts quantizes a base model to fp8 at most (fp8_base), not to 4-bit NF4"
        )
    if value in DORA_MODES:
        return NO_DORA_KOHYA
    if value == "freeze":
        return NO_FREEZE_KOHYA
    if value == PEFT_MODE:
        return NO_PEFT_FILE("sd-scripts")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("sd-scripts")
    scripts = kohya(s.family)
    if value == "full" and scripts is not None and scripts.full is None:
        return Refuse(
            f"sd-scripts fine-tunes no {s.family} model in full (its full fine-tune loads "
            f"FLUX.1 only); it trains {s.family} as LoRA ({scripts.lora})"
        )
    if value == "full" or scripts is None:
        return Say()  # the full fine-tune script (the family's check refuses other families)
    # autofit trains the denoiser's adapters only
    return say(network_module=scripts.network, network_train_unet_only=True)


def _musubi(value: Any, s: Subject) -> Say | Refuse:
    """musubi-tuner's *_train_network.py scripts train its own LoRA network on a 16-bit or fp8
    base (base_precision's words)."""
    scripts = musubi(s.family)
    if value == "lora":
        return say(**{"--network_module": scripts.network}) if scripts else Say()
    why = {
        "full": "autofit exports musubi-tuner's LoRA scripts (*_train_network.py), not its "
        "full fine-tunes",
        "qlora": "musubi-tuner stores a base in fp8 at most (--fp8_base), not in 4-bit NF4",
        "dora": "musubi-tuner's networks (LoRA, LoHa, LoKr) have no DoRA",
        "qdora": "musubi-tuner's networks (LoRA, LoHa, LoKr) have no DoRA",
        "freeze": "musubi-tuner trains LoRA networks, not the last blocks of the model",
    }
    if value == PEFT_MODE:
        return NO_PEFT_FILE("musubi-tuner")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("musubi-tuner")
    return Refuse(why[value])


def _ai_toolkit(value: Any, s: Subject) -> Say | Refuse:
    """ai-toolkit trains a LoRA network when its job has a `network` section, and the whole
    model otherwise (jobs/process/BaseSDTrainProcess.py at 27a03a91); the base's precision under
    LoRA is base_precision's words."""
    if value == "lora":
        return say(**{"network.type": "lora"})
    if value == "full":
        return say(**{"train.train_unet": True, "train.train_text_encoder": False})
    why = {
        "qlora": "ai-toolkit quantizes a base with optimum-quanto or torchao, not to 4-bit NF4 "
        "by bitsandbytes",
        "dora": "autofit has not matched ai-toolkit's DoRA (its LoRA module's apply_dora)",
        "qdora": "ai-toolkit has no DoRA on a 4-bit NF4 base",
        "freeze": "ai-toolkit trains a network or the whole model, not the last blocks alone",
    }
    if value == PEFT_MODE:
        return NO_PEFT_FILE("ai-toolkit")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("ai-toolkit")
    return Refuse(why[value])


def _diffusers(value: Any, s: Subject) -> Say | Refuse:
    if value == PEFT_MODE:
        return NO_PEFT_FILE("the diffusers example scripts")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("the diffusers example scripts")
    if diffusers_script(s.family, value) is not None:
        return Say()  # which script runs is the layout's
    if value in DORA_MODES and diffusers_script(s.family, "lora") is not None:
        return Refuse(
            f"{diffusers_script(s.family, 'lora').file} has no --use_dora (of the diffusers "  # type: ignore[union-attr]
            "examples, train_dreambooth_lora_sdxl.py and the advanced scripts have it)"
        )
    scripts = diffusers(s.family)
    offered = ", ".join(scripts.scripts if scripts else ())
    return Refuse(f"the diffusers examples train {s.family} only as: {offered or 'nothing'}")


def _onetrainer(value: Any, s: Subject) -> Say | Refuse:
    """OneTrainer 23df3832 trains its own LoRA modules (modules/module/LoRAModule.py: the
    layer's output plus up(down(x)) scaled, as peft's) or the whole model (training_method); a
    QLoRA base is its NFLOAT_4 weights (LinearNf4: bitsandbytes NF4 in blocks of 64 with the
    statistics quantized again, over every nn.Linear, as autofit's). The 16-bit base's dtype is
    precision's words."""
    lora = {"training_method": "LORA", "peft_type": "LORA", "lora_decompose": False}
    if value == "lora":
        return say(**lora)
    if value == "qlora":
        return say(**lora, **{f"{onetrainer_part(s.family)}.weight_dtype": "NFLOAT_4"})
    if value == "full":
        return say(training_method="FINE_TUNE")
    if value == PEFT_MODE:
        return NO_PEFT_FILE("OneTrainer")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("OneTrainer")
    why = {
        "dora": "OneTrainer's DoRA (lora_decompose) is its own DoRAModule, which autofit has not "
        "matched against peft's DoRA it measured",
        "qdora": "OneTrainer's DoRA (lora_decompose) is its own DoRAModule, which autofit has not "
        "matched against peft's DoRA it measured",
        "freeze": "OneTrainer trains a LoRA or the whole model, not the last blocks alone",
    }
    return Refuse(why[value])


SANA_FULL_ONLY = Refuse(
    "Sana's train.py trains the whole model; for LoRA use target=diffusers "
    "(train_dreambooth_lora_sana.py, which Sana's own train_lora.sh runs)"
)
SANA_WHOLE_MODEL = Refuse(
    "Sana's train.py trains the whole model, with no adapters or frozen blocks"
)
SIMPLETUNER_LORA = {"model_type": "lora", "lora_type": "standard"}
# QLoRA: the base's linear layers in bitsandbytes NF4, the rest in bf16, as measured.
SIMPLETUNER_NF4 = {"base_model_precision": "nf4-bnb", "base_model_default_dtype": "bf16"}


class TrainMode(Knob):
    name = "train_mode"
    depends_on = (
        "fsdp",
        "lora_rank",
        "lora_targets",
        "lycoris_config",
        "peft_config",
        "swap_blocks",
        "trainable_layers",
        "zero_stage",
    )
    default = "full"
    help = (
        "which weights train: full | lora | qlora (4-bit base) | dora | qdora (DoRA, on a 16-bit "
        "or 4-bit base) | freeze (the last trainable_layers blocks) | peft (any PEFT method, "
        "from peft_config) | lycoris (a LyCORIS network, from lycoris_config)"
    )
    values = {
        "full": "every weight of the model trains",
        "lora": "LoRA adapters on the frozen 16-bit model (fp32 adapters under mixed precision)",
        "qlora": "LoRA adapters on a 4-bit NF4 base (bitsandbytes, double quantization)",
        "dora": "DoRA adapters (peft use_dora=True: LoRA and a trained magnitude per output "
        "feature) on the frozen 16-bit model",
        "qdora": "DoRA adapters (peft use_dora=True) on a 4-bit NF4 base (bitsandbytes, double "
        "quantization)",
        "freeze": "the last trainable_layers blocks train in full; the other blocks, the "
        "embeddings and the output head are frozen in 16-bit",
        "peft": "the adapters of any PEFT method, as the PEFT config file peft_config declares "
        "them (built by PEFT on the frozen 16-bit model)",
        "lycoris": "a LyCORIS network (LoKr, LoHa, LoCon, ...), as the SimpleTuner "
        "lycoris_config file lycoris_config declares it (built by lycoris-lora on the frozen "
        "16-bit model, in its dtype)",
    }
    # LoRA keeps each adapter's input, DoRA also the layer's outputs, freeze nothing of the
    # frozen blocks before the trained ones: the memory per sample differs between them.
    per_sample_memory = True
    reads = ("dtypes", "base_preparation")
    after = ("base_precision",)  # its adapters wrap the base's layers as that knob stores them

    def libraries(self, value: Any) -> tuple[str, ...]:
        # peft imports bitsandbytes where installed, whose lookup tables are module-level tensors;
        # a 4-bit base is bitsandbytes' layers (on a GPU; the simulator's layout otherwise)
        if value in ("full", "freeze"):
            return ()
        if value == LYCORIS_MODE:
            return ("lycoris",)
        return ("peft", "bitsandbytes") if value in ("qlora", "qdora") else ("peft",)

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # Freeze tuning trains part of what a full fine-tune trains, in less memory (and no
        # slower): worth searching only at batches the full fine-tune cannot fit.
        return "full" if value == "freeze" and "full" in searched else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        model = context.model
        if value in ADAPTER_MODES and not model.lora_targets:
            return f"train_mode={value} needs the modules LoRA adapts, which {model.name} does not list"
        if value != "freeze":
            return None
        if not model.blocks:
            return f"train_mode=freeze trains the model's last blocks, which {model.name} does not list"
        if context.knobs.get("swap_blocks"):
            return "train_mode=freeze trains the last blocks, which swap_blocks keeps in host memory; use swap_blocks=0"
        return None

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value not in FOUR_BIT_MODES:
            return None
        # The 16-bit base is built in host memory and each weight quantized on its way to the
        # GPU (apply), as a quantizing loader does: it never sits there whole.
        return run.built_on_host()

    def apply(self, run: RunState, value: Any) -> None:
        if value == "full":
            return
        run.model.requires_grad_(False)
        if value == "freeze":
            _train_last_blocks(run)
        elif value == PEFT_MODE:
            add_peft_adapters(run, run.knobs["peft_config"])
        elif value == LYCORIS_MODE:
            add_lycoris_network(run, run.knobs["lycoris_config"])
        else:
            _add_adapters(run, value)
        run.tag(run.trainable_parameters(), "parameters")

    trainers = {
        "simpletuner": {
            "full": say(model_type="full", base_model_precision="no_change"),
            # the base's precision under LoRA: base_precision's words
            "lora": Say(settings=SIMPLETUNER_LORA),
            "qlora": Say(settings={**SIMPLETUNER_LORA, **SIMPLETUNER_NF4}),
            # SimpleTuner builds its adapters with peft's LoraConfig(use_dora=...), refusing DoRA
            # only on a quanto base (helpers/configuration/cmd_args.py, bghira/SimpleTuner bc8e6ab)
            "dora": Say(settings={**SIMPLETUNER_LORA, "use_dora": True}),
            "qdora": Say(settings={**SIMPLETUNER_LORA, **SIMPLETUNER_NF4, "use_dora": True}),
            "freeze": Refuse(
                "SimpleTuner trains the whole model or adapters: it has no option to train only "
                "the last blocks (its layer_freeze_strategy offers none or bitfit)"
            ),
            "peft": NO_PEFT_FILE("SimpleTuner"),
            "lycoris": Say(settings={"model_type": "lora", "lora_type": "lycoris"}),
        },
        "kohya": _kohya,
        "sana": {
            "full": Say(),
            "lora": SANA_FULL_ONLY,
            "qlora": SANA_FULL_ONLY,
            "dora": SANA_WHOLE_MODEL,
            "qdora": SANA_WHOLE_MODEL,
            "freeze": SANA_WHOLE_MODEL,
            "peft": SANA_WHOLE_MODEL,
            "lycoris": SANA_WHOLE_MODEL,
        },
        "diffusers": _diffusers,
        "trl": language_models.trl,
        "musubi": _musubi,
        "axolotl": language_models.axolotl,
        "ai_toolkit": _ai_toolkit,
        "torchtune": language_models.torchtune,
        "litgpt": language_models.litgpt,
        "llamafactory": language_models.llamafactory,
        "onetrainer": _onetrainer,
    }


def _add_adapters(run: RunState, value: str) -> None:
    """peft's LoRA or DoRA adapters on the target modules, on a 16-bit or 4-bit base."""
    import torch
    from peft import LoraConfig, inject_adapter_in_model

    # lazy: the knobs load without torch (docs/contributing.md)
    from autofit.run_state import default_dtype, move_to_device, set_logical_numel

    model = run.model
    if value in FOUR_BIT_MODES:
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.techniques.quantization import quantize_linears, quantized_tensors

        compute = run.dtypes.autocast or run.dtypes.weights
        # Under an emulated ZeRO-3 or FSDP the base is quantized in host memory and the sharder
        # places each weight's shard on the GPU (its quantization state goes over whole);
        # otherwise each weight is quantized onto the GPU as it loads.
        sharded = run.partitions_weights()
        with run.host() if sharded else nullcontext():
            layers = quantize_linears(
                model,
                compute if compute != torch.float32 else torch.bfloat16,
                run.fake,
                run.host_device if sharded else run.device,
            )
        quantized = {id(t) for layer in layers for t in quantized_tensors(layer)}
        for layer in layers:  # param_count counts weights, not the bytes packing them
            set_logical_numel(layer.weight, layer.in_features * layer.out_features)
        if sharded:
            move_to_device(run, model, skip=set(), parameters=False)
        else:
            move_to_device(run, model, skip=quantized)
            for layer in layers:
                run.tag(quantized_tensors(layer), "parameters")
        if run.base_preparation is not None:  # kbit_prep's, on the quantized base
            run.base_preparation(run)
    rank = run.knobs["lora_rank"]
    targets = target_modules(run.knobs["lora_targets"], run.preset)
    config = LoraConfig(
        r=rank, lora_alpha=rank, target_modules=targets, use_dora=value in DORA_MODES
    )
    # Adapters are created in the base's dtype (peft would move them there anyway).
    with default_dtype(run.dtypes.weights), run.device:
        inject_adapter_in_model(config, model)
    for param in model.parameters():
        if param.requires_grad and param.dtype != run.dtypes.trained:
            param.data = param.data.to(run.dtypes.trained)  # diffusers' cast_training_params


def _train_last_blocks(run: RunState) -> None:
    """The last `trainable_layers` blocks train, in the trained dtype (fp32 master weights under
    mixed precision, cast from the 16-bit model as LLaMA-Factory casts them)."""
    for block in last_blocks(run.model, run.preset, run.knobs["trainable_layers"]):
        for param in block.parameters():
            param.requires_grad_(True)
            if param.dtype != run.dtypes.trained:
                param.data = param.data.to(run.dtypes.trained)
