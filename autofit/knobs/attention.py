"""attention: which scaled-dot-product-attention kernel runs.

- `sdpa`: PyTorch picks a fused kernel (flash or memory-efficient on a GPU; the CPU flash kernel
  on the CPU backends), which keeps the output and a log-sum-exp per query, never the matrix.
- `math`: the unfused path, which materialises the full attention matrix (and keeps it for
  backward): what a model falls back to when no fused kernel supports its inputs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.families import kohya
from autofit.knobs.base import Knob, Refuse, Say, Subject, say

if TYPE_CHECKING:
    from autofit.run_state import RunState


def _kohya(value: Any, s: Subject) -> Say:
    if value == "sdpa":
        return say(sdpa=True)
    scripts = kohya(s.family)
    if scripts is not None and not scripts.always_fused_attention:
        return Say()  # SDXL without sdpa/xformers runs its plain attention: the math path
    return Say(
        warning=f"sd-scripts' {s.family} model always runs torch's fused attention, which holds "
        "less than the measured math path"
    )


class Attention(Knob):
    name = "attention"
    decided_by_trainer = True
    default = "sdpa"
    help = "attention kernel: sdpa (fused) | math (full attention matrix)"
    values = {
        "sdpa": "torch's fused scaled_dot_product_attention",
        "math": "the unfused attention path (the full attention matrix)",
    }
    reach = "pass"  # which kernel the forward runs

    def forward_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        if value != "math":
            return None
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)

    trainers = {
        # diffusers' processors call torch's scaled_dot_product_attention: the fused kernels.
        "simpletuner": {
            "sdpa": say(attention_mechanism="diffusers"),
            "math": say(attention_mechanism="native-math"),
        },
        "kohya": _kohya,
        "sana": {
            "sdpa": Say(),
            "math": Say(
                warning="Sana's attention runs its own kernels (linear self-attention, fused "
                "cross-attention), which hold less than the measured math path"
            ),
        },
        "diffusers": {
            "sdpa": Say(),
            "math": Say(
                warning="the script runs diffusers' default attention processor (torch's fused "
                "SDPA), which holds less than the measured math path"
            ),
        },
        # transformers' own attention under the name TRL's ModelConfig passes on.
        "trl": {
            "sdpa": say(attn_implementation="sdpa"),
            "math": Refuse(
                "TRL's unfused choice is transformers' eager attention, whose softmax runs in "
                "fp32 (another run than torch's math kernel)"
            ),
        },
        # axolotl's attn_implementation, passed to transformers as its own name.
        "axolotl": {
            "sdpa": say(attn_implementation="sdpa"),
            "math": Refuse(
                "axolotl's unfused choice is transformers' eager attention, whose softmax runs "
                "in fp32 (another run than torch's math kernel)"
            ),
        },
        # torchtune 0.6.1's MultiHeadAttention calls torch's scaled_dot_product_attention (flex
        # attention for packed rows): modules/attention_utils.py _sdpa_or_flex_attention.
        "torchtune": {
            "sdpa": Say(),
            "math": Refuse("torchtune's attention is torch's scaled_dot_product_attention always"),
        },
        # litgpt 0.5.13's CausalSelfAttention calls torch's scaled_dot_product_attention
        # (model.py) for every model autofit exports to it (no logit soft-capping).
        "litgpt": {
            "sdpa": Say(),
            "math": Refuse(
                "LitGPT runs torch's scaled_dot_product_attention; it has no setting for it"
            ),
        },
        # LLaMA-Factory's flash_attn (model/model_utils/attention.py): sdpa, fa2, or disabled,
        # which is transformers' eager attention.
        "llamafactory": {
            "sdpa": say(flash_attn="sdpa"),
            "math": Refuse(
                "LLaMA-Factory's unfused choice (flash_attn: disabled) is transformers' eager "
                "attention, whose softmax runs in fp32 (another run than torch's math kernel)"
            ),
        },
        # musubi-tuner asks for one of its kernels (--sdpa, --flash_attn, --xformers, ...): none
        # is the unfused path.
        "musubi": {
            "sdpa": say(**{"--sdpa": True}),
            "math": Say(
                settings={"--sdpa": True},
                warning="musubi-tuner has no unfused attention: --sdpa runs torch's fused kernels, "
                "which hold less than the measured math path",
            ),
        },
        # OneTrainer's SDP is torch's scaled_dot_product_attention (its fused kernels); its other
        # mechanisms (flash, cuDNN, flex) are kernels too, none the math path
        "onetrainer": {
            "sdpa": say(attention_mechanism="SDP"),
            "math": Refuse("OneTrainer's attention_mechanism names fused kernels only"),
        },
    }
