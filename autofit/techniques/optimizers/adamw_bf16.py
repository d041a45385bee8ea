"""AdamW for bf16 weights: bf16 parameters and states, updates rounded stochastically.

With weights kept in bf16 (no fp32 master copy), a plain AdamW update smaller than half a bf16
step is rounded away and training stalls. Rounding the fp32 result to bf16 stochastically (up or
down with the probability of its distance) keeps the update right on average, as SimpleTuner's
`adamw_bf16` does. Each parameter's update is computed in fp32 temporaries one parameter at a
time, so the only state is the two bf16 moments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def stochastic_round_to_bf16(source: torch.Tensor, target: torch.Tensor) -> None:
    """Write fp32 `source` into bf16 `target`, rounding each value up or down at random."""
    bits = source.view(torch.int32)
    # bf16 keeps the top 16 bits of an fp32: add noise below them, then cut them off.
    bits.add_(torch.randint_like(bits, 0, 1 << 16))
    bits.bitwise_and_(-65536)
    target.copy_(bits.view(torch.float32))


class AdamWBF16(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.bfloat16:
                    raise ValueError("AdamWBF16 trains bf16 parameters only")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                step = state["step"]
                grad = p.grad.float()
                exp_avg = state["exp_avg"].float().lerp_(grad, 1 - beta1)
                exp_avg_sq = (
                    state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                )
                denom = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(group["eps"])
                update = p.float().mul_(1 - group["lr"] * group["weight_decay"])
                update.addcdiv_(exp_avg, denom, value=-group["lr"] / (1 - beta1**step))
                stochastic_round_to_bf16(update, p)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
