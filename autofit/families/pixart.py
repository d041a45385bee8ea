"""PixArt-Sigma: a cross-attention DiT (adaLN-single) over the SDXL VAE's latents, T5-XXL captions."""

from __future__ import annotations

from autofit.families.base import (
    AI_TOOLKIT_UNMATCHED,
    DIFFUSION_ATTENTION,
    MUSUBI_ONLY,
    ONETRAINER_UNMATCHED,
    Family,
    SimpleTunerModel,
)
from autofit.words import Refuse

PIXART_SIGMA = Family(
    name="pixart_sigma",
    workload="autofit.workloads.pixart",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "vae"),
    lora_sets={"attention": DIFFUSION_ATTENTION},
    # SimpleTuner's PixArt transformer runs N contiguous blocks under one checkpoint call
    # (checkpoint_sequential_state) when gradient_checkpointing_interval > 1
    # (helpers/models/pixart/transformer.py, bghira/SimpleTuner bc8e6ab).
    checkpoint_groups="segments",
    denoiser_class="PixArtTransformer2DModel",
    config_template="pixart_sigma_1024",
    trainers={
        # diffusers ships no PixArt training script among its examples; its research project
        # (examples/research_projects/pixart at 58eb52c0) trains a PixArt-alpha ControlNet.
        "diffusers": Refuse("the diffusers examples have no PixArt-Sigma training script"),
        "kohya": Refuse("sd-scripts has no PixArt trainer"),
        # --model_family takes the names of SimpleTuner's model_metadata.json (its model folders:
        # "pixart"); the model registers itself as pixart_sigma, the name its quickstart
        # (documentation/quickstart/SIGMA.md) uses, only once its module is imported, after the
        # parser's choices are made (helpers/models/registry.py, bghira/SimpleTuner bc8e6ab).
        # Its check_user_config raises for fp8-quanto; its LoRA adapts DEFAULT_LORA_TARGET.
        "simpletuner": SimpleTunerModel(
            "pixart", lora_targets=DIFFUSION_ATTENTION, refused_bases=("fp8-quanto",)
        ),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        "ai_toolkit": Refuse(AI_TOOLKIT_UNMATCHED.format(what="PixArt-Sigma (arch pixart_sigma)")),
        "onetrainer": Refuse(
            ONETRAINER_UNMATCHED.format(what="PixArt-Sigma (model_type PIXART_SIGMA)")
        ),
    },
)
