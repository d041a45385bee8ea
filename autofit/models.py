"""Model presets (`conf/model/<name>.yaml`): an architecture with random weights, and its inputs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autofit.errors import ConfigError


@dataclass(frozen=True)
class ModelPreset:
    """What a probe trains. `family` picks the builder in `autofit/workloads/` (a plain dict, never
    an import path); `architecture` is passed to the model class as is; `inputs` holds the
    family's input shapes (latent channels and downsampling, text tokens and width, ...).

    `resolution` is the native square image side in pixels; a resolution must be a multiple of
    `granularity`, the pixels one latent token covers.

    `companions` are the frozen models that run beside the trained one (text encoders, the VAE),
    each with a `kind` (its builder in autofit/workloads/companions.py), the `dtype` it runs in,
    and its architecture. `lora_targets` names the modules LoRA adapts; `blocks` is the
    attribute holding the transformer blocks, of which at most `max_swap_blocks` may be swapped
    to host memory.
    """

    name: str
    family: str
    display: str
    resolution: int
    architecture: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict)
    companions: dict[str, dict[str, Any]] = field(default_factory=dict)
    lora_targets: list[str] = field(default_factory=list)
    blocks: str | None = None
    max_swap_blocks: int = 0
    published_params_b: float | None = None
    notes: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelPreset:
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def granularity(self) -> int:
        return int(self.inputs.get("latent_downsample", 1)) * int(
            self.architecture.get("patch_size", 1)
        )

    def check_resolution(self, resolution: int) -> None:
        if resolution % self.granularity:
            below = resolution // self.granularity * self.granularity
            hint = f"{below} or {below + self.granularity}" if below else str(self.granularity)
            raise ConfigError(
                f"resolution={resolution} is not valid for {self.name}: it must be a multiple of "
                f"{self.granularity} (try {hint})"
            )


def load_preset(name: str) -> ModelPreset:
    """The shipped preset `conf/model/<name>.yaml`, read without composing a whole config."""
    import yaml

    from autofit.paths import conf_dir, group_options

    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown model '{name}'; valid: {', '.join(group_options('model'))}")
    return ModelPreset.from_dict(yaml.safe_load(path.read_text()))
