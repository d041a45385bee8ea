"""The optimizers the `optimizer` knob names, built for a training run.

Each entry builds the optimizer a trainer would use under that name. On fake tensors
(`run.fake`) the bitsandbytes optimizers are replaced by a stand-in with the same memory layout
(autofit/simulator/bnb_layout.py); everything else runs as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from autofit.training import TrainingRun

LEARNING_RATE = 1e-4


def _adamw(params: list[Any], run: TrainingRun) -> Any:
    import torch

    # Fused: one kernel for all parameters and no temporaries, on CUDA and on the CPU.
    return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.01, fused=True)


def _sgd(params: list[Any], run: TrainingRun) -> Any:
    import torch

    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9, foreach=True)


def _adafactor(params: list[Any], run: TrainingRun) -> Any:
    from transformers.optimization import Adafactor

    # The settings kohya's and SimpleTuner's guides give for fine-tuning with Adafactor.
    return Adafactor(
        params, lr=LEARNING_RATE, relative_step=False, scale_parameter=False, warmup_init=False
    )


def _came(params: list[Any], run: TrainingRun) -> Any:
    from came_pytorch import CAME

    return CAME(params, lr=LEARNING_RATE, weight_decay=0.01)


def _lion(params: list[Any], run: TrainingRun) -> Any:
    from lion_pytorch import Lion

    return Lion(params, lr=LEARNING_RATE, weight_decay=0.01)


def _adamw_bf16(params: list[Any], run: TrainingRun) -> Any:
    from autofit.optimizers.adamw_bf16 import AdamWBF16

    return AdamWBF16(params, lr=LEARNING_RATE)


def _bnb(name: str, states: int, paged: bool) -> Callable[[list[Any], TrainingRun], Any]:
    def build(params: list[Any], run: TrainingRun) -> Any:
        if run.fake:
            from autofit.simulator.bnb_layout import Blockwise8bitLayout

            return Blockwise8bitLayout(
                params, states=states, lr=LEARNING_RATE, paged=paged, host=run.host
            )
        import bitsandbytes as bnb

        return getattr(bnb.optim, name)(params, lr=LEARNING_RATE)

    return build


BUILDERS: dict[str, Callable[[list[Any], TrainingRun], Any]] = {
    "adamw": _adamw,
    "adamw8bit": _bnb("AdamW8bit", states=2, paged=False),
    "paged_adamw8bit": _bnb("PagedAdamW8bit", states=2, paged=True),
    "adafactor": _adafactor,
    "came": _came,
    "lion": _lion,
    "lion8bit": _bnb("Lion8bit", states=1, paged=False),
    "adamw_bf16": _adamw_bf16,
    "sgd": _sgd,
}


def build_optimizer(name: str, params: list[torch.nn.Parameter], run: TrainingRun) -> Any:
    return BUILDERS[name](params, run)
