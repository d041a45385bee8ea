"""What autofit knows about the trainers it exports to: their scripts, model names and limits.

Knobs' words (autofit/knobs/) and the exporters' layouts (autofit/export/) both read these facts,
so each is written once. Nothing here imports more than the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DATA_DIR = "path/to/images"  # placeholder: autofit never sees the user's data

# The published weights each shipped preset's architecture comes from (autofit trains random
# weights of the same shape; a trainer needs the real ones).
WEIGHTS = {
    "sana_1600m": "Efficient-Large-Model/Sana_1600M_1024px_diffusers",
    "sana_600m": "Efficient-Large-Model/Sana_600M_1024px_diffusers",
    "sd35_medium": "stabilityai/stable-diffusion-3.5-medium",
    "sd35_large": "stabilityai/stable-diffusion-3.5-large",
    "flux_dev": "black-forest-labs/FLUX.1-dev",
    "sdxl": "stabilityai/stable-diffusion-xl-base-1.0",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "qwen2_5_7b": "Qwen/Qwen2.5-7B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "qwen2_5_14b": "Qwen/Qwen2.5-14B",
    "qwen2_5_32b": "Qwen/Qwen2.5-32B",
    "qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B",
}


# --- diffusers: the example training scripts (examples/ in the diffusers repository) ------------


@dataclass(frozen=True)
class DiffusersScript:
    path: str
    kind: str  # dreambooth | text_to_image | controlnet
    lora: bool
    # What the script does with the encoders: "cached", "online", or "mixed" (text embeddings
    # precomputed, latents encoded every step).
    encoders: tuple[str, ...]
    ema: bool = False  # offers --use_ema (an EMA copy on the GPU)
    # Why the script cannot run with only the trained model on the GPU (encoders=cached).
    not_cached: str = "encodes latents with the VAE on the GPU every step"
    # What its validation loads beside what training holds, if it reloads its text encoders
    # (validation=reload reproduces it; validation=on is then refused).
    validation_reloads: str = ""

    @property
    def file(self) -> str:
        return self.path.rsplit("/", 1)[-1]


DIFFUSERS_SCRIPTS = {
    ("sana", "lora"): DiffusersScript("examples/dreambooth/train_dreambooth_lora_sana.py", "dreambooth", True, ("cached", "online")),
    ("sd3", "full"): DiffusersScript("examples/dreambooth/train_dreambooth_sd3.py", "dreambooth", False, ("online",)),
    ("sd3", "lora"): DiffusersScript("examples/dreambooth/train_dreambooth_lora_sd3.py", "dreambooth", True, ("cached", "online")),
    ("flux", "full"): DiffusersScript("examples/dreambooth/train_dreambooth_flux.py", "dreambooth", False, ("online",)),
    # With --cache_latents and one instance prompt this script still holds both text encoders on
    # the GPU through training: its list `text_encoders` keeps them alive after it deletes their
    # names (diffusers 2024-12 to 2026-08). Its memory is encoders=online's.
    # Its validation (after epoch 0, then every --validation_epochs) loads a second pair of text
    # encoders while that list holds the first, and renders at FluxPipeline's default 1024 px
    # (the commit before diffusers issue #10145, 2024-12, through 2026-08).
    ("flux", "lora"): DiffusersScript("examples/dreambooth/train_dreambooth_lora_flux.py", "dreambooth", True, ("online",),
                                      not_cached="keeps both text encoders on the GPU through training, even with cached latents and one prompt",
                                      validation_reloads="loads a second pair of text encoders for each validation while its training list still holds the first"),
    ("sdxl", "full"): DiffusersScript("examples/text_to_image/train_text_to_image_sdxl.py", "text_to_image", False, ("cached",), ema=True),
    ("sdxl", "lora"): DiffusersScript("examples/text_to_image/train_text_to_image_lora_sdxl.py", "text_to_image", True, ("online",)),
    ("sd3_controlnet", "full"): DiffusersScript("examples/controlnet/train_controlnet_sd3.py", "controlnet", False, ("mixed",)),
}  # fmt: skip


def diffusers_script(family: str, train_mode: str) -> DiffusersScript | None:
    """The example script that trains `family` in `train_mode`, if there is one."""
    return DIFFUSERS_SCRIPTS.get((family, train_mode))


# --- kohya sd-scripts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KohyaScripts:
    full: str  # the full fine-tune script
    lora: str  # the LoRA (network) script
    network: str  # its LoRA network module


KOHYA_SCRIPTS = {
    "flux": KohyaScripts("flux_train.py", "flux_train_network.py", "networks.lora_flux"),
    "sd3": KohyaScripts("sd3_train.py", "sd3_train_network.py", "networks.lora_sd3"),
    "sdxl": KohyaScripts("sdxl_train.py", "sdxl_train_network.py", "networks.lora"),
}
# The single-file checkpoints each family's scripts load besides the model itself.
KOHYA_COMPANION_FILES = {
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


def kohya_max_blocks_to_swap(family: str, architecture: dict[str, Any]) -> int | None:
    """The largest `blocks_to_swap` sd-scripts accepts for a model (None: it has no swap).

    Flux: a swap of N blocks moves N//2 double blocks and 2*(N - N//2) single blocks, each at
    most its count less two; SD3: at most the joint blocks less two; SDXL scripts have none."""
    if family == "flux":
        double = int(architecture.get("num_layers", 19))
        single = int(architecture.get("num_single_layers", 38))
        allowed = [
            n
            for n in range(double + single)
            if n // 2 <= double - 2 and (n - n // 2) * 2 <= single - 2
        ]
        return max(allowed)
    if family == "sd3":
        return int(architecture["num_layers"]) - 2
    return None


# --- SimpleTuner 4.10 ---------------------------------------------------------------------------

# Its --model_family for each autofit family, and --model_flavour for each preset.
SIMPLETUNER_FAMILIES = {
    "sana": "sana",
    "sd3": "sd3",
    "sd3_controlnet": "sd3",
    "flux": "flux",
    "sdxl": "sdxl",
}
SIMPLETUNER_FLAVOURS = {
    "sana_1600m": "sana1.0-1.6b-1024",
    "sana_600m": "sana1.0-600m-1024",
    "sd35_medium": "medium",
    "sd35_large": "large",
    "flux_dev": "dev",
    "sdxl": "base-1.0",
}
# Families whose SimpleTuner model implements musubi block swap (its field registry's list).
SIMPLETUNER_BLOCK_SWAP_FAMILIES = ("flux",)
# SimpleTuner reads a named environment from config/<env>/ under its working directory.
SIMPLETUNER_ENV = "autofit"


# --- NVlabs Sana --------------------------------------------------------------------------------

# The shipped train config each preset's architecture matches.
SANA_BASE_CONFIGS = {
    "sana_1600m": "configs/sana_config/1024ms/Sana_1600M_img1024.yaml",
    "sana_600m": "configs/sana_config/1024ms/Sana_600M_img1024.yaml",
}
