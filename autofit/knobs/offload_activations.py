"""offload_activations: the tensors forward saves for backward copied to pinned host memory as
they are saved, and brought back as backward needs them.

- `off`: saved activations stay on the GPU until backward frees them.
- `cpu`: torchtune's activation offloading (torchtune/training/_activation_offloading.py,
  `OffloadActivations`; TRL's copy of it): a `saved_tensors_hooks` pair around forward. Each saved
  tensor of at least 1 KiB (`min_offload_size`) that is not a weight is copied to a pinned host
  buffer of its own on a side stream; the GPU copy is kept only until the copy is done (the
  last `max_fwd_stash_size`, 5, offloaded tensors stay alive on the GPU, torchtune's stash) and is
  freed once nothing else holds it; backward brings each back when its node runs. A tensor saved
  twice is copied once, and weights are never copied, their views included, as TRL's version
  does since huggingface/trl#4247 ("tensor dedup", "filters out model parameters"); torchtune's
  own class copies each save and tells weights by type (nn.Parameter), which a weight's
  transposed view, what a linear layer saves, is not.

With gradient checkpointing, what forward saves is each checkpointed block's inputs (the
non-reentrant checkpoint saves them as saved tensors, and the block's own activations are
recomputed): those are offloaded, and the recomputed ones stay on the GPU for the block's
backward. The copies cross the host link both ways, on their own stream, overlapped with compute
(the roofline prices them as host-link traffic). Any model family; with ZeRO-3 the gathered
weights are weights, not copied. Not with FSDP here (torchtune runs it under FSDP2, but the FSDP
emulation keeps saved-tensor hooks of its own, which these cannot wrap).
- `attention`: SimpleTuner's attention activation offload (`gradient_checkpointing_offload_attention`,
  helpers/training/offloaded_gradient_checkpointer.py `activation_offload_context` around each
  block's attention call, its `CPUOffloadHooks`): inside the attention modules the family names
  (`Family.attention_modules`), every saved tensor on the GPU that is not a leaf (a weight, or a
  tensor nothing trained depends on, stays) is copied to host memory as it is saved and brought
  back, a new GPU tensor, when backward needs it; no tensor is shared, a tensor saved twice is
  copied twice. Every block, checkpointed or not: inside a checkpointed block the attention's
  hooks are innermost, so its saved tensors go to the host rather than into the checkpoint, and
  its recomputation copies them out again. SimpleTuner's pinned buffers come from a pool of at
  most 12 shapes, pageable beyond; autofit counts every copy pinned (the host bytes are the
  same). Prefetch is off, its default.
"""

from __future__ import annotations

import weakref
from collections import deque
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.families import declaring, family, onetrainer_part
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say

if TYPE_CHECKING:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    from autofit.run_state import RunState

MIN_OFFLOAD_BYTES = 1024  # torchtune's min_offload_size: smaller tensors are not worth a copy
FORWARD_STASH = 5  # torchtune's max_fwd_stash_size: offloaded tensors kept alive while copying


class _Offloaded:
    """A saved tensor's pinned host copy (what autograd holds between pack and unpack), and a weak
    reference to the storage it was copied from."""

    __slots__ = ("host", "source", "__weakref__")

    def __init__(self, host: torch.Tensor, source: StorageWeakRef) -> None:
        self.host = host
        self.source = source


class ActivationOffload:
    """The pack and unpack hooks of one run, and what they keep between them."""

    def __init__(self, run: RunState) -> None:
        self.run = run
        # Saved tensors offloaded in this forward, by what they are (a tensor saved again shares
        # its copy); an entry dies with the last saved reference to its copy.
        self.copies: weakref.WeakValueDictionary[tuple[Any, ...], _Offloaded] = (
            weakref.WeakValueDictionary()
        )
        self.stash: deque[torch.Tensor] = deque(maxlen=FORWARD_STASH)

    def context(self) -> AbstractContextManager[Any]:
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> Any:
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef

        base = tensor if tensor._base is None else tensor._base
        if (
            isinstance(base, torch.nn.Parameter)
            or tensor.numel() * tensor.element_size() < MIN_OFFLOAD_BYTES
        ):
            return tensor
        key = (
            tensor.untyped_storage()._cdata, tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype,
        )  # fmt: skip
        offloaded = self.copies.get(key)
        # A storage's address is reused once it is freed, while autograd may still hold the copy
        # made of it: a copy stands for this tensor only if its source storage is still alive.
        if offloaded is None or offloaded.source.expired():
            with self.run.host(pinned=True):  # page-locked where there is a GPU to copy from
                pinned = self.run.device.type == "cuda"
                host = torch.empty_like(tensor, device=self.run.host_device, pin_memory=pinned)
                host.copy_(tensor.detach(), non_blocking=pinned)
            self.run.traffic.link_bytes += tensor.numel() * tensor.element_size()
            source = StorageWeakRef(tensor.untyped_storage())
            offloaded = self.copies[key] = _Offloaded(host, source)
            self.stash.append(tensor)  # alive until the side stream's copy is surely done
        return offloaded

    def unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Offloaded):
            return saved
        self.stash.clear()  # backward has begun: every forward copy is done
        return self.run.to_device(saved.host)


class AttentionOffload:
    """SimpleTuner's CPUOffloadHooks, entered around each call of a block's attention module."""

    def __init__(self, run: RunState) -> None:
        self.run = run
        self.open: list[AbstractContextManager[Any]] = []

    def pack(self, tensor: torch.Tensor) -> Any:
        import torch

        if tensor.device != self.run.device or tensor.is_leaf:
            return tensor, False
        with self.run.host(pinned=True):
            pinned = self.run.device.type == "cuda"
            host = torch.empty_like(tensor, device=self.run.host_device, pin_memory=pinned)
            host.copy_(tensor.detach(), non_blocking=pinned)
        self.run.traffic.link_bytes += tensor.numel() * tensor.element_size()
        return host, True

    def unpack(self, saved: Any) -> torch.Tensor:
        tensor, offloaded = saved
        return self.run.to_device(tensor) if offloaded else tensor

    def enter(self, module: Any, args: Any) -> None:
        import torch

        context = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        context.__enter__()
        self.open.append(context)

    def leave(self, module: Any, args: Any, output: Any) -> None:
        self.open.pop().__exit__(None, None, None)

    def wrap(self, blocks: list[Any], modules: tuple[str, ...]) -> None:
        for block in blocks:
            for name in modules:
                attention = getattr(block, name, None)
                if attention is not None:
                    attention.register_forward_pre_hook(self.enter)
                    attention.register_forward_hook(self.leave, always_call=True)


def _axolotl(value: Any, s: Subject) -> Say | Refuse:
    """axolotl 0.19's activation_offloading: TRL's OffloadActivations around each step
    (core/trainers/mixins/activation_checkpointing.py). On adapters it offloads what forward saves
    (with the model's own checkpointing where gradient_checkpointing asks); on a full fine-tune it
    always wraps every layer in a non-reentrant checkpoint too (loaders/model.py
    _apply_activation_checkpointing)."""
    if value == "off":
        return Say()
    if value == "attention":
        return Refuse(
            "axolotl's activation_offloading copies every saved activation, not the attention's"
        )
    if s.config.get("train_mode", "full") == "full" and not s.config.get("checkpointing"):
        return Refuse(
            "axolotl checkpoints every layer of a full fine-tune whose activations it offloads",
            "offload_activations=cpu with checkpointing=true",
        )
    return say(activation_offloading=True)


def _torchtune(value: Any, s: Subject) -> Say | Refuse:
    """torchtune 0.6.1's enable_activation_offloading (training/_activation_offloading.py, what
    `cpu` follows); its recipes raise unless enable_activation_checkpointing is on too, which
    every-N-th-layer checkpointing turns off."""
    if value == "off":
        return say(enable_activation_offloading=False)
    if value == "attention":
        return Refuse(
            "torchtune's OffloadActivations copies every saved activation, not the attention's"
        )
    if not s.config.get("checkpointing") or s.config.get("checkpoint_interval", 1) != 1:
        return Refuse(
            "torchtune 0.6.1's recipes offload activations only with enable_activation_checkpointing "
            "(every layer checkpointed)",
            "offload_activations=cpu with checkpointing=true and checkpoint_interval=1",
        )
    return say(enable_activation_offloading=True)


class OffloadActivations(Knob):
    name = "offload_activations"
    depends_on = ("checkpoint_interval", "checkpointing", "fsdp", "train_mode")
    default = "off"
    help = (
        "saved activations copied to pinned host memory in forward, back in backward: off | cpu "
        "(every one, torchtune's) | attention (the attention's, SimpleTuner's)"
    )
    values = {
        "off": "saved activations stay on the GPU",
        "cpu": "every saved activation of 1 KiB or more copied to pinned host memory as forward "
        "saves it and brought back in backward (torchtune's OffloadActivations, TRL's "
        "activation_offloading)",
        "attention": "what each block's attention saves copied to host memory and brought back "
        "in backward (SimpleTuner's gradient_checkpointing_offload_attention)",
    }
    reach = "pass"  # what forward saves, and where

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "off" if value in ("cpu", "attention") else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        fsdp = context.knobs.get("fsdp", "off")
        if value != "off" and fsdp != "off":
            # The FSDP emulation (autofit/emulations/fsdp.py) saves gathered weights by reference
            # through saved-tensor hooks of its own, inside which these would not run.
            return f"offload_activations={value} with fsdp={fsdp} is not modelled"
        if value == "attention" and not family(context.model.family).attention_modules:
            return (
                f"offload_activations=attention: SimpleTuner offloads attention activations of "
                f"{', '.join(declaring('attention_modules'))}, not of the "
                f"{context.model.family} family"
            )
        return None

    def apply(self, run: RunState, value: Any) -> None:
        if value == "attention":
            offload = AttentionOffload(run)
            modules = family(run.preset.family).attention_modules
            for path in run.preset.blocks:
                offload.wrap(list(run.model.get_submodule(path)), modules)

    def forward_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value != "cpu":
            return None
        # One per forward: autograd keeps its hooks and copies until backward is done with them.
        return ActivationOffload(run).context()

    trainers = {
        "kohya": {
            "off": Say(),
            "cpu": Refuse(
                "sd-scripts' --cpu_offload_checkpointing moves only the checkpointed blocks' "
                "inputs (Flux, SD3), in pageable memory with blocking copies, not every saved "
                "activation as measured"
            ),
            "attention": Refuse("sd-scripts has no attention activation offload"),
        },
        "simpletuner": {
            "off": Say(),
            "cpu": Refuse(
                "SimpleTuner has no setting that offloads every saved activation (its unsloth "
                "checkpointing backend offloads checkpointed inputs its own way)"
            ),
            "attention": say(gradient_checkpointing_offload_attention=True),
        },
        "sana": {
            "off": Say(),
            "cpu": Refuse("Sana's train.py has no activation offloading"),
            "attention": Refuse("Sana's train.py has no activation offloading"),
        },
        "diffusers": {
            "off": Say(),
            "cpu": Refuse("the diffusers example scripts have no activation offloading"),
            "attention": Refuse("the diffusers example scripts have no activation offloading"),
        },
        # SFTConfig(activation_offloading=True): TRL's OffloadActivations, as measured.
        "trl": {
            "off": Say(),
            "cpu": say(activation_offloading=True),
            "attention": Refuse(
                "TRL's activation_offloading copies every saved activation, not the attention's"
            ),
        },
        "axolotl": _axolotl,
        "torchtune": _torchtune,
        "litgpt": {
            "off": Say(),
            "cpu": Refuse("LitGPT's finetune scripts offload no activations"),
            "attention": Refuse("LitGPT's finetune scripts offload no activations"),
        },
        # LLaMA-Factory 0.9.5's only offload is use_unsloth_gc (model/model_utils/checkpointing.py
        # UnslothGradientCheckpointing): each checkpointed layer's hidden-state input moved to
        # pageable host memory.
        "llamafactory": {
            "off": Say(),
            "cpu": Refuse(
                "LLaMA-Factory's use_unsloth_gc moves only each checkpointed layer's hidden-state "
                "input to pageable host memory, not every saved activation as measured"
            ),
            "attention": Refuse("LLaMA-Factory has no attention activation offload"),
        },
        "musubi": {
            "off": Say(),
            "cpu": Refuse(
                "musubi-tuner's --gradient_checkpointing_cpu_offload moves only each checkpointed "
                "block's hidden-state input to the host, in pageable memory with blocking copies; "
                "the blocks' other inputs (Wan 2.2's per-token timestep modulation among them) and "
                "what is saved outside the blocks stay on the GPU, not every saved activation as "
                "measured"
            ),
            "attention": Refuse("musubi-tuner has no attention activation offload"),
        },
        # OneTrainer's activation_offloading moves each checkpointed block's inputs to the host
        # (modules/util/LayerOffloadConductor.py at 23df3832), not every saved activation
        "onetrainer": lambda v, s: (
            say(**{f"{onetrainer_part(s.family)}.activation_offloading": False})
            if v == "off"
            else Refuse(
                "OneTrainer's activation_offloading moves only the checkpointed blocks' inputs "
                "to the host, not what autofit measured"
            )
        ),
    }
