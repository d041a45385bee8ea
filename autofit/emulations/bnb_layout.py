"""bitsandbytes' 8-bit optimizers, as their memory looks, for fake tensors.

Known limitations: paged states count as host memory throughout; the driver's migration of them
is not modelled, neither the step's `prefetch_tensor` (bitsandbytes 0.50), which brings each onto
the GPU while it is updated, nor their eviction under pressure. Only the defaults are laid out:
`min_8bit_size` 4096 and `max_unorm` 0 (a positive one adds a `unorm_vec` per parameter, not
allocated here). bitsandbytes' CPU kernels make 512-byte temporaries in the update that this
step does not (tests/contracts/test_fake_matches_real.py, LOOSER).

A bitsandbytes step reads values out of its tensors, which a fake tensor cannot answer, so the
`simulate` backend uses this stand-in. It allocates every state exactly as bitsandbytes'
`init_state` does (bitsandbytes 0.50): for a parameter of at least `min_8bit_size` elements, one
uint8 buffer per state like the parameter, one fp32 absmax per block of 256 elements per state,
and the optimizer-wide quantization maps (256 fp32 values for signed and for unsigned states);
smaller parameters get fp32 states. Paged optimizers put the states of parameters of 100,000
elements or more in CUDA unified memory, outside PyTorch's allocator, which the driver pages out
under pressure: those count as host memory. The step moves the bytes the fused CUDA kernel moves
(it reads the gradient and the states, writes the parameter and the states) and allocates nothing,
as that kernel does. tests/test_optimizers.py checks the layout against a real bitsandbytes step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

BLOCKSIZE = 256
MIN_8BIT_SIZE = 4096
PAGED_MIN_NUMEL = 100_000


class Blockwise8bitLayout(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        states: int,
        lr: float = 1e-4,
        paged: bool = False,
        host: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        super().__init__(params, {"lr": lr})
        self.states = states  # 2 for Adam-like, 1 for Lion
        self.paged = paged
        self.host = host
        self.qmaps: dict[str, torch.Tensor] = {}

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = 0
        names = ["state1", "state2"][: self.states]
        if p.numel() < MIN_8BIT_SIZE:
            for name in names:
                state[name] = torch.zeros_like(p, dtype=torch.float32)
            return
        if not self.qmaps:  # bitsandbytes builds both maps once per optimizer
            self.qmaps = {"dynamic": torch.zeros(256), "udynamic": torch.zeros(256)}
        blocks = -(-p.numel() // BLOCKSIZE)
        paged = self.paged and p.numel() >= PAGED_MIN_NUMEL
        maps = ["dynamic", "udynamic"]
        for index, name in enumerate(names, start=1):
            with self.host() if paged else nullcontext():
                state[name] = torch.zeros_like(p, dtype=torch.uint8)
            state[f"qmap{index}"] = self.qmaps[maps[index - 1]]
        for index in range(1, self.states + 1):
            state[f"absmax{index}"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(p, state)
                state["step"] += 1
                p.add_(p.grad, alpha=-group["lr"])
                for index in range(1, self.states + 1):
                    state[f"state{index}"].add_(0)
