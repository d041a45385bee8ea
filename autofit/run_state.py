"""What a training run holds while it is built and stepped, and who may change what.

Knobs talk to each other only through the fields of `RunState` listed in `KNOB_FIELDS`. Each such
field has exactly one owner, the knob that declares it in its `writes`; a knob that needs a field
declares it in its `reads`, and the run applies knobs in an order where every owner comes before
its readers (autofit/knobs/__init__.py computes it and the tests check it). While a knob's hook
runs, writing any field it does not own is an error: a second writer is a bug, not a feature.

The run's own fields (its model, device, tracker, traffic meter) belong to the run; hooks may use
them and count into the meter, but not replace them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autofit.host_init import tiled_random_init
from autofit.models import ModelPreset
from autofit.records.probe import ProbeSpec

if TYPE_CHECKING:
    from autofit.simulator.tracker import MemoryTracker

# The fields knobs own (each by exactly one knob) and what each holds.
KNOB_FIELDS = {
    "dtypes": "the dtype policy: what the weights, the frozen parts and the math run in",
    "scaler": "the loss scaler of fp16 under autocast, or None",
    "companions": "frozen models on the GPU beside the trained one (text encoders, VAE)",
    "batch_source": "makes each step's batch (cached embeddings, or encoded online)",
    "host_parameters": "trained parameters that live in host memory (swapped blocks)",
    "host_gradients": "their gradients, moved to the host as backward makes them",
    "optimizer": "the update rule over the trainable parameters",
    "stepper": "drives backward and the update when something other than the plain loop does "
    "(DeepSpeed, its emulation); None: the plain loop",
    "after_step": "work after each optimizer step (an EMA update), or None",
    "base_preparation": "what is done to a 4-bit base once quantized, before its adapters are "
    "added (peft's prepare_model_for_kbit_training), or None",
    "checkpoint_plan": "which blocks gradient checkpointing wraps, and how many in one call "
    "(autofit/knobs/checkpoint_interval.py), or None: every block on its own",
    "checkpoint_contexts": "what a checkpointed block keeps besides its input: the context "
    "function of torch's selective checkpointing (autofit/knobs/checkpoint_policy.py), or None: "
    "nothing",
    "compile_region": "compiles what a checkpoint runs, where the model's own checkpointing sits "
    "inside the compiled block (autofit/knobs/compile.py), or None: runs it as it is",
}
# Bookkeeping the run changes while a hook runs (in_phase), not state a knob decides.
_RUN_BOOKKEEPING = ("phase",)


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


@dataclass(frozen=True)
class DtypePolicy:
    """The dtypes of a run, decided once (by the precision knob) before the model exists."""

    weights: torch.dtype  # what the model is built in
    frozen: torch.dtype  # frozen parts: the 16-bit dtype under mixed precision
    trained: torch.dtype  # what added trained weights (LoRA adapters) are kept in
    autocast: torch.dtype | None  # the math dtype under torch autocast, or None (no autocast)
    loss_scaling: bool  # fp16 under autocast: a GradScaler scales the loss


@dataclass(frozen=True)
class Exchange:
    """One block exchange of block swap: its bytes over the host link (both ways), the device
    time it could start at (when the block it evicts was done) and the device time the block it
    brings was needed, both on the step's clock (a roofline's device time; 0 without one)."""

    ready_at: float
    needed_at: float
    link_bytes: int


@dataclass
class HostTraffic:
    """Work a step does off the GPU, which a roofline over GPU kernels cannot see (bytes).

    Block swap's exchanges are kept one by one (`exchanges`), since when each may run decides
    whether the GPU waits for it; `clock` reads the device time a pricing roofline has reached."""

    link_bytes: int = 0  # copied between host and GPU (offload, EMA on the CPU), block swap aside
    peer_bytes: int = 0  # sent to other GPUs of the run by collectives (ZeRO across GPUs)
    host_compute_bytes: int = 0  # read and written by updates the host CPU runs
    # Read from and written to NVMe (ZeRO-Infinity): `nvme_bytes` while the GPU computes
    # (weight fetches, gradient writes, overlapped as DeepSpeed prefetches), `nvme_step_bytes`
    # by the host's optimizer step, between its own updates (DeepSpeed's default: no pipelining).
    nvme_bytes: int = 0
    nvme_step_bytes: int = 0
    exchanges: list[Exchange] = field(default_factory=list)
    clock: Callable[[], float] = lambda: 0.0


def set_logical_numel(param: torch.Tensor, numel: int) -> None:
    """Say how many weights `param` stands for when its data holds fewer elements (a packed 4-bit
    weight, one GPU's shard of a ZeRO-3 weight): parameter counts count weights, not bytes."""
    param.autofit_numel = numel  # type: ignore[attr-defined]


def logical_numel(param: torch.Tensor) -> int:
    return int(getattr(param, "autofit_numel", param.numel()))


def move_to_device(
    run: RunState, model: torch.nn.Module, skip: set[int], parameters: bool = True
) -> None:
    """The rest of a host-built model (embeddings, norms, the output head) copied to the device
    as it loads, all but the tensors in `skip` (ids: those a quantizing loader already placed) and
    the weights of blocks the run keeps in host memory; not host-link traffic of the step.
    `parameters=False`: buffers only (a run that shards its weights places their shards itself)."""
    for path, module in model.named_modules():
        for _name, param in list(module.named_parameters(recurse=False)):
            if parameters and id(param) not in skip and not run.stays_on_host(path):
                param.data = param.data.to(run.device, copy=True)
                run.tag([param], "parameters")
        for name, buffer in list(module.named_buffers(recurse=False)):
            if id(buffer) not in skip:
                module._buffers[name] = moved = buffer.to(run.device, copy=True)
                run.tag([moved], "parameters")


class PlainStep:
    """Backward and update as a plain training loop writes them: the loss (scaled under fp16)
    backward, the optimizer's step (through the scaler), gradients cleared."""

    def __init__(self, optimizer: Any, scaler: Any, grads_set_to_none: bool) -> None:
        self.optimizer, self.scaler, self.set_to_none = optimizer, scaler, grads_set_to_none
        self.module = None  # the model itself runs forward

    @property
    def state(self) -> dict[Any, Any]:
        return self.optimizer.state

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self) -> None:
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_to_none)


class RunState:
    """One configuration's training state on `device`.

    With a tracker, every allocation is attributed (autofit/simulator/tracker.py). `fake` says the
    tensors are fake (the `simulate` backend): techniques whose library cannot run on fake tensors
    use a stand-in with the same memory layout.
    """

    def __init__(
        self,
        spec: ProbeSpec,
        workload: Any,  # the family's Workload (which reads this state: no import either way)
        device: torch.device,
        tracker: MemoryTracker | None = None,
        fake: bool = False,
        owners: dict[str, str] | None = None,
    ) -> None:
        self._owners = owners or {}
        self._applying: str | None = None
        self.spec = spec
        self.knobs = spec.knobs
        self.preset = ModelPreset.from_dict(spec.model)
        self.workload = workload
        self.device = device
        self.host_device = torch.device("cpu")
        self.tracker = tracker
        self.fake = fake
        self.traffic = HostTraffic()
        self.model: Any = None
        self.phase = "setup"  # kept without a tracker too, to say where a real run ran out
        self._forward_makers: list[Callable[[], AbstractContextManager[Any] | None]] = []
        # The knobs' fields, at what they are until their owner says otherwise.
        self.dtypes = DtypePolicy(torch.float32, torch.float32, torch.float32, None, False)
        self.scaler: Any = None
        self.companions: dict[str, torch.nn.Module] = {}
        self.batch_source: Callable[[], dict[str, Any]] = self._cached_batch
        self.host_parameters: list[torch.nn.Parameter] = []
        self.host_gradients: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.optimizer: Any = None
        self.stepper: Any = None
        self.after_step: Callable[[], None] | None = None
        self.base_preparation: Callable[[RunState], None] | None = None
        self.checkpoint_plan: Any = None
        self.checkpoint_contexts: Callable[[], Any] | None = None
        self.compile_region: Callable[[Any], Any] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        applying = self.__dict__.get("_applying")
        if applying is not None and name not in _RUN_BOOKKEEPING:
            owner = self._owners.get(name)
            if owner != applying:
                held = f"knob {owner}" if owner else "the run itself"
                raise AssertionError(f"knob {applying} wrote run.{name}, which {held} owns")
        object.__setattr__(self, name, value)

    def wrap_model(self, wrap: Callable[[Any], Any]) -> None:
        """The model replaced by what a library wraps it in (PEFT's PeftModel): the run's own
        field, changed through the run so that every later hook sees the wrapper, whose
        parameters are the model's and its own."""
        object.__setattr__(self, "model", wrap(self.model))

    @contextmanager
    def applying(self, knob: str) -> Iterator[None]:
        """While `knob`'s hook runs: it may write only the fields it owns."""
        object.__setattr__(self, "_applying", knob)
        try:
            yield
        finally:
            object.__setattr__(self, "_applying", None)

    # -- where memory lives --------------------------------------------------------------------

    @contextmanager
    def in_phase(self, name: str) -> Iterator[None]:
        self.phase = name
        with self.tracker.in_phase(name) if self.tracker else nullcontext():
            yield

    def host(self, pinned: bool = False) -> Any:
        """Tensors created inside live in host memory, not on the GPU (see MemoryTracker.host);
        `pinned`: page-locked, as offload's and swap's staging buffers are."""
        return self.tracker.host(pinned) if self.tracker else nullcontext()

    def on_stream(self, stream: int) -> Any:
        """GPU memory allocated inside comes from CUDA stream `stream`'s pool of the caching
        allocator (see MemoryTracker.on_stream); 0 is the default stream."""
        return self.tracker.on_stream(stream) if self.tracker else nullcontext()

    def built_on_host(self) -> ExitStack:
        """Entered while the model is constructed: it is built in host memory, for a knob's
        apply to load onto the GPU as a loader would (quantizing, casting, or leaving swapped
        blocks behind), so the whole model never sits there at once."""
        stack = ExitStack()
        stack.enter_context(self.host_device)
        stack.enter_context(self.host())
        if not self.fake:  # drawing real random weights on the host takes a minute for 8B
            stack.enter_context(tiled_random_init())
        return stack

    def stays_on_host(self, module_path: str) -> bool:
        """Whether a module's weights start in host memory: those of the blocks swap_blocks
        swaps, which a loader must never bring onto the GPU."""
        swap = self.knobs.get("swap_blocks", 0)
        if not swap:
            return False
        for path, count in zip(self.preset.blocks, self.preset.swapped_per_list(swap), strict=True):
            if count and module_path.startswith(path + "."):
                index = module_path[len(path) + 1 :].split(".", 1)[0]
                total = len(self.model.get_submodule(path))
                if index.isdigit() and int(index) >= total - count:
                    return True
        return False

    @property
    def sharding_emulated(self) -> bool:
        """Whether ZeRO or FSDP runs as autofit's emulation rather than the library itself: on
        fake tensors, or across more GPUs than the one process a probe runs."""
        return self.fake or self.knobs.get("world_size", 1) > 1

    def partitions_weights(self) -> bool:
        """Whether an emulated sharder (ZeRO-3, FSDP) splits every weight across the run's GPUs
        once the model is built, placing each shard on the GPU itself: a loader must then leave
        the weights in host memory, as zero.Init and FSDP's rank-0 loading do, so the whole
        model never sits on one GPU."""
        sharded = self.knobs.get("zero_stage", 0) == 3 or self.knobs.get("fsdp", "off") != "off"
        return self.sharding_emulated and sharded

    def to_host(self, tensor: torch.Tensor, counted: bool = True) -> torch.Tensor:
        """A host copy of a GPU tensor, counted as traffic over the host link unless the caller
        prices it itself (`counted=False`: block swap's exchanges)."""
        with self.host():
            copy = tensor.detach().to(self.host_device, copy=True)
        if counted:
            self.traffic.link_bytes += tensor.numel() * tensor.element_size()
        return copy

    def to_device(self, tensor: torch.Tensor, counted: bool = True) -> torch.Tensor:
        """A GPU copy of a host tensor, counted as traffic over the host link (see to_host)."""
        if counted:
            self.traffic.link_bytes += tensor.numel() * tensor.element_size()
        return tensor.detach().to(self.device, copy=True)

    def tag(self, tensors: Any, category: str) -> None:
        """Attribute tensors to a breakdown category (no-op without a tracker)."""
        if self.tracker:
            for tensor in tensors:
                self.tracker.tag(tensor, category)

    # -- what trains -----------------------------------------------------------------------------

    def add_companion(self, name: str, module: torch.nn.Module) -> None:
        """A frozen model that sits on the GPU and runs every step without gradients."""
        module.eval().requires_grad_(False)
        self.companions[name] = module
        self.tag([*module.parameters(), *module.buffers()], "parameters")

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def device_trainable_parameters(self) -> list[torch.nn.Parameter]:
        host = set(self.host_parameters)
        return [p for p in self.trainable_parameters() if p not in host]

    @property
    def param_count(self) -> int:
        return sum(logical_numel(p) for p in self.model.parameters())

    @property
    def trainable_param_count(self) -> int:
        return sum(logical_numel(p) for p in self.trainable_parameters())

    @property
    def forward_module(self) -> Any:
        """What the forward pass calls: the model, or the engine that wraps it (DeepSpeed)."""
        module = getattr(self.stepper, "module", None)
        return module if module is not None else self.model

    # -- stepping helpers ------------------------------------------------------------------------

    def forward_contexts(self) -> ExitStack:
        """The contexts every forward pass runs in (autocast, the attention kernel)."""
        stack = ExitStack()
        for make in self._forward_makers:
            context = make()
            if context is not None:
                stack.enter_context(context)
        return stack

    def _cached_batch(self) -> dict[str, Any]:
        return self.workload.make_batch(
            self.knobs["batch_size"], self.knobs["resolution"], self.device, self.dtypes.weights
        )

    def checkpoint(self, block: Any, *args: Any, **kwargs: Any) -> Any:
        """The gradient-checkpointing function handed to the model (non-reentrant, as diffusers
        and transformers use), or the checkpoint plan's answer where a knob laid one out (a
        block run without it, or a run of blocks under one call)."""
        if self.checkpoint_plan is not None:
            return self.checkpoint_plan(block, *args, **kwargs)
        return self.checkpoint_call(block, *args, **kwargs)

    def checkpoint_call(self, block: Any, *args: Any, **kwargs: Any) -> Any:
        """One non-reentrant checkpoint around `block`. Under a tracker, the block's recomputed
        activations count as activations, not temporaries."""
        if self.compile_region is not None:
            block = self.compile_region(block)
        if self.checkpoint_contexts is not None:
            kwargs = {**kwargs, "context_fn": self.checkpoint_contexts}
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
