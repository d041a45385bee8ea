"""Host memory: the budget a run has there, and how a trainer's loader fills it.

A run ends as surely when the host's RAM runs out as when the GPU's does: offloaded optimizer
state and parameters, swapped blocks, a CPU copy of the EMA weights and the checkpoint being
loaded all live there. Every probe reports the host's peak (simulator/tracker.py counts it); this
module decides what it is compared against.

- `host_memory_gib=` sets the budget (GiB of the machine's RAM the run may use; a run of several
  GPUs on one machine shares it, see `host_ranks`). Unset, a probe on the local GPU gets this
  machine's RAM (MemTotal); a probe simulated for a GPU that is not here, or run on the CPU
  backend (which stands for a GPU elsewhere, as `simulate` does), gets the RAM of a typical
  machine for that card, as its entry states it (`host_memory_gib` and `host_memory_basis` in
  conf/gpu/; a 12 GB GeForce card sits in a home desktop, an A10G in a cloud VM): a run that
  only fits a host larger than the card's usual one is no answer for its owner. A card file
  that states none has no host limit, and says so.
- The model as a trainer loads it: see `loader_shard_bytes`.
- What a run holds there, every backend alike: `host_memory`, the one answer (the steps' host
  ledger, simulator/step_log.py, read with the loader's working set and the processes sharing
  the machine). The `cuda` backend raises it to the process's own readings where they are higher.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from autofit.families import family as declared
from autofit.gpus import GpuSpec
from autofit.knobs.train_mode import FOUR_BIT_MODES
from autofit.records.probe import ProbeSpec
from autofit.settings import FINITE, number
from autofit.units import size

if TYPE_CHECKING:  # the ledger's types only: the budget's readers (the commands) need no simulator
    from autofit.simulator.step_log import HostReport, StepLog

GIB = 1 << 30

# `host_memory_gib=`: a positive number of GiB, or unset (null); a finite one.
HOST_MEMORY_GIB = dataclasses.replace(
    number(lambda v: v > 0, "expected a positive number of GiB (e.g. 128), or null for the default"),
    optional=True, then=FINITE,
)  # fmt: skip

# The largest checkpoint shard a loader holds at once (bytes; "5GB" means 5 * 10**9 bytes to
# huggingface_hub's size parser). diffusers' ModelMixin.save_pretrained writes shards of at most
# max_shard_size="10GB", and from_pretrained (models/modeling_utils.py) loads one shard file at a
# time: model_loading_utils.load_state_dict (safetensors.torch.load_file), then its tensors placed.
# The language-model checkpoints on the hub were written by transformers 4.x with its default
# max_shard_size="5GB" (Llama 3.1 70B: 30 files of at most 5 GB); transformers 5 memory-maps every
# shard and materialises tensors as it assigns them (modeling_utils.py, `_load_pretrained_model`:
# safe_open(..., backend="mmap") and get_slice; core_model_loading.py, at most 4 loading threads),
# so one shard is an upper bound on its working set. Under ZeRO-3 the same code gives rank 0 the
# whole checkpoint (`load_state_dict(..., map_location="cpu")` for every file, merged) and the
# other ranks only its shapes (map_location="meta"): see `loader`.
DIFFUSERS_SHARD_BYTES = 10 * 10**9
TRANSFORMERS_SHARD_BYTES = 5 * 10**9


def loader_shard_bytes(family: str) -> int:
    """The loader's working set for a model family, in bytes.

    The rule: a trainer never holds the whole 16-bit model in host memory while it places it on
    the GPU (casting or quantizing each weight on the way); it reads the checkpoint a shard at a
    time. autofit builds the whole model on the host and then moves it; the host ledger counts
    that transient (pageable storages made and freed during setup) as at most one shard of the
    library that loads this family (its declared `loader`, autofit/families/). A model built
    straight on the GPU has no loader transient."""
    return TRANSFORMERS_SHARD_BYTES if _transformers(family) else DIFFUSERS_SHARD_BYTES


def _transformers(family: str) -> bool:
    """Whether transformers loads the family's checkpoints (its declared loader)."""
    return declared(family).loader == "transformers"


def host_memory(log: StepLog, spec: ProbeSpec) -> HostReport:
    """The host memory of a run's tracked steps, for the whole run: the steps' host ledger
    (pinned as the caching host allocator holds it, pageable live) times the processes sharing
    the machine (`host_ranks`), with the loader's working set as `loader` says (how much each
    reader holds, and how many processes read)."""
    cap, readers = loader(spec.model["family"], spec.knobs)
    return log.host_report(cap, host_ranks(spec.knobs), readers)


def loader(family: str, knobs: dict[str, Any]) -> tuple[int | None, int]:
    """How a run's processes read the checkpoint: what each reader holds at most (bytes; None:
    all of it) and how many processes read. A transformers model under ZeRO-3 is read whole by
    rank 0 alone (modeling_utils.py, `_load_pretrained_model` when is_deepspeed_zero3_enabled
    and the model is not quantized); otherwise every process reads it a shard at a time
    (`loader_shard_bytes`)."""
    quantized = knobs.get("train_mode") in FOUR_BIT_MODES
    if knobs.get("zero_stage") == 3 and _transformers(family) and not quantized:
        return None, 1
    return loader_shard_bytes(family), host_ranks(knobs)


def host_ranks(knobs: dict[str, Any]) -> int:
    """Processes sharing one machine's RAM: a probe measures one GPU's process, and a run of
    `world_size` GPUs runs one such process per GPU; autofit takes them to share one machine (a
    node of up to 8 GPUs), so the host holds world_size times one process's host memory."""
    return int(knobs.get("world_size", 1) or 1)


def machine_ram_bytes() -> int:
    """This machine's RAM (MemTotal), from sysconf, else /proc/meminfo."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("cannot read this machine's RAM (no SC_PHYS_PAGES, no MemTotal)")


def host_budget(setting: float | None, backend: str, gpu: GpuSpec) -> tuple[int | None, str | None]:
    """The host budget of a probe (bytes) and where it came from, in words for the search's
    header and the report: the setting, else this machine's RAM when the probe runs on the
    local GPU (`backend`, resolved: cuda), else the RAM of a typical machine for `gpu` (its
    entry's `host_memory_gib`), else (None, None): not stated."""
    if setting is not None:
        return int(setting * GIB), "as host_memory_gib= sets it"
    if backend == "cuda":
        return machine_ram_bytes(), "this machine's RAM"
    if gpu.host_memory_bytes is None:
        return None, None
    machine = gpu.host_memory_basis or f"as the entry of {gpu.name} states"
    words = f"a typical machine for {gpu.name}: {machine}; set host_memory_gib= for yours"
    return gpu.host_memory_bytes, words


def host_budget_bytes(setting: float | None, backend: str, gpu: GpuSpec) -> int | None:
    """`host_budget`'s bytes."""
    return host_budget(setting, backend, gpu)[0]


def host_budget_basis(setting: float | None, backend: str, gpu: GpuSpec) -> str | None:
    """`host_budget`'s words."""
    return host_budget(setting, backend, gpu)[1]


NOT_STATED = "not stated (simulated for a GPU not here); set host_memory_gib="


def budget_words(budget: int | None, basis: str | None = None) -> str:
    """A host budget in words: its size and, where given, where it comes from."""
    if budget is None:
        return NOT_STATED
    return size(budget) + (f" ({basis})" if basis else "")
