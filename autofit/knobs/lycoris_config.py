"""lycoris_config: the LyCORIS network config that `train_mode=lycoris` trains.

The file is the JSON SimpleTuner reads for `lora_type: lycoris` (its `lycoris_config`): the
algorithm (`algo`: lokr, loha, locon, ...), `multiplier`, `linear_dim` and `linear_alpha` (which
SimpleTuner passes to `create_lycoris` by position, so it requires them), any other keyword
`create_lycoris` takes (`factor`, `full_matrix`, `bypass_mode`, `conv_dim`, ...), and an optional
`apply_preset` (which module classes or names to adapt, with per-module settings). The probe
builds the network as SimpleTuner does, with the lycoris-lora library's own code:
`LycorisNetwork.apply_preset`, `create_lycoris` on the trained model, `apply_to`, the network in
the model's weight dtype (SimpleTuner moves it to `weight_dtype`).

What each adapted layer keeps is the library's: LoKr's Kronecker factors (a full second factor
with `full_matrix`, the size of the weight over the factor squared), and in bypass mode its
forward, which on an Ampere or newer GPU is lycoris' fused Triton kernel (`KronApplyFn`: it saves
the layer's input and the two factors, and never builds the weight's delta). The simulator runs
that same autograd function, its kernels answered by the library's own fake implementations; on
an older GPU, and on the CPU, lycoris runs its torch reference (which keeps an intermediate
product per layer), and so does the simulation for such a target.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autofit.errors import ConfigError
from autofit.knobs.adapter_file import AdapterFileKnob, read_json, simulated
from autofit.knobs.base import ProbeContext, Refuse, Subject, say

if TYPE_CHECKING:
    from autofit.gpus import GpuSpec
    from autofit.run_state import RunState

LYCORIS_MODE = "lycoris"  # the train_mode value that reads this knob
# create_lycoris's positional arguments after the model, as SimpleTuner reads them from the file
POSITIONAL = ("multiplier", "linear_dim", "linear_alpha")
# The class-level settings LycorisNetwork.apply_preset overwrites (kept and put back per run).
PRESET_ATTRIBUTES = (
    "ENABLE_CONV", "TARGET_REPLACE_MODULE", "TARGET_REPLACE_NAME", "LORA_PREFIX",
    "MODULE_ALGO_MAP", "NAME_ALGO_MAP", "USE_FNMATCH", "TARGET_EXCLUDE_NAME",
)  # fmt: skip


def read_config(value: str) -> dict[str, Any]:
    """The file's fields, or a ConfigError saying in a line what is wrong with it."""
    fields = read_json(
        f"lycoris_config={value}",
        Path(value).expanduser(),
        "a LyCORIS network config as SimpleTuner's lycoris_config",
    )
    missing = [k for k in ("algo", *POSITIONAL) if not isinstance(fields, dict) or k not in fields]
    if missing:
        raise ConfigError(
            f"lycoris_config={value}: a LyCORIS config names {', '.join(missing)} (SimpleTuner "
            "requires algo, multiplier, linear_dim and linear_alpha)"
        )
    preset = fields.get("apply_preset")
    if preset is not None and not isinstance(preset, dict):
        raise ConfigError(f"lycoris_config={value}: apply_preset is a mapping of preset keys")
    return fields


class LycorisConfigKnob(AdapterFileKnob):
    name = "lycoris_config"
    depends_on = ("train_mode",)
    help = (
        "the LyCORIS network config (SimpleTuner's lycoris_config JSON) that train_mode=lycoris "
        "trains: LoKr, LoHa, LoCon, ..., built by the lycoris-lora library"
    )
    mode = LYCORIS_MODE
    what = "a LyCORIS network config"
    trains = "the network a LyCORIS config declares"
    example = "lycoris_config.json"

    def means(self, value: Any, subject: Subject) -> str:
        return f"the LyCORIS network {value} declares, built by lycoris-lora"

    def file_reason(self, value: str, context: ProbeContext) -> str | None:
        try:
            fields = read_config(value)
        except ConfigError as exc:
            return str(exc)
        if fields.get("module_dropout") and simulated(context.backend):
            return (
                f"lycoris_config={value}: module_dropout draws a random number every forward to "
                "decide whether a layer runs, which the simulator's fake tensors do not hold; "
                "probe it with backend=cpu or cuda"
            )
        return None

    trainers = {
        # absolute, as SimpleTuner reads it from its own working folder
        "simpletuner": lambda v, s: say(lycoris_config=str(Path(v).expanduser().resolve())),
        **{
            vocabulary: (
                lambda v, s, _why=why: Refuse(f"{_why}; a SimpleTuner lycoris_config is not one")
            )
            for vocabulary, why in (
                (
                    "kohya",
                    "sd-scripts takes LyCORIS as network_module=lycoris.kohya and its network_args",
                ),
                ("sana", "Sana's train.py trains the whole model"),
                ("diffusers", "the diffusers example scripts train peft's LoRA"),
                ("trl", "TRL trains peft's adapters"),
                ("axolotl", "axolotl trains peft's adapters"),
                ("torchtune", "torchtune trains its own LoRA and DoRA modules"),
                ("litgpt", "LitGPT trains its own LoRA layers"),
                ("llamafactory", "LLaMA-Factory trains peft's adapters"),
            )  # fmt: skip
        },
    }


@contextmanager
def _preset(network_class: Any, preset: dict[str, Any] | None) -> Iterator[None]:
    """LycorisNetwork.apply_preset for one build: it sets class attributes, put back after."""
    kept = {name: getattr(network_class, name) for name in PRESET_ATTRIBUTES}
    try:
        if preset:
            network_class.apply_preset(preset)
        yield
    finally:
        for name, kept_value in kept.items():
            setattr(network_class, name, kept_value)


# The lycoris modules that pick a kernel per call (each imported `choose` by name).
CHOOSERS = (
    "lycoris.functional.lokr", "lycoris.functional.loha", "lycoris.functional.locon",
    "lycoris.functional.general", "lycoris.functional.boft", "lycoris.functional.diag_oft",
    "lycoris.modules.glora", "lycoris.modules.dylora", "lycoris.modules.ia3",
)  # fmt: skip


def ampere_or_newer(gpu: GpuSpec) -> bool:
    return gpu.capability >= (8, 0)


@contextmanager
def kernels_for(gpu: GpuSpec) -> Iterator[None]:
    """On fake tensors, lycoris' kernel choice as the target GPU makes it. The simulator's fake
    tensors sit on no CUDA device, so lycoris would take its torch reference; a GPU from Ampere
    on takes its fused Triton kernels wherever their operands fit them (one 16-bit family), and
    their fake implementations give the shapes. Before Ampere Triton has no bf16 tensor-core dots
    and the reference runs. A real run's choice is the library's own; `LYCORIS_KERNEL_BACKEND`
    set by the user is honoured either way."""

    from lycoris.kernels.select import one_family

    if os.environ.get("LYCORIS_KERNEL_BACKEND"):
        yield
        return
    newer = ampere_or_newer(gpu)

    def choose(tensors: Any, supported: bool = True, backend: str | None = None) -> str:
        floating = all(t is None or t.is_floating_point() for t in tensors)
        fused = newer and supported and floating and one_family(tensors)
        return "triton" if fused else "torch"

    modules = [importlib.import_module(name) for name in CHOOSERS]
    kept = [module.choose for module in modules]
    try:
        for module in modules:
            module.choose = choose
        yield
    finally:
        for module, original in zip(modules, kept, strict=True):
            module.choose = original


def _choosing_as(gpu: GpuSpec, forward: Any) -> Any:
    """A layer's forward that picks its kernel as `gpu` would, also when checkpointing
    recomputes it in backward."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with kernels_for(gpu):
            return forward(*args, **kwargs)

    return call


def add_lycoris_network(run: RunState, value: str) -> None:
    """The LyCORIS network the config declares, built on the frozen model as SimpleTuner builds
    it, and kept in the model (its parameters are the run's trainable ones)."""

    from lycoris import LycorisNetwork, create_lycoris

    # lazy: the knobs load without torch (docs/contributing.md)
    from autofit.run_state import default_dtype

    # lycoris logs each module it builds to stdout, which would fill a probe's output
    logging.getLogger("LyCORIS").setLevel(logging.WARNING)
    fields = read_config(value)
    preset = fields.pop("apply_preset", None)
    positional = [fields.pop(name) for name in POSITIONAL]
    try:
        with _preset(LycorisNetwork, preset), default_dtype(run.dtypes.weights), run.device:
            network = create_lycoris(run.model, *positional, **fields)
            if run.fake:  # before apply_to, which hands each layer's forward to its base layer
                for layer in network.loras:
                    layer.forward = _choosing_as(run.spec.gpu_spec, layer.forward)
            network.apply_to()
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"lycoris_config={value}: lycoris refuses it: {exc}") from None
    if not any(True for _ in network.parameters()):
        raise ConfigError(
            f"lycoris_config={value}: the network adapts no layer of {run.preset.name} (its "
            "apply_preset names no module class or name the model has)"
        )
    network.requires_grad_(True)
    # The network's layers hold their base layers outside the module tree, so the model holds
    # the network: its parameters are the run's trainable ones, once each.
    run.model.add_module("lycoris_network", network)
