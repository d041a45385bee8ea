"""Per-op selective activation checkpointing, as torchtitan runs it (`activation_checkpoint.mode =
"selective"`, `selective_ac_option = "op"`; torchtitan/models/llama3/parallelize_llama.py,
`_apply_ac_to_transformer_block`, unchanged from 2024-12 to 2025-08).

A checkpointed block keeps, besides its input, the outputs of the ops torchtitan names: every
other matmul (the first, third, ... of each pass through the block; the count restarts in
recompute), the attention kernel's output and statistics, a reduce-scatter's output, and the
max torchtitan keeps for float8 scaling; everything else is recomputed in backward. It is torch's
own selective checkpointing (`create_selective_checkpoint_contexts`) with that policy, so what
is kept is what torch keeps for it.

The attention ops are CUDA's flash and memory-efficient kernels; a probe on the CPU (and the
simulator, whose fake GPU runs the CPU's flash kernel, same outputs) runs CPU flash attention,
held to the same rule.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

aten = torch.ops.aten

# The outputs torchtitan's policy saves (its `_save_list`), with the CPU flash kernel the probe
# runs in CUDA's place.
SAVED_OUTPUTS = frozenset(
    {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        aten.max.default,
    }
)


def op_policy_contexts() -> tuple[Any, Any]:
    """The forward and recompute contexts of one checkpointed call (what `context_fn` returns):
    a fresh matmul count per call, kept apart for forward and recompute."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    matmuls: Counter[bool] = Counter()

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == aten.mm.default:
            matmuls[ctx.is_recompute] += 1
            if matmuls[ctx.is_recompute] % 2 == 0:  # every second matmul is recomputed
                return CheckpointPolicy.PREFER_RECOMPUTE
        if func in SAVED_OUTPUTS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
