"""FLUX.1: double- and single-stream transformer blocks over 16-channel latents, with CLIP-L and
T5-XXL; and Chroma and FLUX.1 Kontext, the families declared from it.

Chroma (lodestones/Chroma1) is FLUX.1 [schnell]'s architecture with its per-block modulation
replaced by one small network (diffusers' `ChromaTransformer2DModel`, its "distilled guidance
layer") and its CLIP-L dropped: T5-XXL alone, with its attention mask. It is a family of its own
because each trainer runs it apart from FLUX.1 (SimpleTuner's `chroma` model family, sd-scripts'
`--model_type chroma`, no diffusers example), with its own documented settings; what it shares
with FLUX.1 (its blocks, their LoRA sets and checkpointing, sd-scripts' block swap) it takes from
FLUX's declaration (`dataclasses.replace`).

FLUX.1 Kontext [dev] is FLUX.1 [dev]'s model (the same config, guidance embedding included)
trained on pairs, a reference image's tokens beside the target's (autofit/workloads/flux.py).
It is a family of its own because its trainers run it apart: the diffusers Kontext script,
musubi-tuner's flux_kontext scripts, SimpleTuner's `kontext` flavour with a conditioning
dataset, each with its own dataset layout; sd-scripts has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from autofit.families.base import (
    AI_TOOLKIT_UNMATCHED,
    DIFFUSION_ATTENTION,
    JOINT_ATTENTION,
    JOINT_BLOCK_LINEAR,
    MUSUBI_ONLY,
    AiToolkitModel,
    DiffusersScript,
    DiffusersScripts,
    Family,
    KohyaScripts,
    MusubiScripts,
    OneTrainerModel,
    SimpleTunerModel,
)
from autofit.words import Refuse


def kohya_blocks_to_swap(architecture: Mapping[str, Any]) -> int:
    """A swap of N blocks moves N//2 double blocks and 2*(N - N//2) single blocks, each at most
    its count less two."""
    double = int(architecture.get("num_layers", 19))
    single = int(architecture.get("num_single_layers", 38))
    allowed = [
        n for n in range(double + single) if n // 2 <= double - 2 and (n - n // 2) * 2 <= single - 2
    ]
    return max(allowed)


FLUX = Family(
    name="flux",
    workload="autofit.workloads.flux",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "text_encoder_2", "vae"),
    # all_linear adds the single-stream blocks' own (their modulation, MLP input and output; the
    # suffix proj_out also takes the model's final projection, one small layer)
    lora_sets={
        "attention": DIFFUSION_ATTENTION, "joint_attention": JOINT_ATTENTION,
        "all_linear": JOINT_BLOCK_LINEAR + ("norm.linear", "proj_mlp", "proj_out"),
        # sd-scripts' train_blocks=single: its single blocks' linear1 (q, k, v and the MLP's
        # input fused), linear2 and modulation, as diffusers' modules
        "single_blocks": r"single_transformer_blocks\.\d+\.(attn\.to_[qkv]|proj_mlp|proj_out|norm\.linear)",
    },  # fmt: skip
    checkpoint_groups="segments",
    attention_modules=("attn",),
    denoiser_class="FluxTransformer2DModel",
    config_template="flux_dev",
    trainers={
        "diffusers": DiffusersScripts(
            {
                "full": DiffusersScript("examples/dreambooth/train_dreambooth_flux.py", "dreambooth", False, ("online",)),
                # With --cache_latents and one instance prompt this script still holds both text
                # encoders on the GPU through training: its list `text_encoders` keeps them alive
                # after it deletes their names (diffusers 2024-12 to 2026-08). Its memory is
                # encoders=online's. Its validation (after epoch 0, then every
                # --validation_epochs) loads a second pair of text encoders while that list holds
                # the first, and renders at FluxPipeline's default 1024 px (the commit before
                # diffusers issue #10145, 2024-12, through 2026-08).
                "lora": DiffusersScript("examples/dreambooth/train_dreambooth_lora_flux.py", "dreambooth", True, ("online",),
                                        not_cached="keeps both text encoders on the GPU through training, even with cached latents and one prompt",
                                        validation_reloads="loads a second pair of text encoders for each validation while its training list still holds the first"),
            },
            lora_layers=True,
        ),
        "kohya": KohyaScripts(
            "flux_train.py", "flux_train_network.py", "networks.lora_flux",
            files={"clip_l": "clip_l.safetensors", "t5xxl": "t5xxl_fp16.safetensors", "ae": "ae.safetensors"},
            max_blocks_to_swap=kohya_blocks_to_swap,
        ),
        "simpletuner": SimpleTunerModel("flux", block_swap=True, lora_targets=JOINT_ATTENTION),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        # ai-toolkit 27a03a91: toolkit/stable_diffusion_model.py loads diffusers'
        # FluxTransformer2DModel for arch flux; its LoRA adapts every linear of the blocks.
        "ai_toolkit": AiToolkitModel("flux"),
        # OneTrainer 23df3832: FLUX_DEV_1 loads diffusers' FluxTransformer2DModel
        # (modules/model/FluxModel.py); its parts are transformer, text_encoder (CLIP-L),
        # text_encoder_2 (T5-XXL) and vae.
        "onetrainer": OneTrainerModel("FLUX_DEV_1"),
    },
)  # fmt: skip


# Chroma's blocks have no modulation of their own (their norms are diffusers' "pruned" ones, fed
# by the distilled guidance layer), so its sets hold FLUX.1's less the modulation linears.
CHROMA_BLOCK_LINEAR = tuple(m for m in JOINT_BLOCK_LINEAR if not m.startswith("norm1"))

CHROMA = replace(
    FLUX,
    name="chroma",
    workload="autofit.workloads.chroma",
    companions=("text_encoder", "vae"),  # ChromaPipeline's: T5-XXL and FLUX.1's VAE, no CLIP
    lora_sets={
        "attention": DIFFUSION_ATTENTION, "joint_attention": JOINT_ATTENTION,
        "all_linear": CHROMA_BLOCK_LINEAR + ("proj_mlp", "proj_out"),
        "single_blocks": r"single_transformer_blocks\.\d+\.(attn\.to_[qkv]|proj_mlp|proj_out)",
    },
    denoiser_class="ChromaTransformer2DModel",
    config_template="chroma",
    trainers={
        "diffusers": Refuse(
            "the diffusers examples have no Chroma training script (examples/ at 58eb52c0 train "
            "FLUX.1, FLUX.1 Kontext and FLUX.2)"
        ),
        # sd-scripts at 48d368fa: flux_train_network.py builds library/chroma_models.py's Chroma
        # for --model_type chroma, asserts --apply_t5_attn_mask for it and loads no CLIP-L; its
        # block swap is FLUX.1's (Chroma subclasses Flux, same block counts). flux_train.py loads
        # its model with model_type="flux" whatever is asked: no full fine-tune.
        "kohya": KohyaScripts(
            None, "flux_train_network.py", "networks.lora_flux",
            files={"t5xxl": "t5xxl_fp16.safetensors", "ae": "ae.safetensors"},
            max_blocks_to_swap=kohya_blocks_to_swap,
            flags={"model_type": "chroma", "apply_t5_attn_mask": True},
        ),
        # SimpleTuner at bc8e6ab7: helpers/models/chroma/model.py, its flavours base, hd, flash;
        # LoRA on flux_lora_target's default `all` (the field registry's default, for every
        # family), of which Chroma has both streams' attention projections.
        "simpletuner": SimpleTunerModel("chroma", block_swap=True, lora_targets=JOINT_ATTENTION),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        # ai-toolkit 27a03a91 (extensions_built_in/diffusion_models/chroma/): its own Chroma in
        # the original layout (src/model.py), whose blocks fuse q, k and v (and a single block's
        # MLP input) into one linear; its LoRA adapts every linear of the blocks.
        "ai_toolkit": AiToolkitModel(
            "chroma",
            lora_differs="ai-toolkit's Chroma fuses each block's q, k and v projections into one "
            "linear (its original layout), so its LoRA has fewer, wider adapters on the same "
            "inputs: fewer parameters and no more saved inputs than measured",
        ),
        # OneTrainer 23df3832: CHROMA_1 loads diffusers' ChromaTransformer2DModel
        # (modules/model/ChromaModel.py); its parts are transformer, text_encoder (T5-XXL), vae.
        "onetrainer": OneTrainerModel("CHROMA_1"),
    },
)  # fmt: skip


def musubi_kontext_blocks_to_swap(architecture: Mapping[str, Any]) -> int:
    """musubi-tuner swaps N//2 double blocks and (N - N//2) * 2 + 1 single ones, each at most its
    count less two (flux/flux_models.py Flux.enable_block_swap, kohya-ss/musubi-tuner 30c658c4)."""
    double = int(architecture["num_layers"])
    single = int(architecture["num_single_layers"])
    allowed = [
        n for n in range(double + single)
        if n // 2 <= double - 2 and (n - n // 2) * 2 + 1 <= single - 2
    ]  # fmt: skip
    return max(allowed)


FLUX_KONTEXT = replace(
    FLUX,
    name="flux_kontext",
    # A config.json of FluxTransformer2DModel cannot tell Kontext from FLUX.1 [dev]: it builds a
    # flux model (FLUX's denoiser_class).
    denoiser_class=None,
    config_template=None,
    trainers={
        # diffusers 58eb52c0 (examples/dreambooth/train_dreambooth_lora_flux_kontext.py at
        # 2919c509): its --cond_image_column (with --dataset_name, --image_column and
        # --caption_column, asserted) gives each target its reference, resized and cropped to the
        # target's bucket (paired_transform); it precomputes the captions' embeddings and moves
        # the text encoders off the GPU when no --validation_prompt is given, and with
        # --cache_latents encodes both images' latents before training and frees the VAE.
        "diffusers": DiffusersScripts(
            {
                "lora": DiffusersScript("examples/dreambooth/train_dreambooth_lora_flux_kontext.py", "dreambooth", True, ("cached",),
                                        not_cached="precomputes the captions' embeddings and frees the text encoders; only its latents can be encoded every step"),
            },
            lora_layers=True,
        ),
        "kohya": Refuse("sd-scripts (48d368fa) has no FLUX.1 Kontext trainer; musubi-tuner's flux_kontext_train_network.py trains it"),
        # SimpleTuner bc8e6ab7: helpers/models/flux/model.py, flavour kontext (the preset's); the
        # reference is a conditioning dataset of the edit dataset's (conditioning_data), its
        # latents cached and packed after the target's (build_kontext_inputs).
        "simpletuner": SimpleTunerModel("flux", block_swap=True, lora_targets=JOINT_ATTENTION),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        # musubi-tuner 30c658c4: its own Kontext scripts; the dataset's control_directory holds
        # the references, resized to the target's bucket (dataset/image_video_dataset.py) and
        # cached with its latents (flux_kontext_cache_latents.py).
        "musubi": MusubiScripts(
            script="src/musubi_tuner/flux_kontext_train_network.py",
            network="networks.lora_flux",
            cache_latents="src/musubi_tuner/flux_kontext_cache_latents.py",
            cache_text="src/musubi_tuner/flux_kontext_cache_text_encoder_outputs.py",
            # docs/flux_kontext.md's files: BFL's DiT and AE, ComfyUI's text encoders
            latent_files={"--vae": "ae.safetensors"},
            text_files={"--text_encoder1": "t5xxl_fp16.safetensors", "--text_encoder2": "clip_l.safetensors"},
            max_blocks_to_swap=musubi_kontext_blocks_to_swap,
            # networks/lora_flux.py: the double and single blocks' linears less their modulation
            # and norms, in BFL's layout (q, k and v fused, a single block's MLP input with them)
            lora_differs=(
                "musubi-tuner's LoRA adapts the blocks' linears without their modulation, with q, "
                "k, v (and the single-stream MLP input) fused in one linear each as BFL's model "
                "has them: fewer adapter weights and saved inputs than the measured all_linear"
            ),
            swap_differs=(
                "musubi-tuner's --blocks_to_swap N swaps N//2 double-stream and (N - N//2) * 2 + 1 "
                "single-stream blocks, one single-stream block more than measured: a little less "
                "GPU memory, one block more to move each step"
            ),
        ),
        # ai-toolkit 27a03a91 (extensions_built_in/diffusion_models/flux_kontext): its
        # condition_noisy_latents VAE-encodes each control image every step, cached latents or not.
        "ai_toolkit": Refuse(AI_TOOLKIT_UNMATCHED.format(what="flux_kontext, which VAE-encodes each control image every step even with cached latents,")),
        "onetrainer": Refuse("OneTrainer (23df3832) has no FLUX.1 Kontext model type"),
    },
)  # fmt: skip
