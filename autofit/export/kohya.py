"""`target=kohya`: an sd-scripts training TOML (`--config_file`) and dataset TOML (`dataset_config`).

Keys are sd-scripts' argument names (its config file holds them without the dashes). The
trainer is the family's script in sd-scripts: `flux_train.py` / `flux_train_network.py`,
`sd3_train.py` / `sd3_train_network.py`, `sdxl_train.py` / `sdxl_train_network.py`; sd-scripts
has no Sana trainer and no SD3 ControlNet trainer.

sd-scripts' rules the export keeps: `blocks_to_swap` at most the model's maximum (Flux: a swap
of N blocks moves N//2 double blocks and 2*(N - N//2) single blocks, each at most its count less
two; SD3: at most the joint blocks less two; SDXL scripts have no block swap), and never together
with `cpu_offload_checkpointing` (which autofit's checkpointing never sets).
"""

from __future__ import annotations

from typing import Any

from autofit.export.base import DATA_DIR, Plan, Target
from autofit.export.deepspeed import zero_knobs
from autofit.export.toml import dumps

# family -> (full fine-tune script, LoRA script, LoRA network module)
SCRIPTS = {
    "flux": ("flux_train.py", "flux_train_network.py", "networks.lora_flux"),
    "sd3": ("sd3_train.py", "sd3_train_network.py", "networks.lora_sd3"),
    "sdxl": ("sdxl_train.py", "sdxl_train_network.py", "networks.lora"),
}
# The single-file checkpoints each family's scripts load besides the model itself.
COMPANION_FILES = {
    "flux": {
        "clip_l": "clip_l.safetensors",
        "t5xxl": "t5xxl_fp16.safetensors",
        "ae": "ae.safetensors",
    },
    "sd3": {
        "clip_l": "clip_l.safetensors",
        "clip_g": "clip_g.safetensors",
        "t5xxl": "t5xxl_fp16.safetensors",
    },
    "sdxl": {},
}
# optimizer -> (optimizer_type, optimizer_args): sd-scripts' names, and the arguments that make
# it the optimizer the probe ran (a dotted name is imported as module.Class; a bare unknown name
# comes from torch.optim).
OPTIMIZERS = {
    "adamw": ("AdamW", ["fused=True"]),
    "adamw8bit": ("AdamW8bit", []),
    "paged_adamw8bit": ("PagedAdamW8bit", []),
    "adafactor": (
        "Adafactor",
        ["relative_step=False", "scale_parameter=False", "warmup_init=False"],
    ),
    "came": ("came_pytorch.CAME", ["weight_decay=0.01"]),
    "lion": ("Lion", ["weight_decay=0.01"]),
    "lion8bit": ("Lion8bit", []),
    "adamw_bf16": ("AdamW", ["fused=True"]),
    "sgd": ("SGD", ["momentum=0.9"]),
}
SAVE_PRECISION = {"fp32": "float", "fp16": "fp16", "bf16": "bf16", "bf16_pure": "bf16"}


def max_blocks_to_swap(plan: Plan) -> int | None:
    """The largest `blocks_to_swap` sd-scripts accepts for the model (None: it has no swap)."""
    family, arch = plan.point.family, plan.point.preset.architecture
    if family == "flux":
        double, single = int(arch.get("num_layers", 19)), int(arch.get("num_single_layers", 38))
        allowed = [
            n
            for n in range(double + single)
            if n // 2 <= double - 2 and (n - n // 2) * 2 <= single - 2
        ]
        return max(allowed)
    if family == "sd3":
        return int(arch["num_layers"]) - 2
    return None


def _precision(plan: Plan, args: dict[str, Any]) -> str:
    precision = plan.value("precision")
    mixed = {"fp32": "no", "fp16": "fp16", "bf16": "bf16", "bf16_pure": "bf16"}[precision]
    args["mixed_precision"] = mixed
    if precision == "bf16_pure":
        args["full_bf16"] = True  # bf16 weights, gradients and optimizer states
    args["save_precision"] = SAVE_PRECISION[precision]
    return mixed


def _optimizer(plan: Plan, args: dict[str, Any]) -> None:
    optimizer = plan.value("optimizer")
    name, options = OPTIMIZERS[optimizer]
    args["optimizer_type"] = name
    if options:
        args["optimizer_args"] = options
    if optimizer == "adamw_bf16":
        plan.warn(
            "optimizer",
            "sd-scripts has no stochastic-rounding AdamW; AdamW under full_bf16 keeps the same "
            "bf16 states (the same memory) but rounds its updates to nearest",
        )


def _zero(plan: Plan, args: dict[str, Any]) -> None:
    stage, offload_optimizer, offload_params = zero_knobs(plan)
    if not stage:
        return
    args.update(deepspeed=True, zero_stage=stage)
    if offload_optimizer != "none":
        args["offload_optimizer_device"] = offload_optimizer
    if offload_params != "none":
        args["offload_param_device"] = offload_params
    if stage == 3:
        args["zero3_init_flag"] = True


def _memory(plan: Plan, args: dict[str, Any]) -> None:
    family = plan.point.family
    args["gradient_checkpointing"] = plan.value("checkpointing")
    swap = plan.value("swap_blocks")
    if swap:
        most = max_blocks_to_swap(plan)
        if most is None:
            plan.refuse("swap_blocks", f"sd-scripts' {family} scripts have no blocks_to_swap")
        if swap > most:
            plan.refuse(
                "swap_blocks", f"sd-scripts swaps at most {most} blocks of {plan.point.model}"
            )
        args["blocks_to_swap"] = swap
    cached = plan.value("encoders") == "cached"
    # Cached: latents and text-encoder outputs computed before training and kept on disk, so
    # only the trained model is on the GPU; online: the VAE and text encoders run every step.
    args.update(
        cache_latents=cached,
        cache_latents_to_disk=cached,
        cache_text_encoder_outputs=cached,
        cache_text_encoder_outputs_to_disk=cached,
    )
    ema = plan.value("ema")
    if ema != "off":
        plan.refuse("ema", "sd-scripts keeps no EMA copy of the weights")
    attention = plan.value("attention")
    if attention == "sdpa":
        args["sdpa"] = True
    elif family != "sdxl":
        plan.warn(
            "attention",
            f"sd-scripts' {family} model always runs torch's fused attention, which holds less "
            "than the measured math path",
        )
    # SDXL without sdpa/xformers runs its plain attention: the math path, as measured.


def _network(plan: Plan, args: dict[str, Any]) -> str:
    full, lora, module = SCRIPTS[plan.point.family]
    mode = plan.value("train_mode")
    rank = plan.value("lora_rank")
    if mode == "qlora":
        plan.refuse(
            "train_mode",
            "sd-scripts quantizes a base model to fp8 at most (fp8_base), not to 4-bit NF4",
        )
    if mode == "full":
        return full
    args.update(
        network_module=module,
        network_dim=rank,
        network_alpha=rank,
        network_train_unet_only=True,  # autofit trains the denoiser's adapters only
    )
    return lora


def _files(plan: Plan, args: dict[str, Any]) -> None:
    point = plan.point
    args["pretrained_model_name_or_path"] = f"path/to/{point.model}.safetensors"
    for key, name in COMPANION_FILES[point.family].items():
        args[key] = f"path/to/{name}"
    listed = ", ".join(["pretrained_model_name_or_path", *COMPANION_FILES[point.family]])
    plan.note(f"replace the 'path/to/...' placeholders of train.toml ({listed}) with your files")


def _dataset(plan: Plan) -> dict[str, Any]:
    resolution = plan.value("resolution")
    return {
        "general": {"caption_extension": ".txt"},
        "datasets": [
            {
                # Buckets keep the area of resolution x resolution: no batch holds more
                # pixels than the measured one.
                "resolution": resolution,
                "batch_size": plan.value("batch_size"),
                "enable_bucket": True,
                "min_bucket_reso": max(256, resolution // 2),
                "max_bucket_reso": resolution * 2,
                "bucket_reso_steps": 64,
                "bucket_no_upscale": True,
                "subsets": [{"image_dir": DATA_DIR, "num_repeats": 1}],
            }
        ],
    }


class Kohya(Target):
    name = "kohya"
    summary = "kohya sd-scripts' training TOML and dataset TOML (Flux, SD3, SDXL)"
    families = {family: scripts[0] for family, scripts in SCRIPTS.items()}

    def build(self, plan: Plan) -> None:
        point = plan.point
        args: dict[str, Any] = {}
        _files(plan, args)
        dataset = plan.add(
            "dataset.toml", dumps(_dataset(plan)), "sd-scripts dataset config (dataset_config)"
        )
        args["dataset_config"] = str(dataset)
        args.update(output_dir="output", output_name=point.study, save_model_as="safetensors")
        script = _network(plan, args)
        mixed = _precision(plan, args)
        args["gradient_accumulation_steps"] = point.accumulation
        _optimizer(plan, args)
        _zero(plan, args)
        _memory(plan, args)
        if plan.value("validation") == "on":
            resolution = point.config["resolution"]
            prompts = plan.add(
                "sample_prompts.txt",
                f"a photo --w {resolution} --h {resolution}",
                "sd-scripts sample prompts (validation images)",
            )
            args.update(sample_prompts=str(prompts), sample_every_n_steps=100)
            plan.note("sample_prompts.txt holds a placeholder prompt: put your own")
        world = plan.value("world_size")
        config = plan.add("train.toml", dumps(args), f"sd-scripts training config for {script}")
        plan.note(f"put your images (with .txt captions) in '{DATA_DIR}' of dataset.toml")
        plan.note("run the launch command from sd-scripts' folder")
        plan.command = (
            f"accelerate launch --num_processes {world} --mixed_precision {mixed} "
            f"{script} --config_file {config}"
        )


TARGET = Kohya()
