"""A training run: the model, optimizer and step that every backend executes the same way.

The backends differ only in what the tensors are (fake on the CPU, real on the CPU, real on a GPU)
and in how they measure; building and stepping happen here, through the knobs' hooks in their
application order (autofit/knobs/__init__.py), each hook allowed to write only the run fields its
knob owns (autofit/run_state.py).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import torch

from autofit.knobs import application_order, defaults, owners
from autofit.models import ModelPreset
from autofit.records.probe import ProbeSpec
from autofit.run_state import PlainStep, RunState, default_dtype
from autofit.simulator.step_log import Position, StepMarks
from autofit.techniques.optimizers.in_backward import InBackwardOptimizer
from autofit.workloads import workload_for

if TYPE_CHECKING:
    from autofit.simulator.tracker import MemoryTracker


class TrainingRun(RunState):
    """One configuration's model, optimizer and training step on `device`.

    With a tracker, every allocation is attributed: parameters after the build, everything still
    live at the end of the forward pass (or of a checkpointed block's recomputation) as
    activations, gradients after backward, optimizer state after the step.
    """

    def __init__(
        self,
        spec: ProbeSpec,
        device: torch.device,
        tracker: MemoryTracker | None = None,
        fake: bool = False,
    ) -> None:
        # Knobs a spec predates (written by an older autofit) run at their defaults.
        spec = dataclasses.replace(spec, knobs={**defaults(), **spec.knobs})
        preset = ModelPreset.from_dict(spec.model)
        workload = workload_for(preset, spec.knobs["frames"])
        super().__init__(spec, workload, device, tracker, fake, owners=owners())
        self._order = application_order()
        for knob in self._order:
            for library in knob.libraries(self.knobs[knob.name]):
                importlib.import_module(library)
        self._forward_makers = [self._maker(knob) for knob in self._order]
        self._stepper: Any = None
        # The kernels priced and ops dispatched so far in the step being priced (a backend that
        # prices it says how to read them; see `position`).
        self.priced: Callable[[], tuple[int, int]] = lambda: (0, 0)

    def _maker(self, knob: Any) -> Any:
        value = self.knobs[knob.name]
        return lambda: knob.forward_context(self, value)

    def _hook(self, hook: str) -> list[Any]:
        """Run `hook` of every knob in order; return what each returned."""
        returned = []
        for knob in self._order:
            with self.applying(knob.name):
                returned.append(getattr(knob, hook)(self, self.knobs[knob.name]))
        return returned

    # -- building ------------------------------------------------------------------------------

    def build(self) -> None:
        with self.in_phase("setup"):
            self._hook("prepare")
            with default_dtype(self.dtypes.weights), self.device, ExitStack() as contexts:
                for context in self._hook("build_context"):
                    if context is not None:
                        contexts.enter_context(context)
                self.model = self.workload.build_model(self.dtypes.frozen)
            self.model.train()
            self.tag([*self.model.parameters(), *self.model.buffers()], "parameters")
            self._hook("apply")
            self._stepper = self.stepper or PlainStep(
                self.optimizer, self.scaler, self.workload.grads_set_to_none
            )

    # -- stepping ------------------------------------------------------------------------------

    def step(self) -> StepMarks | None:
        """One optimizer step: synthetic batch, forward and loss, backward, update, zero grads.
        Under a tracker, where its parts lie in the tracker's log."""
        tracker = self.tracker
        stepper = self._stepper
        mark = tracker.mark() if tracker else 0
        start = self.position()
        with self.in_phase("forward"), self.forward_contexts():
            batch = self.batch_source()
            loss = self.workload.loss(self.forward_module, batch)
        if tracker:
            tracker.tag_live_since(mark, "activations")
        with self.in_phase("backward"):
            stepper.backward(loss)
        grads = self._gradients()
        update = self.position()
        self._update()
        updated = self.position()
        # The step ends with the batch and loss released, as a training loop's next iteration would.
        del loss, batch
        if tracker is None:
            return None
        return StepMarks(start, update, updated, self.position(), grads)

    def position(self) -> Position:
        """How far the tracked run has got (none without a tracker)."""
        tracker, traffic = self.tracker, self.traffic
        if tracker is None:
            return Position(0)
        moved = (traffic.link_bytes, traffic.peer_bytes, traffic.host_compute_bytes)
        elsewhere = (traffic.nvme_bytes, traffic.nvme_step_bytes, len(traffic.exchanges))
        return Position(
            len(tracker.events), len(tracker.host_events), moved, elsewhere, *self.priced()
        )

    def can_update_without_a_pass(self) -> bool:
        """Whether the first step's update can be traced from gradients made directly
        (`update_without_a_pass`): the run's own loop (or ZeRO's emulation, where it says so)
        updates after backward from each trainable parameter's gradient and drops them, with no
        loss scaler (whose state its first backward makes) and no weights on the host (whose
        gradients backward moves there)."""
        stepper = self.stepper
        return (
            (
                stepper is None
                or getattr(getattr(stepper, "optimizer", None), "updates_without_a_pass", False)
            )
            and self.scaler is None
            and self.workload.grads_set_to_none
            and not self.host_parameters
            and not isinstance(self.optimizer, InBackwardOptimizer)
        )

    def update_without_a_pass(self) -> StepMarks:
        """The first step's update, from gradients made directly, one per trainable parameter as
        backward leaves them, instead of from a forward and backward pass. A tracker's log then
        lacks that pass: autofit/fastpath/first_step.py puts the next step's in its place."""
        start = self.position()
        with self.in_phase("backward"):
            for param in self.trainable_parameters() if self._reads_gradients() else ():
                param.grad = torch.empty_like(param)
        grads = self._gradients()
        update = self.position()
        self._update()
        updated = self.position()
        return StepMarks(start, update, updated, updated, grads)

    def _reads_gradients(self) -> bool:
        """Whether the update reads each trainable parameter's gradient (not ZeRO-2's, which
        reads the share backward reduced them into)."""
        return getattr(getattr(self._stepper, "optimizer", None), "reads_gradients", True)

    def _gradients(self) -> tuple[int | None, ...]:
        """Each trainable parameter's gradient the update reads, tagged as such: its allocation
        id in the tracker's log (None without one, or without a gradient)."""
        grads = [p.grad for p in self.trainable_parameters()] if self._reads_gradients() else []
        self.tag([g for g in grads if g is not None], "gradients")
        tracker = self.tracker
        if tracker is None:
            return ()
        return tuple(None if g is None else tracker.allocation_of(g) for g in grads)

    def _update(self) -> None:
        stepper = self._stepper
        with self.in_phase("optimizer"):
            stepper.step()
            if self.after_step is not None:
                self.after_step()
        if self.tracker:
            for state in stepper.state.values():
                self.tag(
                    [v for v in state.values() if isinstance(v, torch.Tensor)], "optimizer_state"
                )

    def finish(self) -> None:
        """What a trainer does after its training steps with the training state still resident
        (a validation pass), as each knob says."""
        self._hook("after_training")
