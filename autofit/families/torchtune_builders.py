"""torchtune's model builders, by the architecture each builds (torchtune 0.6.1).

torchtune trains its own model classes (`TransformerDecoder`), each made by a builder function of
`torchtune.models.<module>`: `<name>` for a full fine-tune, `lora_<name>` for LoRA and DoRA
(`use_dora`). A preset is trained by the builder whose architecture is its own, figure for figure
(the transformers config autofit builds the preset from); a preset of no builder's architecture
has none (Mistral 7B v0.2, whose RoPE base is 1e6 where torchtune's `mistral_7b` builds v0.1's
1e4; Yi; Qwen3's mixture of experts, which torchtune 0.6.1 has no builder for).

The figures are torchtune 0.6.1's, read from torchtune/models/*/_model_builders.py and the
component builders' defaults (Llama 2's RoPE base 10,000 and its scaled feed-forward width).
Qwen2.5's presets are the base models: the `_base` builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autofit.models import ModelPreset


@dataclass(frozen=True)
class Builder:
    """One torchtune model builder and the architecture it builds, in transformers' config
    words (what a preset's `architecture.config` holds)."""

    module: str  # torchtune.models.<module>
    name: str  # the full fine-tune's builder; LoRA's is lora_<name>
    kind: str  # the preset's architecture.kind
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rope_theta: float
    tie_word_embeddings: bool = False

    def component(self, adapters: bool) -> str:
        """The `_component_` of the model: its full builder, or its LoRA builder."""
        return f"torchtune.models.{self.module}.{'lora_' if adapters else ''}{self.name}"

    def builds(self, kind: str, config: dict[str, Any]) -> bool:
        if kind != self.kind:
            return False
        figures = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "rope_theta": self.rope_theta,
        }
        if any(config.get(key) != value for key, value in figures.items()):
            return False
        return bool(config.get("tie_word_embeddings", False)) == self.tie_word_embeddings


BUILDERS = (
    Builder("llama2", "llama2_7b", "llama", 32000, 4096, 11008, 32, 32, 32, 10000.0),
    Builder("llama2", "llama2_13b", "llama", 32000, 5120, 13824, 40, 40, 40, 10000.0),
    Builder("llama2", "llama2_70b", "llama", 32000, 8192, 28672, 80, 64, 8, 10000.0),
    # Llama 3 and 3.1 share their shapes; 3.1 scales its RoPE for long contexts (scale_factor 8),
    # which only Llama 3.1's weights were trained with: the preset's published weights decide.
    Builder("llama3", "llama3_8b", "llama", 128256, 4096, 14336, 32, 32, 8, 500000.0),
    Builder("llama3", "llama3_70b", "llama", 128256, 8192, 28672, 80, 64, 8, 500000.0),
    Builder("llama3_1", "llama3_1_8b", "llama", 128256, 4096, 14336, 32, 32, 8, 500000.0),
    Builder("llama3_1", "llama3_1_70b", "llama", 128256, 8192, 28672, 80, 64, 8, 500000.0),
    Builder("llama3_2", "llama3_2_1b", "llama", 128256, 2048, 8192, 16, 32, 8, 500000.0, True),
    Builder("llama3_2", "llama3_2_3b", "llama", 128256, 3072, 8192, 28, 24, 8, 500000.0, True),
    Builder("mistral", "mistral_7b", "llama", 32000, 4096, 14336, 32, 32, 8, 10000.0),
    Builder("qwen2_5", "qwen2_5_0_5b", "qwen2", 151936, 896, 4864, 24, 14, 2, 1e6, True),
    Builder("qwen2_5", "qwen2_5_1_5b_base", "qwen2", 151936, 1536, 8960, 28, 12, 2, 1e6, True),
    Builder("qwen2_5", "qwen2_5_3b", "qwen2", 151936, 2048, 11008, 36, 16, 2, 1e6, True),
    Builder("qwen2_5", "qwen2_5_7b_base", "qwen2", 152064, 3584, 18944, 28, 28, 4, 1e6),
    Builder("qwen2_5", "qwen2_5_14b_base", "qwen2", 152064, 5120, 13824, 48, 40, 8, 1e6),
    Builder("qwen2_5", "qwen2_5_32b_base", "qwen2", 152064, 5120, 27648, 64, 40, 8, 1e6),
    Builder("qwen2_5", "qwen2_5_72b_base", "qwen2", 152064, 8192, 29568, 80, 64, 8, 1e6),
)


def builder_for(preset: ModelPreset) -> Builder | None:
    """The builder of the preset's architecture; of Llama 3 and 3.1's shared shapes the one its
    published weights name (3.1's RoPE scaling); None where torchtune has none."""
    architecture = preset.architecture
    kind, config = architecture.get("kind", ""), architecture.get("config", {})
    found = [b for b in BUILDERS if b.builds(kind, config)]
    if len(found) > 1:
        llama3_1 = "3.1" in (preset.weights or "") or "3_1" in preset.name
        found = [b for b in found if (b.module == "llama3_1") == llama3_1]
    return found[0] if found else None


def builder_names() -> str:
    """The architectures torchtune builds, for a refusal."""
    return ", ".join(b.name for b in BUILDERS)
