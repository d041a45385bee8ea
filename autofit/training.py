"""A training run: the model, optimizer and step that every backend executes the same way.

The backends differ only in what the tensors are (fake on the CPU, real on the CPU, real on a GPU)
and in how they measure; building and stepping happen here, through the techniques' hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

from autofit.models import ModelPreset
from autofit.techniques import TECHNIQUES
from autofit.workloads import workload_for

if TYPE_CHECKING:
    from autofit.memory.tracker import MemoryTracker
    from autofit.probe.spec import ProbeSpec


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    # Modules are built in their final dtype: under fake tensors `module.to(dtype)` cannot swap
    # parameters, and building in place also avoids a transient second copy on a real GPU.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class TrainingRun:
    """One configuration's model, optimizer and training step on `device`.

    With a tracker, every allocation is attributed: parameters after the build, everything still
    live at the end of the forward pass (or of a checkpointed block's recomputation) as
    activations, gradients after backward, optimizer state after the step.
    """

    def __init__(
        self, spec: ProbeSpec, device: torch.device, tracker: MemoryTracker | None = None
    ) -> None:
        self.spec = spec
        self.knobs = spec.knobs
        self.preset = ModelPreset.from_dict(spec.model)
        self.workload = workload_for(self.preset)
        self.device = device
        self.tracker = tracker
        # Set by the techniques' hooks.
        self.param_dtype = torch.float32
        self.autocast_dtype: torch.dtype | None = None
        self.scaler: Any = None
        self.optimizer: Any = None
        self.model: Any = None
        self.phase = (
            "setup"  # kept without a tracker too, to say where a real run ran out of memory
        )

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        self.phase = name
        with self.tracker.in_phase(name) if self.tracker else nullcontext():
            yield

    def build(self) -> None:
        with self._phase("setup"):
            for technique in TECHNIQUES:
                technique.before_build(self, self.knobs[technique.name])
            with _default_dtype(self.param_dtype), self.device:
                self.model = self.workload.build_model()
            self.model.train()
            if self.tracker:
                for tensor in [*self.model.parameters(), *self.model.buffers()]:
                    self.tracker.tag(tensor, "parameters")
            for technique in TECHNIQUES:
                technique.after_build(self, self.knobs[technique.name])

    @property
    def param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def trainable_param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def step(self) -> None:
        """One optimizer step: synthetic batch, forward and loss, backward, update, zero grads."""
        tracker = self.tracker
        mark = tracker.mark() if tracker else 0
        with self._phase("forward"), ExitStack() as contexts:
            for technique in TECHNIQUES:
                context = technique.forward_context(self, self.knobs[technique.name])
                if context is not None:
                    contexts.enter_context(context)
            batch = self.workload.make_batch(
                self.knobs["batch_size"], self.knobs["resolution"], self.device, self.param_dtype
            )
            loss = self.workload.loss(self.model, batch)
        if tracker:
            tracker.tag_live_since(mark, "activations")
        with self._phase("backward"):
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        if tracker:
            for param in self.model.parameters():
                if param.grad is not None:
                    tracker.tag(param.grad, "gradients")
        with self._phase("optimizer"):
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if tracker:
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        tracker.tag(value, "optimizer_state")
        # The step ends with the batch and loss released, as a training loop's next iteration would.
        del loss, batch

    def checkpoint(self, block: Any, *args: Any, **kwargs: Any) -> Any:
        """The gradient-checkpointing function handed to the model (non-reentrant, as diffusers
        and transformers use). Under a tracker, a block's recomputed activations count as
        activations, not temporaries."""
        return torch.utils.checkpoint.checkpoint(
            self._recomputable(block), *args, use_reentrant=False, **kwargs
        )

    def _recomputable(self, block: Any) -> Any:
        tracker = self.tracker

        def call(*args: Any, **kwargs: Any) -> Any:
            if tracker is None or tracker.phase != "backward":
                return block(*args, **kwargs)
            mark = tracker.mark()
            try:
                return block(*args, **kwargs)
            finally:  # recomputation may stop early once it has what backward needs
                tracker.tag_live_since(mark, "activations")

        return call
