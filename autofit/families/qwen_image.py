"""Qwen-Image (Qwen): a 20B MMDiT of 60 dual-stream blocks over its VAE's 16-channel latents in
2x2 patches, prompted by Qwen2.5-VL-7B's last hidden state, not guidance-distilled.

Every block has the image's and the prompt's own projections, feed-forwards and modulation,
attending jointly (Flux's dual-stream block, with no single-stream blocks after them).

Qwen-Image-Edit is the same model trained on pairs, a reference image's tokens beside the
target's and its vision tokens in the prompt (autofit/workloads/qwen_image.py), declared from
Qwen-Image's declaration: its trainers run it apart (musubi-tuner's --model_version edit with
control images, SimpleTuner's edit-v1 flavour with a conditioning dataset), and the diffusers
examples have no script for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from autofit.families.base import (
    AI_TOOLKIT_UNMATCHED,
    DIFFUSION_ATTENTION,
    JOINT_ATTENTION,
    ONETRAINER_UNMATCHED,
    DiffusersScript,
    DiffusersScripts,
    Family,
    MusubiScripts,
    SimpleTunerModel,
)
from autofit.words import Refuse

# Both streams' feed-forwards (diffusers' FeedForward: net.0.proj in, net.2 out).
FEED_FORWARD = ("img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")
# Every linear of a block but its modulation (img_mod, txt_mod): musubi-tuner's LoRA
# (networks/lora_qwen_image.py adapts the blocks' linears and excludes "_mod_" ones).
BLOCK_LINEAR = JOINT_ATTENTION + FEED_FORWARD


def musubi_blocks_to_swap(architecture: Mapping[str, Any]) -> int:
    """musubi-tuner swaps every block but one (qwen_image/qwen_image_model.py,
    QwenImageTransformer2DModel.enable_block_swap, kohya-ss/musubi-tuner 30c658c4)."""
    return int(architecture["num_layers"]) - 1


MUSUBI = MusubiScripts(
    script="src/musubi_tuner/qwen_image_train_network.py",
    network="networks.lora_qwen_image",
    cache_latents="src/musubi_tuner/qwen_image_cache_latents.py",
    cache_text="src/musubi_tuner/qwen_image_cache_text_encoder_outputs.py",
    # docs/qwen_image.md's files (Comfy-Org's single-file VAE and Qwen2.5-VL)
    latent_files={"--vae": "qwen_image_vae.safetensors"},
    text_files={"--text_encoder": "qwen_2.5_vl_7b.safetensors"},
    max_blocks_to_swap=musubi_blocks_to_swap,
)

QWEN_IMAGE = Family(
    name="qwen_image",
    workload="autofit.workloads.qwen_image",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "vae"),
    lora_sets={
        "attention": DIFFUSION_ATTENTION,
        "joint_attention": JOINT_ATTENTION,
        "all_linear": BLOCK_LINEAR,
    },
    feed_forward=FEED_FORWARD,
    # SimpleTuner's Qwen-Image transformer checkpoints block by block (should_checkpoint_block
    # in its qwen_image/transformer.py forward), Sana's grouping.
    checkpoint_groups="blocks",
    denoiser_class="QwenImageTransformer2DModel",
    config_template="qwen_image",
    trainers={
        "diffusers": DiffusersScripts(
            {
                # With --cache_latents and one --instance_prompt it encodes the prompt, caches
                # the latents and frees the text encoder and VAE before training; its validation
                # loads a pipeline without a text encoder, on embeddings computed beforehand.
                "lora": DiffusersScript("examples/dreambooth/train_dreambooth_lora_qwen_image.py", "dreambooth", True, ("cached",)),
            },
            lora_layers=True,
        ),
        "kohya": Refuse("sd-scripts has no Qwen-Image trainer (musubi-tuner trains it)"),
        # its model's DEFAULT_LORA_TARGET, and musubi block swap up to 59 blocks
        # (qwen_image/model.py max_swappable_blocks)
        "simpletuner": SimpleTunerModel("qwen_image", block_swap=True, lora_targets=DIFFUSION_ATTENTION),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": MUSUBI,
        "ai_toolkit": Refuse(AI_TOOLKIT_UNMATCHED.format(what="Qwen-Image (extensions_built_in/diffusion_models/qwen_image: its own quantization and layer offloading)")),
        "onetrainer": Refuse(ONETRAINER_UNMATCHED.format(what="Qwen-Image (model_type QWEN)")),
    },
)  # fmt: skip


QWEN_IMAGE_EDIT = replace(
    QWEN_IMAGE,
    name="qwen_image_edit",
    # A config.json of QwenImageTransformer2DModel cannot tell the edit model from Qwen-Image: it
    # builds a qwen_image model (QWEN_IMAGE's denoiser_class).
    denoiser_class=None,
    config_template=None,
    trainers={
        "diffusers": Refuse("the diffusers examples have no Qwen-Image-Edit training script (examples/ at 58eb52c0 train Qwen-Image from text alone)"),
        "kohya": Refuse("sd-scripts has no Qwen-Image trainer (musubi-tuner trains it)"),
        # SimpleTuner bc8e6ab7: helpers/models/qwen_image/model.py, flavour edit-v1 (the
        # preset's): the reference a conditioning dataset whose latents are cached and packed
        # after the target's (_model_predict_edit_v1), the prompt embedded with it by Qwen2.5-VL
        # and cached (conditioning_image_embeds).
        "simpletuner": SimpleTunerModel("qwen_image", block_swap=True, lora_targets=DIFFUSION_ATTENTION),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        # musubi-tuner 30c658c4: --model_version edit for both caches and the training
        # (qwen_image_utils.add_model_version_args); the dataset's control_directory holds the
        # references, resized to the target's bucket and cached as latents, and its text cache
        # embeds each prompt with its reference (at 384x384, CONDITION_IMAGE_RESOLUTION).
        "musubi": replace(MUSUBI, flags=("--model_version", "edit")),
        "ai_toolkit": Refuse(AI_TOOLKIT_UNMATCHED.format(what="Qwen-Image-Edit (extensions_built_in/diffusion_models/qwen_image: its own quantization and layer offloading)")),
        "onetrainer": Refuse("OneTrainer (23df3832) has no Qwen-Image-Edit model type"),
    },
)  # fmt: skip
