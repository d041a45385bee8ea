"""What fsdp's knob and its trainers' words both read: the rules FSDP's knobs keep together, the
preset's block classes a trainer wraps, and the wrappers that check the rules before a trainer's
words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Refuse, Say, Subject
from autofit.knobs.optimizer import PAGED
from autofit.knobs.train_mode import FOUR_BIT_MODES
from autofit.workloads import workload_for

if TYPE_CHECKING:
    from autofit.models import ModelPreset

RESHARD_AFTER_FORWARD = {"full_shard": True, "shard_grad_op": False}
NOT_FSDP = "fsdp=off"
# Knobs FSDP is not modelled with, at the value that asks nothing of it.
NOT_WITH = (
    ("zero_stage", 0, "DeepSpeed ZeRO shards the same states: use one or the other"),
    ("swap_blocks", 0, "block swap is not modelled with it"),
    ("fused_backward", "off", "the step fused into backward is not modelled with it"),
    ("ema", "off", "an EMA copy of sharded weights is not modelled"),
    ("validation", "off", "validation with sharded weights is not modelled"),
    ("base_precision", "same", "an fp8 base is not modelled with it"),
)


def fsdp_rule(config: Mapping[str, Any], backend: str = "simulate") -> str | None:
    """Why FSDP's knobs cannot go together as set, or None."""
    value = config.get("fsdp", "off")
    if value == "off":
        if config.get("fsdp_offload", "none") != "none":
            return (
                "fsdp_offload=cpu is FSDP2's CPU offload: it needs fsdp=full_shard or shard_grad_op"
            )
        return None
    for knob, off, why in NOT_WITH:
        if config.get(knob, off) != off:
            return f"fsdp={value} with {knob}={config[knob]}: {why}"
    optimizer = config.get("optimizer", "")
    if config.get("fsdp_offload", "none") == "cpu" and optimizer in PAGED:
        unpaged = optimizer.removeprefix("paged_")
        return f"fsdp_offload=cpu steps on the host, where {optimizer} has no GPU pages to page: use {unpaged}"
    # The cpu and cuda backends run fully_shard itself in a one-process group (shard_for_real;
    # torch 2.13 runs it on the CPU over gloo), whose resized storages and DTensors the tracker
    # follows (autofit/simulator/tracker.py).
    if backend not in ("cpu", "cuda"):
        return None
    if backend == "cpu" and config.get("fsdp_offload", "none") == "cpu":
        return (
            f"fsdp={value} with fsdp_offload=cpu on the cpu backend: FSDP2's CPU offload pins "
            "host memory, which needs a GPU (use simulate, or cuda)"
        )
    if config.get("train_mode") in FOUR_BIT_MODES:
        return (
            f"fsdp={value} with train_mode={config['train_mode']} on the {backend} backend: its "
            "bitsandbytes layers keep 4-bit weights as uint8, which fully_shard cannot shard"
        )
    if config.get("optimizer") not in ("adamw", "sgd"):
        return (
            f"fsdp={value} on the {backend} backend runs fully_shard itself, whose DTensor "
            "parameters only torch's optimizers step here (optimizer adamw or sgd; or use simulate)"
        )
    return None


_BLOCK_CLASSES: dict[str, tuple[str, ...]] = {}  # preset fingerprint -> class names


def _block_classes(preset: ModelPreset) -> tuple[str, ...]:
    known = _BLOCK_CLASSES.get(preset.fingerprint())
    if known is not None:
        return known
    import torch

    with torch.device("meta"):  # no memory: only the classes are wanted
        model = workload_for(preset).build_model(torch.bfloat16)
    names: dict[str, None] = {}
    for path in preset.blocks:
        names.update(dict.fromkeys(type(block).__name__ for block in model.get_submodule(path)))
    _BLOCK_CLASSES[preset.fingerprint()] = tuple(names)
    return tuple(names)


def block_classes(preset: ModelPreset) -> str:
    """The class names of the preset's transformer blocks, comma-separated, as accelerate's
    `fsdp_transformer_layer_cls_to_wrap` takes them (Flux: its double and single blocks)."""
    return ",".join(_block_classes(preset))


def untied_embedding(preset: ModelPreset) -> bool:
    """Whether a language model's input embedding is a weight of its own, not its output head's
    (its transformers config's tie_word_embeddings, false unless said)."""
    hf_config = preset.architecture.get("config", {})
    return not hf_config.get("tie_word_embeddings", False)


def ram_efficient(s: Subject) -> bool:
    """accelerate's cpu_ram_efficient_loading, as the probe builds the model: accelerate loads a
    4-bit base whole on every GPU before sharding it (fsdp2_prepare_model skips
    cpu_ram_efficient_loading for Params4bit); any other model is built on the meta device and its
    shards loaded from rank 0, as the probe builds it on the host."""
    return s.config["train_mode"] not in FOUR_BIT_MODES


def checked(words: Any) -> Any:
    """Trainer words that first check FSDP's rules (an export may read a hand-edited study)."""

    def express(value: Any, s: Subject) -> Say | Refuse:
        broken = fsdp_rule(s.config)
        if broken:
            return Refuse(broken, NOT_FSDP)
        return Say() if value == "off" else words(value, s)

    return express


def checked_all(words: Any) -> Any:
    """As `checked`, for a trainer whose words for fsdp=off say something too."""

    def express(value: Any, s: Subject) -> Say | Refuse:
        broken = fsdp_rule(s.config)
        return Refuse(broken, NOT_FSDP) if broken else words(value, s)

    return express
