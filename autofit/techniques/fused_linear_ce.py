"""Liger-Kernel's fused linear cross-entropy, ported to torch for its memory: the output projection
and the cross-entropy run over chunks of the batch x sequence rows, the gradients with respect to
the hidden states and the output projection's weight are made in forward, and no logits are kept
for backward.

It follows liger-kernel 0.8.5: `LigerFusedLinearCrossEntropyFunction` and
`fused_linear_cross_entropy_forward` in liger_kernel/ops/fused_linear_cross_entropy.py, as the
library's transformers integration calls them (liger_kernel/transformers/model/loss_utils.py,
`LigerForCausalLMLoss`: reduction "mean", `accum_dtype` None, no bias, softcap, label smoothing
or z-loss). That is what `apply_liger_kernel_to_llama(fused_linear_cross_entropy=True)` runs, and
axolotl's `liger_fused_linear_cross_entropy`, TRL's and LLaMA-Factory's `use_liger_kernel`. What
the library's forward allocates on a CUDA GPU of compute capability 8 or more, this allocates:

- before the chunks: the hidden states' gradient (rows x hidden, in their dtype), the weight's
  gradient (vocabulary x hidden, in the weight's dtype; only when the weight is trained), the
  per-row losses (rows, fp32) and the mask of rows that have a target (rows, bool);
- the chunk rule: as many rows per chunk as keep a chunk's logits near rows x hidden elements,
  `next_power_of_2(ceil(rows / ceil(vocabulary / hidden)))`, at most all rows (`chunk_rows`);
- when the hidden states, the weight and the math share one dtype (no autocast, or autocast to
  that dtype), one chunk x vocabulary buffer in that dtype, which every chunk's logits are written
  into (`torch.mm(..., out=)`); otherwise each chunk's logits are a new product in autocast's
  dtype, freed before the next;
- the cross-entropy overwrites each chunk's logits with their gradient in place: no fp32 copy of
  the logits ever exists (Liger's Triton kernel holds a row in registers);
- each chunk's rows of the hidden states' gradient are written in place (through a temporary
  chunk x hidden product under autocast); the chunk's share of the weight's gradient is added in
  place (`addmm`), in fp32 through `out_dtype` for an fp32 weight under autocast, after a 16-bit
  copy of the chunk's hidden states; for an fp32 gradient of fp32 logits (no mixed precision) the
  library adds a vocabulary x hidden product made anew for every chunk, and so does this;
- forward saves the two gradients for backward, which scales them in place by the incoming
  gradient and returns them.

Known limitations:

- The cross-entropy's arithmetic runs as torch ops on the chunk in its own dtype, in place (the
  library computes each row in fp32 registers): the memory is the same, a bf16 loss can differ in
  its third digit, an fp32 one does not. Autocast is off for it, as it is for a Triton kernel.
- The number of rows with a target stays a tensor (the library reads it to the host with
  `.item()`, which fake tensors cannot); backward always scales the gradients (the library skips
  the scaling when the incoming gradient is exactly 1). Neither allocates more than 512 bytes.
- GPUs older than compute capability 8 (V100, T4) take the library's fallback for 16-bit
  gradients too, a vocabulary x hidden product per chunk; this follows the newer GPUs.
- On real CPU tensors an fp32 weight's gradient under autocast is summed through fp32 copies of
  the chunk (the CPU has no `addmm` with `out_dtype`); fake tensors and CUDA take the library's
  path, which allocates nothing.
- Only what the transformers integration uses: no bias, no class weights, no softcap, no label
  smoothing, no z-loss, reductions "mean" only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

IGNORE_INDEX = -100  # the label the cross-entropy skips (torch's, transformers' and Liger's)


def chunk_rows(rows: int, vocabulary: int, hidden: int) -> int:
    """Rows per chunk: the library's rule, which bounds a chunk's logits by about rows x hidden
    elements (`chunk_mem_const` 1, its default)."""
    factor = -(-vocabulary // hidden)
    share = -(-rows // factor)
    return min(1 << (share - 1).bit_length(), rows)


def _cross_entropy_in_place(
    logits: torch.Tensor, targets: torch.Tensor, count: torch.Tensor
) -> torch.Tensor:
    """Liger's `liger_cross_entropy_kernel` on one chunk, reduction "mean": each row's loss over
    `count` rows with a target, and the logits overwritten by the loss's gradient with respect to
    them (zero for a row without a target)."""
    with torch.autocast(logits.device.type, enabled=False):  # a Triton kernel has no autocast
        valid = targets != IGNORE_INDEX
        index = targets.clamp(min=0).unsqueeze(1)
        picked = logits.gather(1, index).float()
        top = logits.amax(1, keepdim=True)
        logits.sub_(top).exp_()
        total = logits.sum(1, keepdim=True, dtype=torch.float32)
        share = valid.float().unsqueeze(1) / count
        loss = (top.float() + total.log() - picked) * share
        logits.div_(total)  # the softmax
        logits.scatter_add_(1, index, torch.full_like(index, -1, dtype=logits.dtype))
        logits.mul_(share)
    return loss.squeeze(1)


def _add_fp32(accumulator: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> None:
    """accumulator += left @ right in fp32, of 16-bit factors: `addmm(..., out_dtype=fp32)` as the
    library calls it. The CPU has no such kernel (module docstring: Known limitations)."""
    if accumulator.device.type == "cpu" and not isinstance(accumulator, FakeTensor):
        accumulator.addmm_(left.float(), right.float())
    else:
        torch.addmm(accumulator, left, right, out_dtype=torch.float32, out=accumulator)


def _fused_forward(
    inputs: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`fused_linear_cross_entropy_forward`: the loss, and the gradients of the hidden states and
    of the weight, made chunk by chunk in the library's order."""
    rows, hidden = inputs.shape
    vocabulary = weight.shape[0]
    size = chunk_rows(rows, vocabulary, hidden)
    device = inputs.device.type
    inputs_need_grad = inputs.requires_grad
    grad_inputs = torch.zeros_like(inputs)
    grad_weight = torch.zeros_like(weight) if inputs_need_grad and weight.requires_grad else None
    losses = torch.zeros(rows, dtype=torch.float32, device=inputs.device)
    has_target = targets != IGNORE_INDEX
    count = has_target.sum()

    autocast = torch.is_autocast_enabled(device)
    same_dtype = inputs.dtype == weight.dtype and inputs.dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
    )
    write_out = same_dtype and (not autocast or torch.get_autocast_dtype(device) == inputs.dtype)
    storage = (
        torch.empty(size, vocabulary, dtype=inputs.dtype, device=inputs.device)
        if write_out
        else None
    )

    for start in range(0, rows, size):
        end = min(start + size, rows)
        chunk = inputs[start:end]
        if storage is not None:
            logits = storage[: end - start]
            torch.mm(chunk, weight.t(), out=logits)
        else:
            logits = chunk @ weight.t()
        losses[start:end] = _cross_entropy_in_place(logits, targets[start:end], count)
        gradient = logits  # overwritten in place: the logits' gradient now
        del logits
        if inputs_need_grad:
            if write_out and gradient.dtype == grad_inputs.dtype:
                torch.mm(gradient, weight, out=grad_inputs[start:end])
            else:
                grad_inputs[start:end] = gradient @ weight
        if grad_weight is not None:
            low = gradient.dtype in (torch.float16, torch.bfloat16)
            if grad_weight.dtype == torch.float32 and low:
                _add_fp32(grad_weight, gradient.t(), chunk.to(gradient.dtype))
            elif low and grad_weight.dtype == gradient.dtype:
                torch.addmm(grad_weight, gradient.t(), chunk.to(gradient.dtype), out=grad_weight)
            else:  # the library's fallback: a vocabulary x hidden product for every chunk
                grad_weight += torch.mm(gradient.t(), chunk).float()
        del gradient, chunk
    del storage
    loss = torch.sum(losses)
    return loss, grad_inputs if inputs_need_grad else None, grad_weight


class FusedLinearCrossEntropy(torch.autograd.Function):
    """`LigerFusedLinearCrossEntropyFunction` for (rows x hidden) hidden states, the output
    projection's (vocabulary x hidden) weight and (rows,) targets; the loss is their mean."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> Any:
        loss, grad_inputs, grad_weight = _fused_forward(inputs, weight, targets)
        ctx.save_for_backward(
            grad_inputs.detach() if grad_inputs is not None else None,
            grad_weight.detach() if grad_weight is not None else None,
        )
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        grad_inputs, grad_weight = ctx.saved_tensors
        for gradient in (grad_inputs, grad_weight):
            if gradient is not None:
                gradient.mul_(grad_output)
        return grad_inputs, grad_weight, None
