"""loss: how a causal language model's next-token loss meets its vocabulary.

- `full`: transformers' own loss (`model(input_ids, labels=...)`, transformers 5.23
  `ForCausalLMLoss`): the output projection makes the logits of every position, batch x sequence
  x vocabulary in the model's dtype, then upcasts all of them to fp32 for the cross-entropy.
  With Llama 3's 128,256-token vocabulary that fp32 copy is 0.5 MB per token: 2 GiB for one
  sequence of 4096.
- `chunked`: the output projection over 8 chunks of the sequence, every chunk's logits kept
  until the loss returns, and the fp32 upcast and cross-entropy over one chunk after the other,
  so only one chunk's fp32 upcast exists at a time, and in backward only one chunk's fp32
  gradients. torchtune's `CEWithChunkedOutputLoss` (num_output_chunks=8, with the model's output
  projection chunked by `set_num_output_chunks`, whose `chunked_output` returns the list of every
  chunk's logits; torchtune/modules/loss/ce_chunked_output_loss.py) does this (LitGPT chunks too,
  but never upcasts: `chunked_native`). As there, each chunk's log-probabilities stay saved for
  backward: what chunking removes is the full fp32 copy of the logits (less one chunk) in
  forward and the full fp32 gradients in backward. With `compile=regional`, each chunk's upcast
  and cross-entropy is compiled, as torchtune's compile_loss compiles `compute_cross_entropy`.
- `fused_linear`: Liger-Kernel's fused linear cross-entropy (liger-kernel 0.8.5,
  `LigerFusedLinearCrossEntropyFunction`), which transformers' Trainer (`use_liger_kernel`, so
  TRL), LLaMA-Factory (`enable_liger_kernel`) and axolotl (`liger_fused_linear_cross_entropy`)
  run when told to use Liger: the output projection and the cross-entropy run over chunks of the
  batch x sequence rows sized to keep a chunk's logits near rows x hidden elements (256 rows of
  Llama 3 8B's 4096 x 128,256), in the model's dtype with no fp32 copy, and the gradients of the
  hidden states and of the output projection's weight are made in forward, so no logits are kept
  for backward: forward holds those two gradients (the weight's in its dtype) and one chunk's
  logits instead. autofit/techniques/fused_linear_ce.py ports the library's memory behaviour to
  torch (Liger's cross-entropy is a Triton kernel, which neither the CPU nor fake tensors run)
  and lists what it leaves out. Apple's cut-cross-entropy (its forward keeps only each row's
  log-sum-exp and its backward makes the logits again block by block) and unsloth's fused loss
  lay their memory out otherwise: neither is modelled.
- `full_native`: the logits of the whole sequence in the dtype the model makes them, shifted by
  one position (a copy), and torch's cross-entropy on them with no fp32 upcast: what a training
  loop of its own does with `F.cross_entropy(model(x).logits[:, :-1], ...)` (universal-llm-trainer's
  `nn.CrossEntropyLoss` on the bf16 logits, for one). Under pure bf16 the logits, their shifted
  copy and the log-probabilities are three bf16 tensors where `full` holds one bf16 and two fp32.
  Under autocast torch upcasts the log-softmax itself, so the two differ by the copy only.
- `trl_fused`: TRL 1.16's SFTTrainer, which scores every token through its own fused LM head
  (`add_fused_lm_head`, trl/kernels/chunked_logprob.py) whatever its config says: 4096 tokens at a
  time projected onto 32768 vocabulary entries at a time into one reused tile, folded into
  per-token statistics, never the whole logits; backward recomputes each tile and sums the hidden
  states' gradient (and a trained head's) in fp32. TRL's own code runs it on every backend
  (autofit/techniques/trl_head.py says how its Triton kernel's memory is kept).
- `chunked_native`: LitGPT's (litgpt 0.5, `lm_head_chunk_size=128` and `chunked_cross_entropy`
  with `chunk_size=128`): the output projection over 128-token slices of the sequence, every
  slice's logits kept (the model returns their list), and the cross-entropy of each slice in the
  logits' dtype, no fp32 copy. Forward holds the logits and their log-probabilities in bf16;
  backward makes one slice's gradients at a time.

The workload computes them (autofit/workloads/llm.py, one function each); this
knob enters the one asked for around every forward pass. Only causal language models have such a
loss: for other families it is invalid. Nothing of it reaches a trainer's config: an own-code target gets a note of what the
training loop must do.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.families import is_causal_lm
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say

if TYPE_CHECKING:
    from autofit.models import ModelPreset
    from autofit.run_state import RunState

CHUNKS = 8  # torchtune's num_output_chunks default
LITGPT_CHUNK = 128  # litgpt 0.5: the fine-tuning scripts' lm_head_chunk_size and chunk_size


def _trl(value: Any, s: Subject) -> Say | Refuse:
    """TRL 1.16's SFTTrainer scores every token through its own fused LM head whatever its config
    says (trl/trainer/sft_trainer.py: liger's fused loss is refused, the others never asked for)."""
    if value == "trl_fused":
        return Say()
    return Refuse("TRL 1.16's SFTTrainer scores every token through its own fused LM head")


# axolotl 0.19's AxolotlTrainer takes the Trainer's loss (transformers' own) unless a plugin or
# patch replaces it (core/trainers/base.py compute_loss).
AXOLOTL_LIGER = "axolotl.integrations.liger.LigerPlugin"


def _axolotl(value: Any, s: Subject) -> Say | Refuse:
    if value == "full":
        return Say()
    if value == "fused_linear":
        return Say(
            settings={"plugins": [AXOLOTL_LIGER], "liger_fused_linear_cross_entropy": True},
            warning="axolotl 0.19 pins liger-kernel 0.8.1; autofit modelled 0.8.5's fused loss",
        )
    if value == "chunked":
        return Refuse(
            "axolotl's chunked_cross_entropy chunks the logits of one whole-sequence output "
            "projection (monkeypatch/loss/chunked.py), whose backward gathers every chunk's "
            "gradient into one full logits gradient; the measured run projected chunk by chunk"
        )
    return Refuse(
        "axolotl computes transformers' own loss, or Liger's fused loss through its plugin"
    )


# torchtune 0.6.1's loss modules (torchtune/modules/loss/): CEWithChunkedOutputLoss alone for a
# causal LM (LinearCrossEntropyLoss came with 0.7). A torch loss given whole logits, as its recipes
# hand one, takes them in the model's dtype with the labels shifted, not the logits: no copy.
TORCHTUNE_LOSSES = "torchtune 0.6.1's loss modules have CEWithChunkedOutputLoss only"


def _torchtune(value: Any, s: Subject) -> Say | Refuse:
    if value == "chunked":
        # num_output_chunks 8, its default (CHUNKS); the recipe chunks the model's output to it
        return say(**{"loss._component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"})
    if value == "full_native":
        return Refuse(
            "torchtune's recipes shift the labels, not the logits, so a torch loss on the whole "
            "logits holds one copy of them less than measured"
        )
    return Refuse(TORCHTUNE_LOSSES)


def _litgpt(value: Any, s: Subject) -> Say | Refuse:
    """litgpt 0.5.13's loops decide the loss: finetune_lora projects 128-token slices and takes
    each slice's cross-entropy (chunked_native); finetune_full projects the whole sequence and
    cuts the shifted logits into 128-token slices for the cross-entropy (utils.py
    chunked_cross_entropy), in the logits' dtype: full_native's logits, its cross-entropy's
    gradient made a slice at a time."""
    lora = s.config.get("train_mode", "full") != "full"
    if lora and value == "chunked_native":
        return Say()
    if not lora and value == "full_native":
        return Say(
            warning="LitGPT's finetune_full takes the cross-entropy of the shifted logits in "
            f"{LITGPT_CHUNK}-token slices (utils.py chunked_cross_entropy), which autofit "
            "measured over the whole sequence at once"
        )
    script, kept = ("finetune_lora", "chunked_native") if lora else ("finetune_full", "full_native")
    return Refuse(f"LitGPT's {script} computes its own loss ({kept})")


# LLaMA-Factory 0.9.5's sft trainer takes the Trainer's loss (transformers' own); its
# enable_liger_kernel calls liger's apply_liger_kernel_to_<model>() with its defaults
# (model/model_utils/liger_kernel.py), which swap in Liger's RoPE, RMSNorm and SwiGLU kernels
# besides the fused loss.
LLAMAFACTORY_LIGER = (
    "LLaMA-Factory's enable_liger_kernel also swaps in Liger's RoPE, RMSNorm and SwiGLU kernels "
    "(apply_liger_kernel_to_<model>'s defaults), which autofit did not measure: they keep fewer "
    "activations than transformers' layers; LLaMA-Factory pins no liger-kernel, autofit "
    "modelled 0.8.5's fused loss"
)


def _llamafactory(value: Any, s: Subject) -> Say | Refuse:
    if value == "full":
        return Say()
    if value == "fused_linear":
        return Say(settings={"enable_liger_kernel": True}, warning=LLAMAFACTORY_LIGER)
    return Refuse(
        "LLaMA-Factory computes transformers' own loss, or Liger's fused loss through "
        "enable_liger_kernel"
    )


class Loss(Knob):
    name = "loss"
    depends_on = ("compile", "train_mode")
    decided_by_trainer = True
    default = "full"
    help = (
        "causal LM loss: full (all logits upcast to fp32 at once) | chunked (8 chunks of the "
        "sequence) | fused_linear (Liger-Kernel's fused linear cross-entropy) | full_native (all "
        "logits in the model's dtype, no upcast) | chunked_native (LitGPT's 128-token chunks) | "
        "trl_fused (TRL's fused LM head)"
    )
    values = {
        "full": "the model's own loss: the output projection over the whole sequence, all logits "
        "upcast to fp32, then cross-entropy (transformers' model(input_ids, labels=...))",
        "chunked": f"the output projection over {CHUNKS} chunks of the sequence, every chunk's "
        "logits kept until the loss returns, and the fp32 cross-entropy one chunk at a time "
        "(torchtune's CEWithChunkedOutputLoss): the loss is the sum over chunks divided by the "
        "number of targets",
        "fused_linear": "Liger-Kernel's fused linear cross-entropy (liger-kernel 0.8.5, "
        "LigerFusedLinearCrossEntropyLoss; for transformers models "
        "apply_liger_kernel_to_<model>(fused_linear_cross_entropy=True), transformers' and TRL's "
        "use_liger_kernel=True, axolotl's liger_fused_linear_cross_entropy: true): the output "
        "projection and the cross-entropy over chunks of the tokens, with the gradients made in "
        "forward and no logits kept for backward",
        "full_native": "the whole sequence's logits in the model's dtype, shifted by one (a "
        "copy), then torch's cross-entropy with no fp32 upcast (a training loop of its own: "
        "F.cross_entropy(model(x).logits[:, :-1].reshape(-1, vocab), ...))",
        "chunked_native": f"LitGPT's loss (litgpt 0.5 lm_head_chunk_size={LITGPT_CHUNK} and "
        f"chunked_cross_entropy chunk_size={LITGPT_CHUNK}): the output projection over "
        f"{LITGPT_CHUNK}-token slices, every slice's logits kept, each slice's cross-entropy in "
        "the logits' dtype",
        "trl_fused": "TRL 1.16 SFTTrainer's fused LM head (trl.trainer.utils.add_fused_lm_head), "
        "run by TRL's own code: the output projection in 4096-token x 32768-entry tiles folded "
        "into per-token log-probabilities, never the whole logits, the gradients summed in fp32",
    }
    per_sample_memory = True  # the logits grow with every sequence in the batch
    reach = "pass"  # how the forward computes the loss

    trainers = {
        "trl": _trl,
        "axolotl": _axolotl,
        "torchtune": _torchtune,
        "litgpt": _litgpt,
        "llamafactory": _llamafactory,
    }

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return is_causal_lm(preset.family)

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # Smaller output projections and losses instead of one: never faster. The fused loss
        # holds less than the chunked one, in more and smaller chunks. The two native losses
        # are what a trainer's own loop does, not a choice a search makes to save memory.
        if value == "fused_linear":
            return "chunked" if "chunked" in searched else "full"
        return "full" if value == "chunked" else None

    def libraries(self, value: Any) -> tuple[str, ...]:
        return ("trl", "autofit.techniques.trl_head") if value == "trl_fused" else ()

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "trl_fused" and importlib.util.find_spec("trl") is None:
            return "loss=trl_fused runs TRL's own fused LM head: pip install 'trl>=1.16,<1.17'"
        if value != "full" and not is_causal_lm(context.model.family):
            return (
                f"loss={value} is a causal language model's loss over its output projection; "
                f"{context.model.name} is a {context.model.family} model (use loss=full)"
            )
        return None

    def forward_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value == "full":
            return None
        # torch only where a forward pass runs: the knobs load without it
        from autofit.workloads import llm

        cross_entropy = None
        if value == "chunked" and run.knobs.get("compile", "off") != "off":
            # lazy: the knobs load without torch (docs/contributing.md)
            from autofit.techniques.regional_compile import compiled

            # torchtune's compile_loss: each chunk's upcast and cross-entropy compiled
            cross_entropy = compiled(llm.upcast_cross_entropy)
        loss = {
            "chunked": functools.partial(
                llm.chunked_cross_entropy, chunks=CHUNKS, cross_entropy=cross_entropy
            ),
            "fused_linear": llm.fused_linear_cross_entropy,
            "full_native": llm.native_cross_entropy,
            "chunked_native": functools.partial(
                llm.litgpt_chunked_cross_entropy, chunk=LITGPT_CHUNK
            ),
            "trl_fused": llm.trl_fused_cross_entropy,
        }[value]
        return llm.loss_computed_by(loss)
