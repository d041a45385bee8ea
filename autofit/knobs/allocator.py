"""allocator: the setting of PyTorch's CUDA caching allocator a run launches with.

- `default`: no `PYTORCH_CUDA_ALLOC_CONF`: fixed segments (2 MiB for requests up to 1 MiB,
  20 MiB for 1-10 MiB, the request rounded to 2 MiB above), whose cached and stranded blocks
  come on top of the live tensors.
- `expandable_segments`: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: one segment per
  pool that grows by mapping pages (2 MiB small pool, 20 MiB large pool) and unmaps free pages
  when memory runs short, so memory is no longer stranded across segments. Launch scripts set it
  (ms-swift's published Qwen2.5 runs, calibration/published.csv SW17-SW18), and torch's own
  out-of-memory message suggests it (c10/cuda/CUDACachingAllocator.cpp).

It changes no tensor: what the run allocates is the same; what the allocator reserves on top
differs. The `simulate` backend replays the step's allocation log through the matching model
(autofit/simulator/allocator.py `MODELS`), as does the `cpu` backend for the GPU figure it
models (the CPU's own allocator has no such setting: nothing it measures changes). The `cuda`
backend's probe worker is started with the variable in its environment
(autofit/probe/runner.py; empty for `default`, whatever the shell exports), before torch
reads it, and `prepare` checks torch took it.

A trainer is told through the environment, not a flag: every export says so in a note, and the
launch commands the accelerate and diffusers targets write set it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, Say, Subject

if TYPE_CHECKING:
    from autofit.run_state import RunState

VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
# The variable's value for each knob value (None: left unset, torch's default).
SETTINGS: Mapping[str, str | None] = {
    "default": None,
    "expandable_segments": "expandable_segments:True",
}


def environment(value: str) -> dict[str, str]:
    """The environment variables a launch command sets to run `value`."""
    setting = SETTINGS[value]
    return {} if setting is None else {VARIABLE: setting}


def worker_environment(value: str) -> dict[str, str]:
    """The probe worker's: `default` sets the variable empty (torch's defaults), so a setting
    the user's shell exports does not make a probe measure another allocator than it says."""
    return {VARIABLE: SETTINGS[value] or ""}


def _note(launched: bool) -> Any:
    """The words for a trainer: a note, as the setting is an environment variable, not a trainer
    setting; `launched`: the export's launch command sets it (autofit/export/accelerate.py
    `launch_prefix`, which the diffusers target's launch.sh uses too)."""

    def words(value: Any, s: Subject) -> Say:
        setting = SETTINGS[value]
        if setting is None:
            return Say()
        where = (
            "the launch command sets it; keep it if you launch another way"
            if launched
            else "`export` it, or put it before the launch command"
        )
        return Say(
            note=f"allocator={value}: training must start with {VARIABLE}={setting} in its "
            f"environment (an environment variable, not a trainer setting: {where})"
        )

    return words


class Allocator(Knob):
    name = "allocator"
    default = "default"
    help = "PyTorch's CUDA allocator: default (fixed segments) | expandable_segments (growing segments)"
    values = {
        "default": f"torch's default caching allocator ({VARIABLE} unset)",
        "expandable_segments": f"{VARIABLE}=expandable_segments:True in the training process's "
        "environment, before torch initialises CUDA",
    }
    per_sample_memory = False  # it changes what is reserved on top, not what a sample adds
    reach = "outside_pass"  # no tensor changes

    def prepare(self, run: RunState, value: Any) -> None:
        """A real GPU run must run the allocator it is measured as: the worker's environment
        set it before torch read it (`torch._C._accelerator_getAllocatorSettings`, torch 2.9+,
        says what torch parsed; older builds cannot say, and are trusted)."""
        if run.fake or run.device.type != "cuda":
            return
        import torch

        settings = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        wanted = SETTINGS[value]
        if settings is not None and wanted is not None and wanted not in settings():
            raise RuntimeError(
                f"allocator={value}: torch's allocator settings are {settings()!r}, not "
                f"{wanted!r}: {VARIABLE} must be set before torch initialises CUDA"
            )

    trainers = {
        "accelerate": _note(launched=True),
        "diffusers": _note(launched=True),
        **{
            v: _note(launched=False)
            for v in ("deepspeed", "kohya", "sana", "simpletuner", "musubi")
        },
        "trl": _note(launched=True),
        "axolotl": _note(launched=True),
        "torchtune": _note(launched=True),
        "litgpt": _note(launched=True),
        "llamafactory": _note(launched=True),
        "onetrainer": _note(launched=True),
    }
