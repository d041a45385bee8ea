"""kbit_prep: what the Hugging Face stack does to a 4-bit base before it adds the adapters.

- `none`: the 4-bit base as the quantizing loader leaves it: its linear layers in NF4, everything
  else (token embeddings, output head, norms) in the run's 16-bit dtype.
- `peft`: PEFT's `prepare_model_for_kbit_training(model, use_gradient_checkpointing=...)` runs
  on the quantized model before the adapters are added, as TRL's SFTTrainer, axolotl and most
  QLoRA scripts on the Hugging Face Trainer call it. Its memory, for Llama 3 8B under bf16
  autocast:
  - Every 16-bit parameter that is not a packed 4-bit weight becomes fp32: the token embedding
    and the untied output head (128,256 x 4,096 = 525 M weights each) go from 2 to 4 bytes, 2.1
    GB more weights (norms add 0.5 MB). Each is cast where it lies, so for one parameter at a
    time its 16-bit and fp32 copies are both resident.
  - Under autocast the linear output head casts its fp32 weight to bf16 for every forward. The
    weight is frozen, so autocast does not cache the copy, and the matmul keeps it for the
    input's gradient: 1.05 GB more from the head's forward until its backward (one copy per
    chunk with loss=chunked). The logits stay bf16 under autocast; without autocast
    (bf16_pure) they come out of the fp32 head in fp32.
  - The embedding runs in fp32 (autocast does not cast it), so the residual stream of every
    block is fp32 instead of bf16: twice the bytes of each block's input that checkpointing
    keeps, and of the hidden states everywhere they are saved.
  - With gradient checkpointing it also makes the embedding's output require a gradient
    (`enable_input_require_grads`), so backward makes one more (batch, sequence, hidden)
    gradient at the bottom of the model.
  It never saves memory and is no faster: a trainer's setting, searched only for one.

Applied by calling peft's own function on the run's model (autofit/knobs/train_mode.py calls
`run.base_preparation` between quantization and the adapters), with two adaptations: the model
is marked `is_loaded_in_4bit`, as transformers' bitsandbytes loader marks it (peft's checkpointing
branch looks for the mark); and the gradient-checkpointing function peft installs (through
transformers' `gradient_checkpointing_enable`, with torch's default, reentrant checkpoint) is
replaced by the run's own, non-reentrant one, as the checkpointing knob installs it.
Followed: peft 0.21 (peft/utils/other.py, prepare_model_for_kbit_training) on transformers 5.

Known limitations:
- The checkpoint function is autofit's non-reentrant one (transformers 5's Trainer installs the
  same when it turns checkpointing on itself); a loop that keeps peft's reentrant one holds each
  recomputed block's activations until that block's backward ends.
- Measured only on a causal language model (peft's function works on transformers models) whose
  base one GPU holds whole: not with ZeRO (DeepSpeed casts the model to 16-bit at initialize,
  undoing the fp32 cast), FSDP (FSDP-QLoRA keeps the whole base in one storage dtype and does not
  call it) or block swap (autofit counts the cast of a swapped block's weights on the GPU).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.families import is_causal_lm
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject
from autofit.knobs.train_mode import FOUR_BIT_MODES

if TYPE_CHECKING:
    from autofit.models import ModelPreset
    from autofit.run_state import RunState

CALL = "peft.prepare_model_for_kbit_training"


def _own_code(value: Any, s: Subject) -> Say:
    if value == "none":
        return Say()
    checkpointing = bool(s.config["checkpointing"])
    return Say(
        note=f"kbit_prep=peft: call {CALL}(model, use_gradient_checkpointing={checkpointing}) on "
        "the 4-bit model before adding the adapters (TRL's SFTTrainer does): it casts the "
        "embeddings, output head and norms to fp32"
    )


NO_LANGUAGE_MODELS = Refuse(
    f"kbit_prep is {CALL} on a transformers language model, which this trainer does not train",
    "kbit_prep=none",
)


# axolotl 0.19 (loaders/model.py _configure_embedding_dtypes) calls prepare_model_for_kbit_training
# on a 4-bit base (not under ZeRO-3 or FSDP, where it skips it), then casts the norms, token embedding and output head back to
# the model's 16-bit dtype before the adapters come: the fp32 copies never stay.
AXOLOTL_CAST_BACK = (
    "axolotl casts the norms, token embedding and output head back to 16-bit after "
    "prepare_model_for_kbit_training (loaders/model.py _configure_embedding_dtypes)"
)


def _axolotl(value: Any, s: Subject) -> Say | Refuse:
    if value == "peft":
        return Refuse(f"{AXOLOTL_CAST_BACK}: the fp32 copies measured do not stay")
    prepared = s.config.get("zero_stage") != 3 and s.config.get("fsdp", "off") == "off"
    if s.config.get("checkpointing") and prepared:
        return Say(
            warning=f"{AXOLOTL_CAST_BACK}, so the weights are the measured ones; with "
            "checkpointing its enable_input_require_grads adds the embedding output's gradient "
            "(one batch x sequence x hidden tensor) to the measured step"
        )
    return Say()


class KbitPrep(Knob):
    name = "kbit_prep"
    depends_on = ("checkpointing", "fsdp", "swap_blocks", "train_mode", "zero_stage")
    decided_by_trainer = True
    default = "none"
    help = "a 4-bit base before its adapters: none | peft (prepare_model_for_kbit_training: fp32 embeddings, head, norms)"
    values = {
        "none": "the 4-bit base as loaded: its other weights (embeddings, output head, norms) in "
        "the run's 16-bit dtype",
        "peft": f"{CALL}(model, use_gradient_checkpointing=<checkpointing>) on the 4-bit model "
        "before the adapters: every weight that is not 4-bit cast to fp32",
    }
    writes = ("base_preparation",)

    def libraries(self, value: Any) -> tuple[str, ...]:
        return ("peft",) if value == "peft" else ()

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("train_mode", "full") in FOUR_BIT_MODES and is_causal_lm(preset.family)

    def needless_without_trainer(self, value: Any, searched: tuple[Any, ...]) -> str | None:
        if value == "peft" and "none" in searched:
            return (
                "kbit_prep=peft holds more than kbit_prep=none at the same speed: searched only "
                "for a trainer that runs it"
            )
        return None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "none":
            return None
        knobs, model = context.knobs, context.model
        mode = knobs.get("train_mode", "full")
        if mode not in FOUR_BIT_MODES:
            return f"kbit_prep={value} prepares a 4-bit base: train_mode={mode} has none; use train_mode=qlora or qdora"
        if not is_causal_lm(model.family):
            return f"kbit_prep={value} prepares a transformers language model; {model.name} is a {model.family} model (use kbit_prep=none)"
        if knobs.get("zero_stage"):
            return f"kbit_prep={value}: DeepSpeed ZeRO casts the whole model to 16-bit at initialize, undoing its fp32 cast; use zero_stage=0"
        if knobs.get("fsdp", "off") != "off":
            return f"kbit_prep={value}: FSDP-QLoRA keeps the whole base in one storage dtype and does not call {CALL}; use fsdp=off"
        if knobs.get("swap_blocks"):
            return f"kbit_prep={value} is measured on a base the GPU holds whole; use swap_blocks=0"
        return None

    def prepare(self, run: RunState, value: Any) -> None:
        if value == "peft":
            run.base_preparation = _prepare_with_peft

    trainers = {
        "accelerate": _own_code,
        "deepspeed": _own_code,
        "simpletuner": {"none": Say(), "peft": NO_LANGUAGE_MODELS},
        "kohya": {"none": Say(), "peft": NO_LANGUAGE_MODELS},
        "sana": {"none": Say(), "peft": NO_LANGUAGE_MODELS},
        "diffusers": {"none": Say(), "peft": NO_LANGUAGE_MODELS},
        "axolotl": _axolotl,
        "torchtune": {
            "none": Say(),
            "peft": Refuse(
                "torchtune builds its own models, with no prepare_model_for_kbit_training"
            ),
        },
        # LitGPT quantizes with Lightning's plugin, never through peft (train_mode refuses it)
        "litgpt": {
            "none": Say(),
            "peft": Refuse("LitGPT does not call prepare_model_for_kbit_training"),
        },
        # LLaMA-Factory 0.9.5 never calls it: its 4-bit base keeps the loader's 16-bit embeddings,
        # head and norms (upcast_layernorm, off by default, would cast the norms alone).
        "llamafactory": {
            "none": Say(),
            "peft": Refuse(
                "LLaMA-Factory does not call prepare_model_for_kbit_training (model/adapter.py); "
                "its upcast_layernorm casts the norms alone"
            ),
        },
        # TRL 1.16's SFTTrainer casts a 4-bit model's adapters to bf16 and prepares nothing else.
        "trl": {
            "none": Say(),
            "peft": Refuse("TRL's SFTTrainer does not call prepare_model_for_kbit_training"),
        },
    }


def _prepare_with_peft(run: RunState) -> None:
    """peft's preparation of the run's quantized model, before its adapters exist."""

    from peft import prepare_model_for_kbit_training

    model, checkpointing = run.model, bool(run.knobs["checkpointing"])
    # transformers' bitsandbytes loader (quantizer_bnb_4bit.py) marks the model it quantized;
    # peft turns on checkpointing and input gradients only for a model so marked.
    model.is_loaded_in_4bit = True
    with warnings.catch_warnings():  # transformers 5 calls gradient_checkpointing_enable deprecated
        warnings.simplefilter("ignore", FutureWarning)
        prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    if checkpointing:  # the run's checkpoint function, not the reentrant one peft installed
        run.workload.enable_checkpointing(model, run.checkpoint)
    run.tag(model.parameters(), "parameters")  # the fp32 copies
