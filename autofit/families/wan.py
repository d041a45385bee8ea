"""Wan (Wan-AI): a video DiT over the Wan VAE's causal 3-D latents, conditioned on umT5-XXL.

Wan 2.1's text-to-video models (1.3B and 14B) and each of Wan 2.2's two 14B experts, which the
video trainers train one at a time: every block is self-attention over the clip's latent tokens,
cross-attention to the prompt, and a feed-forward, modulated by the timestep.
"""

from __future__ import annotations

from autofit.families.base import DIFFUSION_ATTENTION, TRL_LANGUAGE_MODELS, Family
from autofit.words import Refuse

# A Wan block's self- and cross-attention projections and its feed-forward (musubi-tuner's LoRA
# adapts every linear layer of the blocks).
WAN_BLOCK_LINEAR = DIFFUSION_ATTENTION + ("ffn.net.0.proj", "ffn.net.2")

WAN = Family(
    name="wan",
    workload="autofit.workloads.wan",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "vae"),
    lora_sets={"attention": DIFFUSION_ATTENTION, "all_linear": WAN_BLOCK_LINEAR},
    feed_forward=("ffn.net.0.proj", "ffn.net.2"),
    video=True,
    denoiser_class="WanTransformer3DModel",
    config_template="wan2_1_t2v_1_3b",
    trainers={
        "diffusers": Refuse("the diffusers examples have no Wan training script"),
        "kohya": Refuse("sd-scripts trains image models; kohya's video trainer is musubi-tuner"),
        "simpletuner": Refuse("autofit does not export Wan to SimpleTuner yet"),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "trl": Refuse(TRL_LANGUAGE_MODELS),
    },
)
