"""Causal language models (transformers): next-token cross-entropy on sequences of random token
ids. For this family the `resolution` knob is the sequence length in tokens, and throughput is
reported in tokens per second as well.

Mixture-of-experts models (Qwen3-MoE) run transformers' own experts code, `grouped_mm` (the
default experts implementation of transformers 5): the router's top-k picks are sorted by expert,
counted with `histc` into offsets, and each projection is one grouped GEMM over all
tokens x top_k rows. No shape depends on the routing, so the step runs on fake tensors, but
torch's meta kernel for `_grouped_mm` insists on bf16 (the CUDA fast path's rule; CUDA and the
CPU run other dtypes through a per-expert fallback) and torch's FLOP counter has no formula for
it. Under fake tensors autofit therefore computes each grouped GEMM as a batched GEMM in which
every expert takes an equal share of the rows (`equal_share_grouped_mm`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import transformers
import transformers.integrations.moe as transformers_moe
import transformers.masking_utils as masking_utils
from torch._subclasses.fake_tensor import FakeTensor
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from autofit.errors import ConfigError
from autofit.techniques.fused_linear_ce import IGNORE_INDEX, FusedLinearCrossEntropy
from autofit.workloads.base import Batch, CheckpointFn, Workload, replaced
from autofit.workloads.diffusion import token_ids

# What a config names its experts by, in the architectures transformers has (Mixtral, Qwen MoE,
# DeepSeek): a model from a config file with one of them is a mixture of experts.
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")


def causal_lm_classes(kind: str) -> tuple[Any, Any]:
    """The transformers config and causal-LM classes of a `model_type` (a preset's
    `architecture.kind`), as transformers' auto mappings name them: every causal LM the
    installed transformers has."""
    try:
        config_class = CONFIG_MAPPING[kind]
        return config_class, AutoModelForCausalLM._model_mapping[config_class]
    except (KeyError, ValueError):
        raise ConfigError(
            f"model_type {kind!r} is not a causal language model of the installed transformers "
            f"({transformers.__version__})"
        ) from None


def is_mixture_of_experts(config: dict[str, Any]) -> bool:
    return any(config.get(n) for n in EXPERT_COUNTS)


_library_grouped_mm = transformers_moe._grouped_mm


def equal_share_grouped_mm(
    rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """transformers' grouped GEMM (`rows` sorted by expert, `weight` (experts, in, out)), with
    every expert given an equal share of the rows whatever `offsets` say: tokens x top_k /
    experts each, as perfectly balanced routing would send them.

    What it allocates is what the grouped GEMM allocates for any routing: one (rows, out) output
    in forward, and in backward one (rows, in) input gradient and one (experts, in, out) weight
    gradient. Real routing is uneven, and that changes no tensor's size here: an expert that gets
    more tokens leaves fewer to the others, and the rows add up to tokens x top_k all the same.
    What unevenness changes is time (the most crowded expert's GEMM runs longest, and CUDA's
    fallback for dtypes other than bf16 loops over the experts) and, with expert parallelism,
    which GPU holds which rows, neither of which a one-GPU memory measurement sees. Rows that do
    not divide evenly are padded to the next multiple of the expert count (at most experts - 1
    rows more)."""
    rows = rows.to(weight.dtype)  # as the library's dispatcher does before its kernel
    experts, count = weight.shape[0], rows.shape[0]
    share = -(-count // experts)
    if share * experts != count:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, share * experts - count))
    # torch's grouped GEMM has no autocast rule (it runs in the weight's dtype): nor may this.
    with torch.autocast(rows.device.type, enabled=False):
        out = torch.bmm(rows.view(experts, share, -1), weight).view(share * experts, -1)
    return out if share * experts == count else out[:count]


def _grouped_mm(rows: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> Any:
    """The library's grouped GEMM for real tensors; the equal share for fake ones."""
    if isinstance(weight, FakeTensor):
        return equal_share_grouped_mm(rows, weight, offs)
    return _library_grouped_mm(rows, weight, offs)


# The loss the workload computes instead of the model's own over the full logits, None for that
# one; the loss knob sets it around each forward pass (loss_computed_by).
_LOSS: ContextVar[Callable[[Any, torch.Tensor], torch.Tensor] | None] = ContextVar(
    "loss", default=None
)


@contextmanager
def loss_computed_by(loss: Callable[[Any, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Inside, `CausalLMWorkload.loss` is `loss(model, input_ids)` (one of the functions below)."""
    token = _LOSS.set(loss)
    try:
        yield
    finally:
        _LOSS.reset(token)


def causal_lm(model: Any) -> Any:
    """The transformers *ForCausalLM inside what the forward pass calls: a DeepSpeed engine's
    module, PEFT's wrapper's base model (with its adapters in place), or the model itself."""
    model = getattr(model, "module", model)
    base = getattr(model, "get_base_model", None)
    return base() if base is not None else model


def chunked_cross_entropy(
    model: Any,
    input_ids: torch.Tensor,
    chunks: int,
    cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Next-token cross-entropy with the output projection run over `chunks` slices of the
    tokens and the fp32 upcast and cross-entropy over one chunk's logits at a time
    (autofit/knobs/loss.py says whose recipe this is). As torchtune's chunked output does
    (TransformerDecoder.chunked_output returns every chunk's logits in a list, which the recipe
    holds until the loss returns), every chunk's logits are made first and stay until the loss is
    done: one chunk's fp32 copy exists at a time. The targets are made as transformers' loss
    makes them (each position predicts the next token, the last predicts nothing) and the loss is
    their mean, as there. `cross_entropy` is each chunk's upcast and summed loss
    (`upcast_cross_entropy`, or it compiled, as torchtune's compile_loss compiles it).

    The slices are of the batch's tokens in order (batch x sequence flattened), which for one
    sequence is the sequence cut in `chunks`: a contiguous slice is what the output projection
    saves for backward, where a slice across the batch would be copied first."""
    lm = causal_lm(model)
    hidden = lm.model(input_ids=input_ids).last_hidden_state
    targets = torch.nn.functional.pad(input_ids, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    logits = [lm.lm_head(states) for states in hidden.flatten(0, 1).tensor_split(chunks)]
    total = None
    for logit_chunk, labels in zip(logits, targets.flatten().tensor_split(chunks), strict=True):
        part = (cross_entropy or upcast_cross_entropy)(logit_chunk, labels)
        total = part if total is None else total + part
    return total / (input_ids.shape[0] * (input_ids.shape[1] - 1))  # type: ignore[operator]


def upcast_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One chunk's summed loss over its logits upcast to fp32 (torchtune's
    `compute_cross_entropy`); the fp32 copy is freed on return (what backward needs, the
    log-probabilities, stays with the autograd graph)."""
    return torch.nn.functional.cross_entropy(
        logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum"
    )


def native_cross_entropy(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy as a training loop of its own computes it from the model's
    output, in the logits' own dtype: the logits of every position (batch x sequence x
    vocabulary, as the model makes them), shifted by one position, which copies them (a slice
    of all but the last position is not contiguous), then torch's cross-entropy with no fp32
    upcast; the logits are dropped when the loss returns. Under autocast torch's own rules make
    the log-probabilities fp32 all the same."""
    logits = model(input_ids=input_ids).logits
    shifted = logits[:, :-1, :].reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(shifted, input_ids[:, 1:].reshape(-1))


def litgpt_chunked_cross_entropy(model: Any, input_ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """Next-token cross-entropy as LitGPT fine-tunes (litgpt 0.5: `GPT.forward` with
    `lm_head_chunk_size`, `chunked_cross_entropy` with `chunk_size`, both `chunk`): the output
    projection over `chunk`-token slices of the sequence, every slice's logits kept (the model
    returns their list), then torch's cross-entropy on each slice in the logits' own dtype with
    no fp32 upcast, the per-token losses concatenated and summed over the targets. The model's
    forward is replaced so whatever wraps the causal LM (peft, FSDP's root unit) runs around it.

    LitGPT's loop keeps the list in a local (`logits = model(...)`) through backward and the
    optimizer step, until the next step's forward has made its own: the list is kept on the
    model the same way, replaced only once the next one exists."""
    lm = causal_lm(model)

    def chunked_forward(input_ids: torch.Tensor, **_: Any) -> list[torch.Tensor]:
        hidden = lm.model(input_ids=input_ids).last_hidden_state
        return [lm.lm_head(part) for part in hidden.split(chunk, dim=1)]

    with _forward_as(lm, chunked_forward):
        chunks = model(input_ids=input_ids)
    object.__setattr__(lm, "_litgpt_logits", chunks)  # the loop's `logits`, as said above
    targets = torch.nn.functional.pad(input_ids, (0, 1), value=IGNORE_INDEX)[..., 1:]
    losses = [
        torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
            ignore_index=IGNORE_INDEX, reduction="none",
        )
        for logits, labels in zip(chunks, targets.split(chunk, dim=1), strict=True)
    ]  # fmt: skip
    return torch.cat(losses).sum() / (targets != IGNORE_INDEX).sum()


def trl_fused_cross_entropy(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """TRL 1.16 SFTTrainer's loss through its own fused LM head (autofit/techniques/trl_head.py),
    imported only where it is asked for."""
    from autofit.techniques.trl_head import trl_cross_entropy  # lazy: trl is optional

    return trl_cross_entropy(model, causal_lm(model), input_ids)


def fused_linear_cross_entropy(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy as Liger-Kernel's transformers integration computes it
    (liger_kernel/transformers/model/loss_utils.py, `LigerForCausalLMLoss`, 0.8.5): the labels
    padded by one position (that padded copy stays referenced until the loss returns), the next
    tokens as targets, and the fused linear cross-entropy (autofit/techniques/fused_linear_ce.py)
    over the flattened hidden states and the output projection's weight.

    As Liger patches it in, the loss is the causal LM's own forward (`lce_forward`), so whatever
    wraps the model (peft, FSDP's root unit) runs around it; and it runs as the output
    projection's forward, as Liger runs it under FSDP (`_FSDPForwardRedirection`): the hooks that
    bring a sharded or swapped weight in around the module's forward and backward fire around it."""
    lm = causal_lm(model)
    head = lm.lm_head
    assert head.bias is None, "Liger's causal LM loss passes no bias"
    labels = torch.nn.functional.pad(input_ids, (0, 1), value=IGNORE_INDEX)
    targets = labels[..., 1:].contiguous().flatten()

    def loss(states: torch.Tensor) -> torch.Tensor:
        return FusedLinearCrossEntropy.apply(states, head.weight, targets)  # type: ignore[no-any-return]

    def lce_forward(input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        hidden = lm.model(input_ids=input_ids).last_hidden_state
        with _forward_as(head, loss):
            return head(hidden.flatten(0, 1))  # type: ignore[no-any-return]

    with _forward_as(lm, lce_forward):
        return model(input_ids=input_ids)  # type: ignore[no-any-return]


@contextmanager
def _forward_as(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """`module`'s forward replaced by `forward` inside (its hooks still fire around it)."""
    own = module.__dict__.get("forward")
    module.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own  # type: ignore[method-assign]


def _unpacked(position_ids: torch.Tensor) -> None:
    """transformers' packed-sequence check (masking_utils.find_packed_sequence_indices) as it
    answers a probe's batch, one whole sequence per row: no packed sequences. It runs where the
    model has no cache (under gradient checkpointing, in TRL's fused head) and reads the
    positions' values, which fake tensors lack: there it took the batch for packed and built
    a causal mask of batch x sequence x sequence the real step never holds (and SDPA read it in
    place of its causal kernel)."""
    return None


def one_sequence_per_row() -> AbstractContextManager[None]:
    """transformers' packed-sequence check answered for a probe's batch, on every backend."""
    return replaced(masking_utils, "find_packed_sequence_indices", _unpacked)


class CausalLMWorkload(Workload):
    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        kind = self.preset.architecture["kind"]
        config_class, model_class = causal_lm_classes(kind)
        config = config_class(**self.preset.architecture["config"])
        if getattr(model_class, "_supports_sdpa", False):
            # fused attention, as training scripts ask for; a model without it (Gemma 2's soft
            # capping) runs its own eager attention, as it does under any trainer
            config._attn_implementation = "sdpa"
        if is_mixture_of_experts(self.preset.architecture["config"]):
            # transformers' experts code looks its grouped GEMM up by this module-level name
            # (transformers/integrations/moe.py, 5.23); the stand-in changes only fake tensors.
            transformers_moe._grouped_mm = _grouped_mm
            config._experts_implementation = "grouped_mm"  # the library's default, said
        return model_class(config)

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Batch:
        vocab = self.preset.architecture["config"]["vocab_size"]
        return {"input_ids": token_ids(batch_size, resolution, vocab, device)}

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        loss = _LOSS.get()
        with one_sequence_per_row():
            if loss is not None:
                return loss(model, batch["input_ids"])
            # The labels are the inputs: the model shifts them and upcasts the logits for the
            # loss, as a fine-tuning run does.
            return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=checkpoint)  # type: ignore[operator]


WORKLOAD = CausalLMWorkload
