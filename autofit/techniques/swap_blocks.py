"""Block swap: the last N transformer blocks live in host memory, as kohya's `blocks_to_swap`
(the preset's `blocks` lists the block lists in order: Flux's double blocks, then its single ones).

Their weights are copied onto the GPU just before each block runs forward and again before its
backward, and dropped after; their gradients are moved to the host as they are made, and their
update runs on the host with its state there (the blocks are offloaded whole). So the GPU holds
the other blocks plus one block in transit, and every step moves each swapped block's weights
over the host link twice and its gradients once. The roofline prices those copies (overlapped
with compute, as kohya overlaps them) and the host update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class SwapBlocks(Technique):
    knob = Knob(
        "swap_blocks",
        0,
        "transformer blocks kept in host memory and streamed in (kohya's blocks_to_swap)",
        kind=int,
        minimum=0,
    )

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        if not value:
            return None
        fewer = [v for v in searched if v < value]
        return max(fewer) if fewer else 0

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value and value > context.model.max_swap_blocks:
            return f"swap_blocks={value} is more than {context.model.name} allows (at most {context.model.max_swap_blocks})"
        return None

    def after_build(self, run: TrainingRun, value: Any) -> None:
        if not value:
            return
        from autofit.simulator.streaming import stream_parameters

        every = [block for path in run.preset.blocks for block in run.model.get_submodule(path)]
        blocks = every[-value:]
        resident: dict[Any, Any] = {}

        def to_host_gradient(param: Any) -> None:
            run.host_gradients[param] = run.to_host(param.grad)
            param.grad = None

        for block in blocks:
            for param in block.parameters():
                resident[param] = run.to_host(param.data)
                param.data = resident[param]
                if param.requires_grad:
                    run.host_parameters.append(param)
                    param.register_post_accumulate_grad_hook(to_host_gradient)
        stream_parameters(
            blocks, materialize=lambda p: run.to_device(resident[p]), release=lambda p: resident[p]
        )
