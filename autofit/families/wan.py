"""Wan (Wan-AI): a video DiT over the Wan VAE's causal 3-D latents, conditioned on umT5-XXL.

Wan 2.1's text-to-video models (1.3B and 14B) and its image-to-video 14B, each of Wan 2.2's two
14B experts, which the video trainers train one at a time, and Wan 2.2's dense TI2V 5B over its
own VAE: every block is self-attention over the clip's latent tokens, cross-attention to the
prompt (and, in Wan 2.1's I2V, to a CLIP embedding of the first frame), and a feed-forward,
modulated by the timestep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.families.base import (
    AI_TOOLKIT_UNMATCHED,
    DIFFUSION_ATTENTION,
    KOHYA_VIDEO,
    Family,
    MusubiScripts,
)
from autofit.words import Refuse

# A Wan block's self- and cross-attention projections, the image keys and values of Wan 2.1 I2V's
# cross-attention (no other preset has them) and its feed-forward (musubi-tuner's LoRA adapts every
# linear layer of the blocks).
WAN_BLOCK_LINEAR = DIFFUSION_ATTENTION + ("add_k_proj", "add_v_proj", "ffn.net.0.proj", "ffn.net.2")


def musubi_blocks_to_swap(architecture: Mapping[str, Any]) -> int:
    """musubi-tuner swaps every block but one (wan/modules/model.py, WanModel.enable_block_swap)."""
    return int(architecture["num_layers"]) - 1


MUSUBI = MusubiScripts(
    script="src/musubi_tuner/wan_train_network.py",
    network="networks.lora_wan",
    cache_latents="src/musubi_tuner/wan_cache_latents.py",
    cache_text="src/musubi_tuner/wan_cache_text_encoder_outputs.py",
    latent_files={"--vae": "wan_2.1_vae.safetensors"},
    text_files={"--t5": "models_t5_umt5-xxl-enc-bf16.pth"},
    max_blocks_to_swap=musubi_blocks_to_swap,
    # its Wan configs (wan/configs/__init__.py WAN_CONFIGS)
    tasks={
        "wan2_1_t2v_1_3b": "t2v-1.3B",
        "wan2_1_t2v_14b": "t2v-14B",
        "wan2_1_i2v_14b": "i2v-14B",
        "wan2_2_t2v_a14b": "t2v-A14B",
        "wan2_2_i2v_a14b": "i2v-A14B",
    },
    # Wan 2.2 in musubi-tuner expands the timestep embedding to every token unless told to keep
    # Wan 2.1's per-clip one, which the diffusers model autofit measures keeps.
    task_flags={
        "t2v-A14B": ("--force_v2_1_time_embedding",),
        "i2v-A14B": ("--force_v2_1_time_embedding",),
    },
    # its I2V caching encodes each clip's first frame too (docs/wan.md: wan_cache_latents.py --i2v),
    # and for Wan 2.1 its CLIP image embedding, which training reads from the cache
    # (wan_train_network.py _call_dit: batch["clip"] unless the config is Wan 2.2's)
    cache_flags={
        "i2v-A14B": ("--i2v",),
        "i2v-14B": (
            "--i2v",
            "--clip",
            "path/to/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth",
        ),
    },
    # WAN_CONFIGS has no ti2v-5B config at 30c658c4 (only SUPPORTED_SIZES names it), and its VAE
    # loader reads Wan 2.1's VAE only
    refused_presets={
        "wan2_2_ti2v_5b": "musubi-tuner's wan_train_network.py has no ti2v-5B task "
        "(wan/configs/__init__.py WAN_CONFIGS at 30c658c4)",
    },
)

WAN = Family(
    name="wan",
    workload="autofit.workloads.wan",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "vae", "image_encoder"),
    lora_sets={"attention": DIFFUSION_ATTENTION, "all_linear": WAN_BLOCK_LINEAR},
    feed_forward=("ffn.net.0.proj", "ffn.net.2"),
    video=True,
    denoiser_class="WanTransformer3DModel",
    config_template="wan2_1_t2v_1_3b",
    trainers={
        "diffusers": Refuse("the diffusers examples have no Wan training script"),
        "kohya": Refuse(KOHYA_VIDEO),
        "simpletuner": Refuse("autofit does not export Wan to SimpleTuner yet"),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": MUSUBI,
        "ai_toolkit": Refuse(
            AI_TOOLKIT_UNMATCHED.format(
                what="Wan (arch wan21, wan21_i2v, wan22_14b, wan22_14b_i2v, wan22_5b: its own "
                "quantization, frame handling and layer offloading)"
            )
        ),
        "onetrainer": Refuse("OneTrainer has no Wan model"),
    },
)
