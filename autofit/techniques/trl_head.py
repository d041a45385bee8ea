"""TRL's SFT loss, run by TRL's own code: the fused LM head of trl 1.16's SFTTrainer.

TRL 1.16's `SFTTrainer` patches the causal LM with `add_fused_lm_head` (trl/trainer/utils.py,
outputs log_probs, entropy and is_top1) and computes its loss from
`model(**inputs, fused_lm_head=True)`: the backbone's hidden states but the last position, the
labels shifted by one, and `_ChunkedLogProbFunction` (trl/kernels/chunked_logprob.py), which
projects 4096 tokens at a time onto 32768 vocabulary entries at a time into one reused tile in
the compute dtype and folds each tile into per-token running statistics; it saves the hidden
states, the weight, the targets and two per-token vectors for backward, which recomputes each
tile, turns it into the logits' gradient in place and sums the hidden states' gradient (and, where
the head trains, the head's) in fp32 buffers. The loss is minus the log-probabilities' sum over
the target count, as `SFTTrainer.compute_loss` makes it. All of that runs here as TRL wrote it.

On a CUDA GPU with Triton the fold of a tile is a Triton kernel that writes the running statistics
in place and allocates nothing, and the fp32 gradient sums take `addmm(..., out_dtype=float32)`,
which allocates nothing either. Elsewhere (the CPU, fake tensors) TRL runs the same fold as torch
ops on the whole tile and the sums through fp32 copies of the tile and its operands. Both run here
as TRL's torch code with their storages counted nowhere (the tracker's `uncounted`), so that what
the tracker counts is what the GPU allocates: the values are TRL's, the memory the Triton
kernel's. The roofline prices those torch ops as kernels of their own (the Triton kernel reads a
tile once), so the step's time estimate leans slow.

Known limitations: without Triton TRL scores every position (its labels clamped), where on a GPU
with Triton it gathers the positions with a target (`hidden_states[mask]`, which fake tensors
cannot size): the same count when every position but the last has one, as in a probe's batches,
while the per-token outputs are made by `masked_fill` instead of `new_zeros` and `masked_scatter`
(one vector of a token count less). `use_liger_kernel`, label smoothing and a `compute_loss_func`
(which make TRL compute the full logits besides) are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import trl.kernels.chunked_logprob as kernels
from trl.trainer.utils import add_fused_lm_head

from autofit.simulator.tracker import uncounted

OUTPUTS = ("log_probs", "entropy", "is_top1")  # what SFTTrainer asks of the head (trl 1.16)
# TRL's torch code standing for what a CUDA GPU runs without allocating (module docstring).
STANDS_FOR_GPU_KERNELS = ("_forward_tile", "_backward_tile", "_addmm_fp32")


def _counted_as_on_the_gpu(function: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with uncounted():
            return function(*args, **kwargs)

    run.__wrapped__ = function  # type: ignore[attr-defined]
    return run


def _as_on_the_gpu() -> None:
    """TRL's fold and fp32 sums, once and for the process: allocating what its Triton kernel and
    CUDA's addmm do (backward runs them too, after the forward's context has closed). A run with
    no tracker entered runs them as TRL wrote them."""
    for name in STANDS_FOR_GPU_KERNELS:
        function = getattr(kernels, name)
        if not hasattr(function, "__wrapped__"):
            setattr(kernels, name, _counted_as_on_the_gpu(function))


@contextmanager
def _fused_head(lm: torch.nn.Module) -> Iterator[None]:
    """`lm` patched by TRL's add_fused_lm_head for one forward pass, then as it was. (TRL's head
    runs the backbone without a cache, where transformers looks for packed sequences: the
    workload's loss answers that check for every loss, autofit/workloads/llm.py.)"""
    own = lm.__dict__.get("forward")
    add_fused_lm_head(lm, outputs=OUTPUTS)
    try:
        yield
    finally:
        if own is None:
            del lm.forward
        else:
            lm.forward = own  # type: ignore[method-assign]


def trl_cross_entropy(model: Any, lm: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """SFTTrainer.compute_loss (trl 1.16) on `model`, whose causal LM is `lm`; the labels are
    the inputs, as in TRL's collator for unpadded text."""
    if not kernels._use_triton(input_ids.device):
        _as_on_the_gpu()  # a GPU with Triton runs TRL's kernel itself
    with _fused_head(lm):
        outputs = model(input_ids=input_ids, labels=input_ids, fused_lm_head=True)
    return -outputs.log_probs.sum() / outputs.label_mask.sum().clamp(min=1)
