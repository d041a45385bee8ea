"""Your own model: `model=custom model.entry=package.module:function`.

The function takes no arguments and returns a `CustomModel`: the model (built inside the call, so
autofit can build it on the GPU, in the precision's dtype, or on fake tensors), how to make a
batch, and the loss. This is the only place where a configuration names code to import.

    from autofit.workloads.custom import CustomModel

    def build() -> CustomModel:
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        def make_batch(batch_size, resolution, device, dtype):
            return {"x": torch.randn(batch_size, (resolution // 8) ** 2, 64, device=device, dtype=dtype)}
        def loss(model, batch):
            return model(batch["x"]).float().pow(2).mean()
        return CustomModel(model=model, make_batch=make_batch, loss=loss)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autofit.errors import ConfigError, shown
from autofit.workloads.base import Batch, CheckpointFn, Workload


@dataclass
class CustomModel:
    """What a user's entry function returns."""

    model: torch.nn.Module
    make_batch: Callable[[int, int, torch.device, torch.dtype], Batch]
    loss: Callable[[torch.nn.Module, Batch], torch.Tensor]
    # Optional: make the model run its blocks through `checkpoint(block, *inputs)`.
    enable_checkpointing: Callable[[torch.nn.Module, CheckpointFn], None] | None = None


def load_entry(entry: Any) -> Callable[[], Any]:
    """The user's function named by `package.module:function`, or a one-line ConfigError (an
    error raised while the module is imported included)."""
    module, function = check_entry(entry)
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # the user's code: whatever it raises is named, in one line
        raise ConfigError(
            f"model.entry={entry}: importing '{module}' failed: {_said(exc)}"
        ) from None
    found = getattr(imported, function, None)
    if found is None:
        raise ConfigError(f"model.entry={entry}: module '{module}' has no '{function}'")
    if not callable(found):
        raise ConfigError(
            f"model.entry={entry}: '{function}' is a {type(found).__name__}, not a function"
        )
    return found


def check_built(entry: str, function: Callable[[], Any]) -> None:
    """Call the user's function on the meta device (no memory, no math) and check that it
    returns a CustomModel: its mistakes are one-line errors before any probe, not a crash in
    each. autofit/probe/entry_check.py calls it in a child process, under a timeout: the user's
    code may end or hang the process it runs in."""
    try:
        with torch.device("meta"):
            built = function()
    except Exception as exc:
        raise ConfigError(
            f"model.entry={entry}: {function.__name__}() failed: {_said(exc)}"
        ) from None
    _check_model(entry, built)


def _check_model(entry: str, built: Any) -> None:
    if not isinstance(built, CustomModel):
        raise ConfigError(f"model.entry={entry} returned {type(built).__name__}, not a CustomModel")


def _said(exc: Exception) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__


def check_entry(entry: Any) -> tuple[str, str]:
    """`package.module:function`, split, with the module findable (not imported yet): from the
    working directory too, as `python -m` finds it (the `autofit` script's own directory is
    what Python puts first otherwise)."""
    if not isinstance(entry, str) or entry.count(":") != 1 or not all(entry.split(":")):
        raise ConfigError(
            f"model.entry={shown(entry)} is not valid; write model.entry=package.module:function"
        )
    module, function = entry.split(":")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(
            f"model.entry={entry}: no module '{module}' is importable from {here} or PYTHONPATH"
        )
    return module, function


class CustomWorkload(Workload):
    def __init__(self, preset: Any, frames: int | None = None) -> None:
        super().__init__(preset, frames)
        # Imported now, before any fake-tensor mode: its constants must stay real.
        self.entry = load_entry(preset.entry)
        self.custom: CustomModel | None = None

    def _model(self) -> CustomModel:
        assert self.custom is not None, "build_model first"
        return self.custom

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        built = self.entry()
        _check_model(self.preset.entry, built)
        self.custom = built
        return built.model

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Batch:
        return self._model().make_batch(batch_size, resolution, device, dtype)

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        return self._model().loss(model, batch)

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        hook = self._model().enable_checkpointing
        if hook is None:
            raise ConfigError(
                f"checkpointing=true: model.entry={self.preset.entry} gives no enable_checkpointing"
            )
        hook(model, checkpoint)


WORKLOAD = CustomWorkload
