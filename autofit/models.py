"""Model presets (`conf/model/<name>.yaml`): an architecture with random weights, and its inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from autofit.errors import ConfigError, shown
from autofit.fingerprint import fingerprint
from autofit.paths import NAME, conf_dir, group_options
from autofit.yaml_files import read_yaml


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
    # Where the trainers find this model, not what a probe trains (a preset's fingerprint and the
    # spec a probe gets leave them out): the published weights autofit's random ones take the
    # shape of, and per export target the names it has for the preset (SimpleTuner's
    # model_flavour, the shipped Sana config); the family declares the rest (autofit/families/).
    weights: str | None = None
    trainers: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> ModelPreset:
        """A preset from its YAML, every field checked; a companion given by name is
        `conf/companions/<name>.yaml`. A ConfigError names `source` (the file the preset came
        from) and the field; without a source (a composed config) a field is named as its
        override is written: `model.architecture.num_layers`."""
        where = source or "model"
        if not isinstance(data, dict):
            kind = "nothing (an empty file)" if data is None else type(data).__name__
            raise ConfigError(
                f"{where}: expected a mapping of preset fields, got {kind}; fields: "
                f"{', '.join(FIELDS)}"
            )
        for key in data:
            if key not in FIELDS:
                raise ConfigError(
                    f"{where}: unknown field {shown(key)}; valid fields: {', '.join(FIELDS)}"
                )
        missing = [key for key in REQUIRED if key not in data]
        if missing:
            raise ConfigError(
                f"{where}: missing field '{missing[0]}'; every preset sets {', '.join(REQUIRED)}"
            )
        for key, value in data.items():
            test, expected = _RULES[key]
            if not test(value):
                raise ConfigError(
                    f"{_named(source, key)}={shown(value)} is not valid; expected {expected}"
                )
        _check_sizes(data["architecture"], source, "architecture")
        _check_sizes(data.get("inputs") or {}, source, "inputs")
        _check_swaps(data, source)
        companions = {
            role: load_companion(spec)
            if isinstance(spec, str)
            else _checked_companion(spec, source, f"companions.{role}")
            for role, spec in (data.get("companions") or {}).items()
        }
        return cls(**{**data, "companions": companions})

    def to_dict(self) -> dict[str, Any]:
        """What a probe trains: every field but where the trainers find the model."""
        return {k: v for k, v in asdict(self).items() if k not in PUBLISHED}

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


FIELDS = [f.name for f in fields(ModelPreset)]
REQUIRED = [
    f.name for f in fields(ModelPreset) if f.default is MISSING and f.default_factory is MISSING
]


def _named(source: str | None, path: str) -> str:
    """A field as an error names it: `<file>: architecture.num_layers` in a file (the file alone
    for its root, path ""), `model.architecture.num_layers` (its override) in a composed
    config."""
    if source is None:
        return f"model.{path}"
    return f"{source}: {path}" if path else source


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# Each field's check and the words saying what it may be.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (lambda v: isinstance(v, str) and bool(NAME.match(v)),
             "letters, digits, '_', '.' and '-' (it names studies and result files)"),
    # Which families there are is autofit/workloads/' to say: autofit/config.py asks it.
    "family": (lambda v: isinstance(v, str), "the name of a model family, e.g. sana"),
    "display": (lambda v: isinstance(v, str), "text"),
    "resolution": (lambda v: _whole(v, 1),
                   "a whole number >= 1: the native image side in pixels, or tokens"),
    "architecture": (lambda v: isinstance(v, dict), "a mapping of the model's arguments"),
    "inputs": (lambda v: isinstance(v, dict), "a mapping of the inputs' sizes"),
    "companions": (lambda v: isinstance(v, dict),
                   "a mapping of role to a companion: its name in conf/companions/, or its "
                   "kind, dtype and architecture"),
    "lora_targets": (_texts, "a list of module names"),
    "blocks": (_texts, "a list of attribute names, e.g. [transformer_blocks]"),
    "max_swap_blocks": (lambda v: _whole(v, 0), "a whole number >= 0"),
    "blocks_per_swap": (lambda v: isinstance(v, list) and all(_whole(n, 1) for n in v),
                        "a list of whole numbers >= 1"),
    "unit": (lambda v: v in ("pixels", "tokens"), "pixels or tokens"),
    "buckets": (lambda v: isinstance(v, list) and all(
                    isinstance(b, list) and len(b) == 2 and all(_whole(n, 1) for n in b)
                    for b in v),
                "a list of [height, width] pairs of whole numbers >= 1"),
    "resolution_multiple": (lambda v: v is None or _whole(v, 1), "a whole number >= 1, or null"),
    "published_params_b": (lambda v: v is None or (isinstance(v, int | float)
                                                   and not isinstance(v, bool) and v > 0),
                           "billions of parameters > 0, or null"),
    "entry": (lambda v: v is None or isinstance(v, str), "package.module:function, or null"),
    "notes": (lambda v: isinstance(v, str), "text"),
    "weights": (lambda v: v is None or isinstance(v, str), "a hub id or path, or null"),
    "trainers": (lambda v: isinstance(v, dict) and all(
                     isinstance(names, dict) and all(isinstance(n, str) for n in names.values())
                     for names in v.values()),
                 "a mapping of export target to its names for the preset, e.g. "
                 "{simpletuner: {model_flavour: dev}}"),
}  # fmt: skip
PUBLISHED = ("weights", "trainers")  # where the trainers find the model (ModelPreset.to_dict)

# An architecture's sizes (and its inputs'), as diffusers and transformers name them: counts
# (num_layers, num_attention_heads, ...) and widths (hidden_size, attention_head_dim,
# in_channels, ...), one per level where a list (block_out_channels). Each is a whole number
# >= 1. Lists of layer indices (dual_attention_layers, mlp_only_layers) are no sizes.
SIZE_PREFIXES = ("num_",)
SIZE_SUFFIXES = (
    "_dim", "_size", "_channels", "_features", "_heads", "_per_block", "_tokens", "_downsample",
)  # fmt: skip
MAY_BE_ZERO = ("extra_conditioning_channels",)  # an SD3 ControlNet's: none by default


def is_size(key: str) -> bool:
    """Whether an architecture or input field is a size (a count or width the checks hold to)."""
    return key.startswith(SIZE_PREFIXES) or key.endswith(SIZE_SUFFIXES)


def _check_sizes(section: dict[str, Any], source: str | None, path: str) -> None:
    """Every size in `section` and the mappings under it a whole number >= 1 (a list of them,
    one per level), or a ConfigError naming it."""
    for key, value in section.items():
        where = f"{path}.{key}"
        if isinstance(value, dict):
            _check_sizes(value, source, where)
            continue
        if not isinstance(key, str) or not is_size(key):
            continue
        least = 0 if key in MAY_BE_ZERO else 1
        many = isinstance(value, list)  # one per level, as block_out_channels
        if all(_whole(n, least) for n in (value if many else [value])):
            continue
        what = f"whole numbers >= {least}, one per level" if many else f"a whole number >= {least}"
        raise ConfigError(f"{_named(source, where)}={shown(value)} is not valid; expected {what}")


def _check_swaps(data: dict[str, Any], source: str | None) -> None:
    """`blocks_per_swap` shares a swap between two block lists: it gives one count per list."""
    shares, blocks = data.get("blocks_per_swap") or [], data.get("blocks") or []
    if shares and not len(shares) == len(blocks) == 2:
        raise ConfigError(
            f"{_named(source, 'blocks_per_swap')}={shown(shares)} is not valid; expected a "
            f"share for each of two block lists (blocks={shown(blocks)})"
        )


def _checked_companion(spec: Any, source: str | None, path: str) -> dict[str, Any]:
    """A companion (`kind`, `dtype`, `architecture`), its sizes checked; `path` is where it sits
    in a preset, "" in a companion's own file."""
    if not (
        isinstance(spec, dict)
        and isinstance(spec.get("kind"), str)
        and isinstance(spec.get("architecture"), dict)
    ):
        raise ConfigError(
            f"{_named(source, path)}: {shown(spec)} is not a companion; expected its name in "
            "conf/companions/, or a mapping of its kind (text), dtype and architecture (a mapping)"
        )
    _check_sizes(spec["architecture"], source, f"{path}.architecture" if path else "architecture")
    return spec


def load_companion(name: str) -> dict[str, Any]:
    path = conf_dir() / "companions" / f"{name}.yaml"
    if not path.exists():
        valid = group_options("companions")
        raise ConfigError(f"unknown companion {shown(name)}; valid: {', '.join(valid)}")
    source = f"conf/companions/{name}.yaml"
    return _checked_companion(read_yaml(path, source), source, "")


def load_preset(name: str) -> ModelPreset:
    """The shipped preset `conf/model/<name>.yaml`, read without composing a whole config."""
    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        valid = group_options("model")
        raise ConfigError(f"unknown model {shown(name)}; valid: {', '.join(valid)}")
    source = f"conf/model/{name}.yaml"
    return ModelPreset.from_dict(read_yaml(path, source), source)
