"""compile: torch.compile of each of the model's blocks (regional compilation), as torchtune's
`compile: True` (training.compile_model: every transformer layer's `module.compile()`),
torchtitan's per-block compile and SimpleTuner's `dynamo_use_regional_compilation` run it.

What compiling changes in memory is what backward keeps: AOTAutograd's partitioner (inductor's
min-cut recomputation) saves fewer and smaller tensors than eager autograd, recomputing cheap
elementwise work in backward. The probe runs torch's own Dynamo, AOTAutograd and partitioner on
the run's tensors, fake or real (autofit/techniques/regional_compile.py); inductor's code is not generated,
and what its fused kernels would keep out of memory is left uncounted; the speed is the
roofline's unfused estimate. torchtune compiles its loss as well: with `loss=chunked` each
chunk's fp32 upcast and cross-entropy (its `compute_cross_entropy`) is compiled too.

What is modelled: full fine-tunes, LoRA and frozen-layer runs on a 16-bit base, on one GPU, with
or without checkpointing every block (under autocast only without), activation offload to the
host and the optimizer step in backward. The rest (quantized bases, sharding, block swap,
checkpointing every N blocks, other adapters) is refused until it is measured: under
checkpointing and autocast a real CPU run keeps some of a compiled block's saved tensors until
its backward where the simulation frees them, which is not explained yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.models import ModelPreset

if TYPE_CHECKING:
    from autofit.run_state import RunState

MODELLED_MODES = ("full", "lora", "freeze")
AUTOCAST = ("fp16", "bf16", "bf16_autocast")  # the precisions that run under autocast


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    if value == "off":
        return Say()
    return say(dynamo_backend="inductor", dynamo_use_regional_compilation=True)


class Compile(Knob):
    name = "compile"
    depends_on = (
        "base_precision",
        "checkpoint_interval",
        "checkpoint_policy",
        "checkpointing",
        "fsdp",
        "offload_activations",
        "precision",
        "swap_blocks",
        "train_mode",
        "world_size",
        "zero_stage",
    )
    default = "off"
    help = (
        "torch.compile of each block (regional, as torchtune's compile: True): off | regional; "
        "backward keeps what inductor's partitioner saves"
    )
    values = {
        "off": "eager: every op runs as written and autograd saves what each op needs",
        "regional": "each block compiled with torch.compile (torch's inductor backend; with "
        "torchtune's chunked loss, each chunk's cross-entropy too): what backward keeps is what "
        "AOTAutograd's min-cut partitioner saves",
    }
    reach = "pass"  # what forward saves and backward recomputes
    writes = ("compile_region",)
    after = ("train_mode", "checkpointing")

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return bool(preset.blocks)

    def libraries(self, value: Any) -> tuple[str, ...]:
        if value == "off":
            return ()
        return ("torch._dynamo", "torch._inductor.decomposition", "torch._functorch.partitioners")

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "off":
            return None
        knobs = context.knobs
        if not context.model.blocks:
            return (
                f"compile={value} compiles a model's repeated blocks; {context.model.name} "
                "declares none"
            )
        mode = knobs.get("train_mode", "full")
        if mode not in MODELLED_MODES:
            return (
                f"compile={value} with train_mode={mode} is not modelled "
                f"(train_mode={', '.join(MODELLED_MODES)} are)"
            )
        unmodelled = {
            "base_precision": "same",
            "fsdp": "off",
            "zero_stage": 0,
            "world_size": 1,
            "swap_blocks": 0,
            "checkpoint_interval": 1,
            # torchtitan applies its per-op policy before compiling, inside the compiled graph
            "checkpoint_policy": "full",
        }
        for knob, plain in unmodelled.items():
            if knobs.get(knob, plain) != plain:
                return f"compile={value} with {knob}={knobs[knob]} is not modelled"
        precision = knobs.get("precision")
        if knobs.get("checkpointing") and precision in AUTOCAST:
            # A real CPU run keeps some of a checkpointed compiled block's saved tensors until
            # its backward where the simulation frees them: not explained, so not offered.
            return (
                f"compile={value} with checkpointing under autocast (precision={precision}) is "
                "not modelled (precision=bf16_pure or fp32 are, or checkpointing=false)"
            )
        if knobs.get("offload_activations") == "attention":
            return (
                f"compile={value} with offload_activations=attention is not modelled (its hooks "
                "run inside each block's attention)"
            )
        return None

    def apply(self, run: RunState, value: Any) -> None:
        if value == "off":
            return
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.techniques.regional_compile import (
            checkpoints_itself,
            compile_module,
            compiled_inside_checkpoint,
            fresh_compiler,
        )

        fresh_compiler()
        checkpointing = bool(run.knobs.get("checkpointing"))
        for path in run.preset.blocks:
            for block in run.model.get_submodule(path):
                if not (checkpointing and checkpoints_itself(block)):
                    compile_module(block)  # else compiled inside its checkpoint, below
        run.compile_region = compiled_inside_checkpoint

    trainers = {
        "simpletuner": _simpletuner,
        # torchtune 0.6.1's compile: True compiles each TransformerSelfAttentionLayer before its
        # checkpoint wrapper goes round it, and the loss (training/_compile.py): CEWithChunked-
        # OutputLoss's per-chunk cross-entropy only.
        "torchtune": {"off": say(compile=False), "regional": say(compile=True)},
        "axolotl": {
            "off": Say(),
            "regional": Refuse(
                "axolotl's torch_compile is the Trainer's, which compiles the whole model at once; "
                "autofit has measured compiling each block"
            ),
        },
        "litgpt": {
            "off": Say(),
            "regional": Refuse("LitGPT's finetune scripts compile nothing (litgpt 0.5.13)"),
        },
        "llamafactory": {
            "off": Say(),
            "regional": Refuse(
                "LLaMA-Factory compiles only through the Trainer's torch_compile, which compiles "
                "the whole model at once; autofit has measured compiling each block"
            ),
        },
        "trl": {
            "off": Say(),
            "regional": Refuse(
                "TRL's torch_compile compiles the whole model at once, which autofit has not "
                "measured against compiling each block"
            ),
        },
        "onetrainer": {
            "off": say(compile=False),
            "regional": Refuse(
                "OneTrainer's compile compiles each checkpointed block whole with its checkpoint "
                "wrapper (modules/util/checkpointing_util.py), which autofit has not matched"
            ),
        },
    }
