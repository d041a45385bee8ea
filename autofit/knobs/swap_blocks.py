"""swap_blocks: the last N transformer blocks live in host memory, as kohya's `blocks_to_swap`
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

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.trainers import SIMPLETUNER_BLOCK_SWAP_FAMILIES, kohya_max_blocks_to_swap

if TYPE_CHECKING:
    from autofit.run_state import RunState

NONE_OFFERED = "swap_blocks=0"


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    if not value:
        return Say()
    most = kohya_max_blocks_to_swap(s.family, s.preset.architecture)
    if most is None:
        return Refuse(f"sd-scripts' {s.family} scripts have no blocks_to_swap", NONE_OFFERED)
    if value > most:
        return Refuse(
            f"sd-scripts swaps at most {most} blocks of {s.model}", f"swap_blocks=0..{most}"
        )
    return say(blocks_to_swap=value)


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    if not value:
        return Say()
    if s.family not in SIMPLETUNER_BLOCK_SWAP_FAMILIES:
        return Refuse(
            f"SimpleTuner's block swap (musubi_blocks_to_swap) exists for "
            f"{', '.join(SIMPLETUNER_BLOCK_SWAP_FAMILIES)}, not {s.family}",
            NONE_OFFERED,
        )
    return say(musubi_blocks_to_swap=value)


def _none(why: str) -> Any:
    return lambda value, s: Say() if not value else Refuse(why, NONE_OFFERED)


class SwapBlocks(Knob):
    name = "swap_blocks"
    default = 0
    help = "transformer blocks kept in host memory and streamed in (kohya's blocks_to_swap)"
    kind = int
    minimum = 0
    writes = ("host_parameters", "host_gradients")
    after = ("train_mode",)  # it moves the weights that train off the GPU with their gradients

    def means(self, value: Any, subject: Subject) -> str:
        if not value:
            return "no block swap"
        return f"keep the last {value} transformer blocks in host memory and stream them in"

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        if not value:
            return None
        fewer = [v for v in searched if v < value]
        return max(fewer) if fewer else 0

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value and value > context.model.max_swap_blocks:
            return f"swap_blocks={value} is more than {context.model.name} allows (at most {context.model.max_swap_blocks})"
        return None

    def apply(self, run: RunState, value: Any) -> None:
        if not value:
            return
        from autofit.simulator.streaming import stream_parameters

        every = [block for path in run.preset.blocks for block in run.model.get_submodule(path)]
        blocks = every[-value:]
        resident: dict[Any, Any] = {}
        gradients: dict[Any, Any] = {}
        on_host: list[Any] = []

        def to_host_gradient(param: Any) -> None:
            gradients[param] = run.to_host(param.grad)
            param.grad = None

        for block in blocks:
            for param in block.parameters():
                resident[param] = run.to_host(param.data)
                param.data = resident[param]
                if param.requires_grad:
                    on_host.append(param)
                    param.register_post_accumulate_grad_hook(to_host_gradient)
        run.host_parameters, run.host_gradients = on_host, gradients
        stream_parameters(
            blocks, materialize=lambda p: run.to_device(resident[p]), release=lambda p: resident[p]
        )

    trainers = {
        "simpletuner": _simpletuner,
        "kohya": _kohya,
        "sana": _none("Sana's train.py has no block swap"),
        "diffusers": _none("the diffusers example scripts have no block swap"),
    }
