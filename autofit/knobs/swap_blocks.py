"""swap_blocks: transformer blocks kept in host memory and exchanged in, as sd-scripts'
`blocks_to_swap` does (library/custom_offloading_utils.py).

The count is sd-scripts': of one block list the last N blocks; of Flux's two lists, N//2 double
blocks and 2*(N - N//2) single ones (the preset's `blocks_per_swap`). Of each list the first
blocks start on the GPU and never more of them than that are there at once: a block that must
run takes the slot of the block used longest ago, whose weights go to the host as the needed
ones come in (autofit/techniques/streaming.py BlockRing), in forward and again, in reverse, in
backward. Under LoRA only the frozen base's weights move (the adapters stay, as sd-scripts' LoRA
modules live outside the blocks). In a full fine-tune the swapped blocks' gradients go to the
host as they are made and their update runs there with its state; with the optimizer step fused
into backward (fused_backward) the update runs on the GPU while the block is there instead, as
sd-scripts' fused pass does, and no gradient leaves the GPU.

Each exchange is priced on the host link both ways, overlapped with the compute between the
moment the evicted block is done and the moment the incoming one is needed, one exchange at a
time: the roofline adds the time the GPU waits (autofit/simulator/roofline.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.families import (
    REGISTRY,
    kohya_max_blocks_to_swap,
    musubi,
    onetrainer_part,
    simpletuner,
)
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.train_mode import FOUR_BIT_MODES

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
    if s.config["train_mode"] == "full" and s.config["fused_backward"] == "off":
        return Refuse(
            "sd-scripts keeps a swapped block's gradients on the GPU until the optimizer step "
            "(autofit measured them moved to the host and updated there); with the step fused "
            "into backward each is freed as it is made",
            "swap_blocks=0, or swap_blocks with fused_backward=parameter or block",
        )
    return say(blocks_to_swap=value)


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    if not value:
        return Say()
    model = simpletuner(s.family)
    if model is None or not model.block_swap:
        swapping = [name for name in REGISTRY if (m := simpletuner(name)) and m.block_swap]
        return Refuse(
            f"SimpleTuner's block swap (musubi_blocks_to_swap) exists for "
            f"{', '.join(swapping)}, not {s.family}",
            NONE_OFFERED,
        )
    if len(s.preset.blocks) > 1:
        return Refuse(
            f"SimpleTuner's musubi_blocks_to_swap counts {s.model}'s blocks from the end of its "
            "block lists taken together, and streams them without prefetch: other blocks, at "
            "another speed, than sd-scripts' count autofit measured",
            NONE_OFFERED,
        )
    return say(musubi_blocks_to_swap=value)


def _musubi(value: Any, s: Subject) -> Say | Refuse:
    """musubi-tuner's --blocks_to_swap keeps the first blocks on the GPU and swaps the last ones,
    as sd-scripts' does (modules/custom_offloading_utils.py), within its limit per family."""
    if not value:
        return Say()
    scripts = musubi(s.family)
    if scripts is None or scripts.max_blocks_to_swap is None:
        return Refuse(f"musubi-tuner has no block swap for {s.family}", NONE_OFFERED)
    most = scripts.max_blocks_to_swap(s.preset.architecture)
    if value > most:
        return Refuse(
            f"musubi-tuner swaps at most {most} blocks of {s.model}", f"swap_blocks=0..{most}"
        )
    return Say(settings={"--blocks_to_swap": value}, warning=scripts.swap_differs)


def _loaded_by_another(run: RunState) -> bool:
    """Whether another knob builds the model on the host and loads it onto the GPU itself (a
    4-bit or fp8 base), leaving the swapped blocks on the host."""
    return run.knobs["train_mode"] in FOUR_BIT_MODES or run.knobs["base_precision"] != "same"


def _none(why: str) -> Any:
    return lambda value, s: Say() if not value else Refuse(why, NONE_OFFERED)


class SwapBlocks(Knob):
    name = "swap_blocks"
    depends_on = ("base_precision", "fused_backward", "train_mode")
    default = 0
    help = "transformer blocks kept in host memory and streamed in (kohya's blocks_to_swap)"
    kind = int
    minimum = 0
    writes = ("host_parameters", "host_gradients")
    # It moves the base's weights as train_mode and base_precision left them.
    after = ("train_mode", "base_precision")

    def means(self, value: Any, subject: Subject) -> str:
        if not value:
            return "no block swap"
        kept = " and ".join(
            f"the last {n} of {path}"
            for path, n in zip(
                subject.preset.blocks, subject.preset.swapped_per_list(value), strict=True
            )
            if n
        )
        return (
            f"keep {kept} in host memory, never more of each list on the GPU than the rest, "
            "exchanging a block for the one used longest ago as sd-scripts' blocks_to_swap does"
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

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if not value or _loaded_by_another(run):
            return None
        return run.built_on_host()  # apply brings all but the swapped blocks over

    def apply(self, run: RunState, value: Any) -> None:
        if not value:
            return
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.run_state import Exchange, move_to_device
        from autofit.techniques.streaming import BlockRing

        if not _loaded_by_another(run):
            move_to_device(run, run.model, skip=set())

        full = run.knobs["train_mode"] == "full"
        fused = run.knobs["fused_backward"] != "off"

        def moved(block: Any) -> list[Any]:  # under LoRA the adapters stay on the GPU
            return [p for p in block.parameters() if full or not p.requires_grad]

        def record(ready_at: float, needed_at: float, link_bytes: int) -> None:
            run.traffic.exchanges.append(Exchange(ready_at, needed_at, link_bytes))

        on_host: list[Any] = []
        gradients: dict[Any, Any] = {}

        def weights(tensor: Any) -> Any:  # a block brought in is weights, whenever it comes
            run.tag([tensor], "parameters")
            return tensor

        def evict(tensor: Any) -> Any:
            # Pinned: sd-scripts moves a block's weights out with .to("cpu", non_blocking=True)
            # from the GPU (library/custom_offloading_utils.py), which pins the copy.
            with run.host(pinned=True):
                return run.to_host(tensor, counted=False)

        def to_host_gradient(param: Any) -> None:
            gradients[param] = run.to_host(param.grad)
            param.grad = None

        counts = run.preset.swapped_per_list(value)
        for path, swapped in zip(run.preset.blocks, counts, strict=True):
            blocks = list(run.model.get_submodule(path))
            if not swapped:
                continue
            if full and not fused:  # the blocks that start on the host are updated there
                for block in blocks[-swapped:]:
                    for param in block.parameters():
                        on_host.append(param)
                        param.register_post_accumulate_grad_hook(to_host_gradient)
            BlockRing(
                blocks,
                len(blocks) - swapped,
                moved,
                evict,
                lambda t: weights(run.to_device(t, counted=False)),
                lambda: run.traffic.clock(),
                record,
            )
        run.host_parameters, run.host_gradients = on_host, gradients

    trainers = {
        "simpletuner": _simpletuner,
        "kohya": _kohya,
        "sana": _none("Sana's train.py has no block swap"),
        "diffusers": _none("the diffusers example scripts have no block swap"),
        "musubi": _musubi,
        # OneTrainer's layer offloading (offload_fraction, modules/util/LayerOffloadConductor.py
        # at 23df3832) keeps a fraction of a part's block bytes in host memory, streamed through
        # static buffers of its own under reentrant checkpointing: not sd-scripts' swap of whole
        # blocks that autofit measures.
        "onetrainer": lambda v, s: (
            say(**{f"{onetrainer_part(s.family)}.offload_fraction": 0.0})
            if not v
            else Refuse(
                "OneTrainer's offload_fraction streams a fraction of the blocks' bytes through "
                "static buffers of its own, not sd-scripts' swap of whole blocks autofit measured",
                NONE_OFFERED,
            )
        ),
    }
