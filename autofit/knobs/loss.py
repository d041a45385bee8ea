"""loss: how a causal language model's next-token loss meets its vocabulary.

- `full`: transformers' own loss (`model(input_ids, labels=...)`, transformers 5.23
  `ForCausalLMLoss`): the output projection makes the logits of every position, batch x sequence
  x vocabulary in the model's dtype, then upcasts all of them to fp32 for the cross-entropy.
  With Llama 3's 128,256-token vocabulary that fp32 copy is 0.5 MB per token: 2 GiB for one
  sequence of 4096.
- `chunked`: the output projection and the cross-entropy run over 8 chunks of the sequence, one
  after the other, so only one chunk's fp32 upcast exists at a time, and in backward only one
  chunk's fp32 gradients. torchtune's `CEWithChunkedOutputLoss` (num_output_chunks=8, with the
  model's output projection chunked by `set_num_output_chunks`,
  torchtune/modules/loss/ce_chunked_output_loss.py) and LitGPT's `lm_head_chunk_size` with
  `chunked_cross_entropy` (litgpt/model.py, litgpt/utils.py) do this. As there, each chunk's
  log-probabilities stay saved for backward: what chunking removes is the full fp32 copy of the
  logits (less one chunk) in forward and the full fp32 gradients in backward.

The workload computes it (autofit/workloads/llm.py: `loss_chunks`); this knob enters it around
every forward pass. Only causal language models have such a loss: for other families it is
invalid. Nothing of it reaches a trainer's config: an own-code target gets a note of what the
training loop must do.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext

if TYPE_CHECKING:
    from autofit.models import ModelPreset
    from autofit.run_state import RunState

CHUNKS = 8  # torchtune's num_output_chunks default


class Loss(Knob):
    name = "loss"
    default = "full"
    help = "causal LM loss: full (all logits upcast to fp32 at once) | chunked (8 chunks of the sequence)"
    values = {
        "full": "the model's own loss: the output projection over the whole sequence, all logits "
        "upcast to fp32, then cross-entropy (transformers' model(input_ids, labels=...))",
        "chunked": f"the output projection and the fp32 cross-entropy over {CHUNKS} chunks of the "
        "sequence, one chunk at a time (torchtune's CEWithChunkedOutputLoss, LitGPT's "
        "lm_head_chunk_size): the loss is the sum over chunks divided by the number of targets",
    }
    per_sample_memory = True  # the logits grow with every sequence in the batch
    pass_only = True  # how the forward computes the loss

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return preset.family == "llm"

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # Eight smaller output projections and losses instead of one: never faster.
        return "full" if value == "chunked" else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != "full" and context.model.family != "llm":
            return (
                f"loss={value} chunks a causal language model's output projection; "
                f"{context.model.name} is a {context.model.family} model (use loss=full)"
            )
        return None

    def forward_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value != "chunked":
            return None
        from autofit.workloads.llm import loss_chunks

        return loss_chunks(CHUNKS)
