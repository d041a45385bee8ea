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

    `resolution` is the native square image side in pixels (for language models, `unit: tokens`,
    the sequence length); a resolution must be a multiple of `granularity`, the pixels one latent
    token covers (or `resolution_multiple` where the architecture needs more, as a UNet does).
    `buckets` is the aspect-ratio bucket set at the native resolution, as [height, width] pairs:
    a resolution is probed at its largest-area bucket (scaled to that resolution), where memory
    peaks; without buckets it is probed square.

    `companions` are the frozen models that run beside the trained one (text encoders, the VAE),
    each with a `kind` (its builder in autofit/workloads/companions.py), the `dtype` it runs in,
    and its architecture. `lora_targets` names the modules LoRA adapts; `blocks` is the
    attribute holding the transformer blocks, of which at most `max_swap_blocks` may be swapped
    to host memory. With two block lists, `blocks_per_swap` says how a swap count is shared, as
    sd-scripts shares Flux's: a swap of N moves N//2 units of the first list and N - N//2 of the
    second, a unit being `blocks_per_swap[i]` blocks of list i.
    """

    name: str
    family: str
    display: str
    resolution: int
    architecture: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict)
    companions: dict[str, dict[str, Any]] = field(default_factory=dict)
    lora_targets: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    max_swap_blocks: int = 0
    blocks_per_swap: list[int] = field(default_factory=list)
    unit: str = "pixels"
    buckets: list[list[int]] = field(default_factory=list)
    resolution_multiple: int | None = None
    published_params_b: float | None = None
    entry: str | None = None  # model=custom only: package.module:function
    notes: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelPreset:
        """A preset from its YAML; a companion given by name is `conf/companions/<name>.yaml`."""
        companions = {
            role: load_companion(spec) if isinstance(spec, str) else spec
            for role, spec in (data.get("companions") or {}).items()
        }
        return cls(**{**data, "companions": companions})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def swapped_per_list(self, swap: int) -> list[int]:
        """How many blocks of each of `blocks` a swap of `swap` keeps in host memory: the last
        ones of each list."""
        if len(self.blocks) <= 1:
            return [swap] * len(self.blocks)
        first, second = self.blocks_per_swap or [1, 1]
        return [first * (swap // 2), second * (swap - swap // 2)]

    @property
    def label(self) -> str:
        """The preset's name, and for model=custom the entry too (`custom-pkg.mod.fn`), so that
        two custom models get two default studies."""
        if self.entry:
            return f"{self.name}-{self.entry.replace(':', '.')}"
        return self.name

    def fingerprint(self) -> str:
        """A short hash of everything the preset says: equal presets build equal runs."""
        from autofit.fingerprint import fingerprint

        return fingerprint(self.to_dict())

    @property
    def granularity(self) -> int:
        if self.resolution_multiple:
            return self.resolution_multiple
        return int(self.inputs.get("latent_downsample", 1)) * int(
            self.architecture.get("patch_size", 1)
        )

    def shape(self, resolution: int) -> tuple[int, int]:
        """(height, width) a probe at `resolution` trains on: the largest-area bucket of the set,
        scaled from the native resolution and rounded down to the granularity."""
        if not self.buckets or self.unit != "pixels":
            return resolution, resolution
        step, scale = self.granularity, resolution / self.resolution

        def scaled(side: int) -> int:
            return max(step, int(side * scale) // step * step)

        shapes = [(scaled(h), scaled(w)) for h, w in self.buckets]
        return max(
            shapes, key=lambda hw: (hw[0] * hw[1], -abs(hw[0] - hw[1]))
        )  # ties: the squarest

    def units_per_sample(self, resolution: int) -> int:
        """Pixels (or tokens) one sample carries at `resolution`."""
        if self.unit == "tokens":
            return resolution
        height, width = self.shape(resolution)
        return height * width

    def check_resolution(self, resolution: int) -> None:
        if resolution % self.granularity:
            below = resolution // self.granularity * self.granularity
            hint = f"{below} or {below + self.granularity}" if below else str(self.granularity)
            raise ConfigError(
                f"resolution={resolution} is not valid for {self.name}: it must be a multiple of "
                f"{self.granularity} (try {hint})"
            )


def load_companion(name: str) -> dict[str, Any]:
    import yaml

    from autofit.paths import conf_dir, group_options

    path = conf_dir() / "companions" / f"{name}.yaml"
    if not path.exists():
        valid = group_options("companions")
        raise ConfigError(f"unknown companion '{name}'; valid: {', '.join(valid)}")
    return dict(yaml.safe_load(path.read_text()))


def load_preset(name: str) -> ModelPreset:
    """The shipped preset `conf/model/<name>.yaml`, read without composing a whole config."""
    import yaml

    from autofit.paths import conf_dir, group_options

    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown model '{name}'; valid: {', '.join(group_options('model'))}")
    return ModelPreset.from_dict(yaml.safe_load(path.read_text()))
