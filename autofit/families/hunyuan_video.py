"""HunyuanVideo (Tencent): a video DiT of dual- and single-stream blocks over its causal 3-D VAE's
latents, conditioned on LLaVA-Llama-3's prompt embedding and CLIP-L's pooled one.

The 13B text-to-video model: 20 dual-stream blocks (the clip's and the prompt's tokens each with
their own projections, attending jointly) and then 40 single-stream blocks over both together, as
Flux's, with a small token refiner over the prompt before them.
"""

from __future__ import annotations

from autofit.families.base import (
    DIFFUSION_ATTENTION,
    JOINT_ATTENTION,
    KOHYA_VIDEO,
    ONETRAINER_UNMATCHED,
    Family,
    MusubiScripts,
)
from autofit.words import Refuse

# musubi-tuner's LoRA adapts every linear layer of the two block lists (its target modules are
# the dual- and single-stream block classes) and none of the token refiner's or the embedders':
# a pattern over full names, since the suffixes alone (to_q, ff.net.2, proj_out) also name the
# refiner's layers and the model's final projection.
BLOCK_LINEAR = (
    r"(single_)?transformer_blocks\.\d+\."
    r"(attn\.(to_[qkv]|to_out\.0|add_[qkv]_proj|to_add_out)|ff(_context)?\.net\.(0\.proj|2)"
    r"|norm1(_context)?\.linear|norm\.linear|proj_mlp|proj_out)"
)

MUSUBI = MusubiScripts(
    script="src/musubi_tuner/hv_train_network.py",
    network="networks.lora",
    cache_latents="src/musubi_tuner/cache_latents.py",
    cache_text="src/musubi_tuner/cache_text_encoder_outputs.py",
    latent_files={"--vae": "hunyuan-video-t2v-720p/vae/pytorch_model.pt"},
    text_files={"--text_encoder1": "text_encoder", "--text_encoder2": "text_encoder_2"},
    # hunyuan_model/models.py enable_block_swap; docs/hunyuan_video.md: "Maximum value is 36"
    max_blocks_to_swap=lambda architecture: 36,
    swap_differs=(
        "musubi-tuner's --blocks_to_swap N swaps N//2 dual-stream and (N - N//2) * 2 + 1 "
        "single-stream blocks, one single-stream block more than measured: a little less GPU "
        "memory, one block more to move each step"
    ),
    # networks/lora.py: its modules are the dual- and single-stream blocks' linears, less their
    # modulation (img_mod, txt_mod, modulation), with q, k and v (and a single-stream block's MLP
    # input) fused in one linear each, as Tencent's model has them
    lora_differs=(
        "musubi-tuner's LoRA adapts the blocks' linears without their modulation, with q, k, v "
        "(and the single-stream MLP input) fused in one linear each as Tencent's model has them: "
        "fewer adapter weights and saved inputs than the measured all_linear"
    ),
)

HUNYUAN_VIDEO = Family(
    name="hunyuan_video",
    workload="autofit.workloads.hunyuan_video",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "text_encoder_2", "vae"),
    # attention: the image stream's projections (and the single blocks' and refiner's, which
    # share their names), the diffusers LoRA's to_q, to_k, to_v, to_out.0; joint_attention adds
    # the prompt stream's of the dual-stream blocks (the preset's list).
    lora_sets={
        "attention": DIFFUSION_ATTENTION,
        "joint_attention": JOINT_ATTENTION,
        "all_linear": BLOCK_LINEAR,
    },
    # No feed_forward: its dense projections are inside all_linear's pattern, and it has no
    # experts for them to be told from. No checkpoint_groups: its trainers (musubi-tuner, the
    # diffusers-based finetrainers) checkpoint every block and none offers an interval.
    video=True,
    denoiser_class="HunyuanVideoTransformer3DModel",
    config_template="hunyuan_video",
    trainers={
        "diffusers": Refuse("the diffusers examples have no HunyuanVideo training script"),
        "kohya": Refuse(KOHYA_VIDEO),
        "simpletuner": Refuse("autofit does not export HunyuanVideo to SimpleTuner"),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": MUSUBI,
        "ai_toolkit": Refuse("ai-toolkit has no HunyuanVideo model"),
        "onetrainer": Refuse(
            ONETRAINER_UNMATCHED.format(what="HunyuanVideo (model_type HUNYUAN_VIDEO)")
        ),
    },
)
