"""A training run: the model, optimizer and step that every backend executes the same way.

The backends differ only in what the tensors are (fake on the CPU, real on the CPU, real on a GPU)
and in how they measure; building and stepping happen here, through the techniques' hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from autofit.models import ModelPreset
from autofit.techniques import TECHNIQUES
from autofit.workloads import workload_for

if TYPE_CHECKING:
    from autofit.probe.spec import ProbeSpec
    from autofit.simulator.tracker import MemoryTracker


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    # Modules are built in their final dtype: under fake tensors `module.to(dtype)` cannot swap
    # parameters, and building in place also avoids a transient second copy on a real GPU.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@dataclass
class HostTraffic:
    """Work a step does off the GPU, which a roofline over GPU kernels cannot see (bytes)."""

    link_bytes: int = 0  # copied between host and GPU (block swap, offload, EMA on the CPU)
    peer_bytes: int = 0  # sent to other GPUs of the run by collectives (ZeRO across GPUs)
    host_compute_bytes: int = (
        0  # read and written by updates the host CPU runs (offloaded optimizer)
    )


class TrainingRun:
    """One configuration's model, optimizer and training step on `device`.

    With a tracker, every allocation is attributed: parameters after the build, everything still
    live at the end of the forward pass (or of a checkpointed block's recomputation) as
    activations, gradients after backward, optimizer state after the step. `fake` says the
    tensors are fake (the `simulate` backend): techniques whose library cannot run on fake tensors
    use a stand-in with the same memory layout.
    """

    def __init__(
        self,
        spec: ProbeSpec,
        device: torch.device,
        tracker: MemoryTracker | None = None,
        fake: bool = False,
    ) -> None:
        self.spec = spec
        self.knobs = spec.knobs
        self.preset = ModelPreset.from_dict(spec.model)
        self.workload = workload_for(self.preset)
        self.device = device
        self.host_device = torch.device("cpu")
        self.tracker = tracker
        self.fake = fake
        self.traffic = HostTraffic()
        # Set by the techniques' hooks.
        self.param_dtype = torch.float32
        self.frozen_dtype = (
            torch.float32
        )  # for frozen parts: the 16-bit dtype under mixed precision
        self.autocast_dtype: torch.dtype | None = None
        self.scaler: Any = None
        self.optimizer: Any = None
        self.model: Any = None
        self.companions: dict[str, torch.nn.Module] = {}  # frozen models that run every step
        self.batch_source: Callable[[], dict[str, Any]] = (
            self._cached_batch
        )  # the encoders may replace it
        self.after_step: list[Callable[[], None]] = []  # run after each optimizer step (EMA)
        self.host_parameters: list[torch.nn.Parameter] = []  # trained in host memory (block swap)
        self.host_gradients: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.engine: Any = None  # a DeepSpeed engine steps the model itself
        self.full_numel: dict[torch.nn.Parameter, int] = {}  # weights held as shards (ZeRO-3)
        self.build_contexts: list[Any] = []  # entered while the model is built (ZeRO-3's zero.Init)
        # kept without a tracker too, to say where a real run ran out of memory
        self.phase = "setup"

    # -- where memory lives --------------------------------------------------------------------

    @contextmanager
    def in_phase(self, name: str) -> Iterator[None]:
        self.phase = name
        with self.tracker.in_phase(name) if self.tracker else nullcontext():
            yield

    def host(self) -> Any:
        """Tensors created inside live in host memory, not on the GPU (see MemoryTracker.host)."""
        return self.tracker.host() if self.tracker else nullcontext()

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of a GPU tensor, counted as traffic over the host link."""
        with self.host():
            copy = tensor.detach().to(self.host_device, copy=True)
        self.traffic.link_bytes += tensor.numel() * tensor.element_size()
        return copy

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A GPU copy of a host tensor, counted as traffic over the host link."""
        self.traffic.link_bytes += tensor.numel() * tensor.element_size()
        return tensor.detach().to(self.device, copy=True)

    # -- building ------------------------------------------------------------------------------

    def build(self) -> None:
        with self.in_phase("setup"):
            for technique in TECHNIQUES:
                technique.before_build(self, self.knobs[technique.name])
            with default_dtype(self.param_dtype), self.device, ExitStack() as contexts:
                for context in self.build_contexts:
                    contexts.enter_context(context)
                self.model = self.workload.build_model(self.frozen_dtype)
            self.model.train()
            self._tag_parameters(self.model)
            for technique in TECHNIQUES:
                technique.after_build(self, self.knobs[technique.name])

    def _tag_parameters(self, module: torch.nn.Module) -> None:
        if self.tracker:
            for tensor in [*module.parameters(), *module.buffers()]:
                self.tracker.tag(tensor, "parameters")

    def add_companion(self, name: str, module: torch.nn.Module) -> None:
        """A frozen model that sits on the GPU and runs every step without gradients."""
        module.eval().requires_grad_(False)
        self.companions[name] = module
        self._tag_parameters(module)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def device_trainable_parameters(self) -> list[torch.nn.Parameter]:
        host = set(self.host_parameters)
        return [p for p in self.trainable_parameters() if p not in host]

    def _numel(self, param: torch.nn.Parameter) -> int:
        return self.full_numel.get(param, param.numel())

    @property
    def param_count(self) -> int:
        return sum(self._numel(p) for p in self.model.parameters())

    @property
    def trainable_param_count(self) -> int:
        return sum(self._numel(p) for p in self.trainable_parameters())

    # -- stepping ------------------------------------------------------------------------------

    def step(self) -> None:
        """One optimizer step: synthetic batch, forward and loss, backward, update, zero grads."""
        tracker = self.tracker
        mark = tracker.mark() if tracker else 0
        with self.in_phase("forward"), self.forward_contexts():
            batch = self.batch_source()
            loss = self.workload.loss(self.model, batch)
        if tracker:
            tracker.tag_live_since(mark, "activations")
        with self.in_phase("backward"):
            if self.engine:
                self.engine.backward(loss)
            else:
                (self.scaler.scale(loss) if self.scaler else loss).backward()
        if tracker:
            for param in self.model.parameters():
                if param.grad is not None:
                    tracker.tag(param.grad, "gradients")
        with self.in_phase("optimizer"):
            if self.engine:
                self.engine.step()
            elif self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            if not self.engine:
                self.optimizer.zero_grad(set_to_none=self.workload.grads_set_to_none)
            for hook in self.after_step:
                hook()
        if tracker:
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        tracker.tag(value, "optimizer_state")
        # The step ends with the batch and loss released, as a training loop's next iteration would.
        del loss, batch

    def _cached_batch(self) -> dict[str, Any]:
        return self.workload.make_batch(
            self.knobs["batch_size"], self.knobs["resolution"], self.device, self.param_dtype
        )

    def finish(self) -> None:
        """What a trainer does after its training steps with the training state still resident
        (a validation pass), as each technique says."""
        for technique in TECHNIQUES:
            technique.after_training(self, self.knobs[technique.name])

    def forward_contexts(self) -> ExitStack:
        """The contexts every forward pass runs in (autocast, the attention backend)."""
        stack = ExitStack()
        for technique in TECHNIQUES:
            context = technique.forward_context(self, self.knobs[technique.name])
            if context is not None:
                stack.enter_context(context)
        return stack

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
