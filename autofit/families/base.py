"""The contract of a model family: everything that belongs to one, declared once.

A family is a `Family` in its own module of autofit/families/, listed in `REGISTRY`
(autofit/families/__init__.py); a preset (`conf/model/<name>.yaml`) names it by `family`, and
everything else (the probe's loader and libraries, host memory, the knobs' words, the export
targets, the reference pages) reads the declaration and keeps no table of its own. A family
declares:

- its workload: the module whose `WORKLOAD` builds the model, batch and loss (it imports torch
  and the model's library, so only its path is named here, imported when the family is used);
- its companions: the roles of the frozen models its presets run beside it (text encoders, VAE);
- its optional libraries: what its workload imports of `autofit/probe/libraries.py`'s OPTIONAL,
  which a probe's process keeps (None: not known in advance, a user's own code);
- its loader: the library a trainer loads its weights with (`host.py`'s loader working set);
- its buckets: what a preset's `resolution` counts, image `pixels` or sequence `tokens`;
- the diffusers class of its trained model (`denoiser_class`), whose config.json a user may give
  as `model=` (its `_class_name`), and the shipped preset whose inputs, companions and buckets
  such a config takes (`config_template`);
- whether its samples are video clips (`video`: the `frames` knob sets their length, the preset's
  `inputs` the native length and the VAE's temporal compression);
- whether it is a transformers causal language model (`causal_lm`: the loss and k-bit knobs and
  the margins' classes ask);
- how checkpointing every N blocks groups its blocks (`checkpoint_groups`, the semantics of the
  trainers that offer it for the family: SimpleTuner's for its transformers, `segments`, N
  contiguous blocks under one checkpoint call, and `blocks`, blocks 0, N, 2N, ... checkpointed
  on their own; torchtitan's and torchtune's selective layer checkpointing for language models,
  `layers`, layers N-1, 2N-1, ... on their own; None: every block, no interval);
- the attention modules of each block that SimpleTuner's attention activation offload wraps
  (`attention_modules`, empty where it has none for the family);
- its LoRA module sets beyond the preset's own list (the `lora_targets` knob's values), and which
  of their modules are the dense feed-forward projections;
- per export target that trains named families (`TRAINERS`), the trainer's script and names for
  it, or a `Refuse` with the reason, in the knobs' vocabulary (autofit/words.py); a trainer of
  language models only (its `language_models_only`) refuses the other families by itself.

What belongs to one preset, not to its family (the published weights, SimpleTuner's flavour,
Sana's shipped config), is data in the preset's file. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autofit.words import Refuse

# What building a preset's companions (its text encoders and VAE) imports: a run that may build
# them imports these before it is built (Knob.libraries), and its probe's process keeps them.
COMPANION_LIBRARIES = ("transformers", "autofit.workloads.companions")
LOADERS = ("diffusers", "transformers")
UNITS = ("pixels", "tokens")
CHECKPOINT_GROUPS = ("segments", "blocks", "layers")
# The attention projections of diffusers' transformer blocks (Attention's to_q, to_k, ...).
DIFFUSION_ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")
# Those of both streams of a joint (MMDiT) attention: the image's and the text's.
JOINT_ATTENTION = DIFFUSION_ATTENTION + ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
# Every linear projection of a joint (MMDiT) block: both streams' attention and feed-forward and
# their adaptive norms' modulation (SD3's; ai-toolkit's LoRA on every linear of the blocks).
JOINT_BLOCK_LINEAR = JOINT_ATTENTION + (
    "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
    "norm1.linear", "norm1_context.linear",
)  # fmt: skip


# --- diffusers: the example training scripts (examples/ in the diffusers repository) ------------


@dataclass(frozen=True)
class DiffusersScript:
    path: str
    kind: str  # dreambooth | text_to_image | controlnet
    lora: bool
    # What the script does with the encoders: "cached", "online", or "mixed" (text embeddings
    # precomputed, latents encoded every step).
    encoders: tuple[str, ...]
    ema: bool = False  # offers --use_ema (an EMA copy on the GPU)
    # Why the script cannot run with only the trained model on the GPU (encoders=cached).
    not_cached: str = "encodes latents with the VAE on the GPU every step"
    # What its validation loads beside what training holds, if it reloads its text encoders
    # (validation=reload reproduces it; validation=on is then refused).
    validation_reloads: str = ""

    @property
    def file(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DiffusersScripts:
    """The family's example scripts, by the train_mode each trains (full, lora), in order."""

    scripts: Mapping[str, DiffusersScript]
    lora_layers: bool = False  # its LoRA script takes --lora_layers (the modules it adapts)

    @property
    def name(self) -> str:
        """The script the export targets' table shows: the last declared (LoRA's, if any)."""
        return list(self.scripts.values())[-1].path


# --- kohya sd-scripts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KohyaScripts:
    full: str | None  # the full fine-tune script; None: sd-scripts fine-tunes none of the family
    lora: str  # the LoRA (network) script
    network: str  # its LoRA network module
    # The single-file checkpoints its scripts load besides the model itself: key -> file name.
    files: Mapping[str, str] = field(default_factory=dict)
    # Arguments its scripts need to build and feed the family's model as autofit does (a model
    # type beside FLUX.1 in the same script): key -> value, written with the run's own.
    flags: Mapping[str, Any] = field(default_factory=dict)
    # The largest `blocks_to_swap` its scripts accept for an architecture; None: they have none.
    max_blocks_to_swap: Callable[[Mapping[str, Any]], int] | None = None
    # Its model runs torch's fused attention whatever the flags say (SDXL's runs the math path
    # without sdpa or xformers).
    always_fused_attention: bool = True
    # Its sampling moves the VAE to the GPU before the denoising, not only for the decode.
    sampling_moves_vae_first: bool = False
    # Its scripts can cache the text encoders' outputs (cache_text_encoder_outputs); without it
    # the text encoder stays on the GPU and encodes every step, cached latents or not.
    text_encoder_cache: bool = True
    # What its full fine-tune script needs to train the model alone, as autofit measures it.
    full_flags: Mapping[str, Any] = field(default_factory=dict)
    # The flags its scripts need to load and train a preset as autofit builds it, from the
    # preset's architecture and inputs (SD 2.x's v2 and v_parameterization).
    model_flags: Callable[[Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any]] | None = None

    @property
    def name(self) -> str:
        return self.full or self.lora


# --- SimpleTuner 4.10 ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SimpleTunerModel:
    model_family: str  # its --model_family (a preset's --model_flavour is in the preset's file)
    controlnet: bool = False  # trained as a ControlNet (--controlnet)
    block_swap: bool = False  # its model implements musubi block swap (its field registry's list)
    # The modules its LoRA adapts by default (its model's DEFAULT_LORA_TARGET, Flux's for its
    # default flux_lora_target=all), of those the model has; None: the preset's list.
    lora_targets: tuple[str, ...] | None = None
    # Presets of the family it cannot train, by name, each with the reason.
    refused_presets: Mapping[str, str] = field(default_factory=dict)
    # The --base_model_precision values its model refuses for the family (its check_user_config).
    refused_bases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.model_family


# --- NVlabs Sana --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SanaScript:
    script: str  # the preset's shipped train config is in the preset's file

    @property
    def name(self) -> str:
        return self.script


# --- kohya-ss musubi-tuner ----------------------------------------------------------------------

# Why musubi's export refuses the other families (musubi-tuner also trains image models, FLUX.2
# among them, that autofit has no presets of).
MUSUBI_ONLY = (
    "autofit exports musubi-tuner's LoRA scripts for Wan, HunyuanVideo, Qwen-Image(-Edit) and "
    "FLUX.1 Kontext only"
)


@dataclass(frozen=True)
class MusubiScripts:
    """musubi-tuner's LoRA training script for a family (src/musubi_tuner/), the network
    module it trains, its two caching scripts (latents, text-encoder outputs) with the files each
    loads, its largest `--blocks_to_swap` for an architecture and its `--task` for a preset."""

    script: str  # the LoRA training script
    network: str  # its --network_module
    cache_latents: str
    cache_text: str
    # The checkpoints each caching script loads: option -> file name (placeholders).
    latent_files: Mapping[str, str] = field(default_factory=dict)
    text_files: Mapping[str, str] = field(default_factory=dict)
    max_blocks_to_swap: Callable[[Mapping[str, Any]], int] | None = None
    # The --task of a preset, by its name (Wan's configs); empty: the script has no --task.
    tasks: Mapping[str, str] = field(default_factory=dict)
    # Flags the script needs for a task to run the model as autofit builds it.
    task_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Flags its latent caching needs for a task (an image-to-video task caches the first frame's
    # latents beside the clip's).
    cache_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Flags all three scripts (both caches and the training) need for the family's model
    # (Qwen-Image-Edit's --model_version edit: its latent cache then caches the control images'
    # latents and its text cache reads them).
    flags: tuple[str, ...] = ()
    # How its LoRA differs from the modules autofit adapts, if it does (lora_targets' words).
    lora_differs: str = ""
    # How its --blocks_to_swap differs from autofit's swap_blocks, if it does (swap_blocks' words).
    swap_differs: str = ""
    # Presets of the family it cannot train, by name, each with the reason.
    refused_presets: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.script


# --- TRL (huggingface/trl) ---------------------------------------------------------------------


# Why the kohya target refuses the video families: sd-scripts trains images (musubi's export is
# kohya's video trainer).
KOHYA_VIDEO = "sd-scripts trains image models; kohya's video trainer is musubi-tuner"


@dataclass(frozen=True)
class TrlModel:
    auto_class: str  # the transformers class its train.py loads the model with

    # What TRL trains: every family that is not a causal language model refuses it (Family).
    language_models_only: ClassVar[str] = "TRL's SFTTrainer trains language models only"

    @property
    def name(self) -> str:
        return f"SFTTrainer ({self.auto_class})"


# --- axolotl (axolotl-ai-cloud/axolotl) ---------------------------------------------------------


@dataclass(frozen=True)
class AxolotlModel:
    auto_class: str  # the transformers class axolotl loads the model with (its `type_of_model`)

    language_models_only: ClassVar[str] = "autofit exports axolotl's language-model fine-tunes only"

    @property
    def name(self) -> str:
        return f"axolotl ({self.auto_class})"


# --- ostris ai-toolkit (github.com/ostris/ai-toolkit at 27a03a91, not on PyPI) ----------------

AI_TOOLKIT_COMMIT = "27a03a91f23eb1b757d5ec2e80ee3e129cfcc350"
# Why the ai-toolkit export refuses a family it has a model for, but autofit has not matched.
AI_TOOLKIT_UNMATCHED = "autofit has not matched ai-toolkit's {what} against what it measures"


@dataclass(frozen=True)
class AiToolkitModel:
    """What ai-toolkit's job YAML calls the family's model: its `model.arch` (ModelConfig in
    toolkit/config_modules.py; the arch picks the model class, toolkit/util/get_model.py), the
    `model` flags it needs for the family beside it, and whether its quantization (`quantize`)
    applies to the model (the legacy SD 1.x and SDXL loaders have none)."""

    arch: str
    flags: Mapping[str, Any] = field(default_factory=dict)
    quantizes: bool = True
    # `model` flags from a preset's architecture and inputs (SD 2.x's arch and v-prediction).
    model_flags: Callable[[Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any]] | None = None
    # How its LoRA differs from autofit's adapter sets, if it does (lora_targets' words).
    lora_differs: str = ""

    @property
    def name(self) -> str:
        return f"arch {self.arch}"


# --- Nerogar OneTrainer (github.com/Nerogar/OneTrainer at 23df3832, not on PyPI) -----------------

ONETRAINER_COMMIT = "23df3832e8f213d64c337e39f9365ba46e99fed0"
# Why the OneTrainer export refuses a family it has a model for, but autofit has not matched.
ONETRAINER_UNMATCHED = "autofit has not matched OneTrainer's {what} against what it measures"


@dataclass(frozen=True)
class OneTrainerModel:
    """What OneTrainer's training config calls the family's model: its `model_type`
    (modules/util/enum/ModelType.py; a preset's own where `model_type_of` says, SD 2.x's), and
    the config part that holds the denoiser's weight dtype and checkpointing (`transformer` or
    `unet`: ModelType.model_parts). The companions' parts are the preset's companion names
    (text_encoder, text_encoder_2, vae), which are OneTrainer's too for these models."""

    model_type: str
    denoiser: str = "transformer"
    # the model_type from a preset's architecture and inputs, where one family has several
    model_type_of: Callable[[Mapping[str, Any], Mapping[str, Any]], str] | None = None
    # Whether its float8 weights (FLOAT_8) are the base autofit's fp8 measures: OneTrainer
    # quantizes nn.Linear only (modules/util/quantization_util.py), autofit every linear and 2-D
    # convolution, the same base where the denoiser has no convolution.
    fp8_matches: bool = True

    def model_type_for(self, architecture: Mapping[str, Any], inputs: Mapping[str, Any]) -> str:
        if self.model_type_of is None:
            return self.model_type
        return self.model_type_of(architecture, inputs)

    @property
    def name(self) -> str:
        return f"model_type {self.model_type}"


# --- torchtune (pytorch/torchtune) ----------------------------------------------------------------


@dataclass(frozen=True)
class TorchtuneModel:
    """torchtune trains its own model classes, built by its model builders: which one builds a
    preset is its architecture's (autofit/families/torchtune_builders.py), a preset of no
    builder's architecture is refused by the target."""

    language_models_only: ClassVar[str] = "torchtune's recipes fine-tune language models only"

    @property
    def name(self) -> str:
        return "torchtune's model builders"


# --- LitGPT (Lightning-AI/litgpt) ---------------------------------------------------------------


@dataclass(frozen=True)
class LitGptModel:
    # What the export names the model by: each preset's LitGPT config (its `trainers.litgpt.config`
    # in conf/model/), whose architecture tests/test_export_litgpt.py holds to the preset's.
    language_models_only: ClassVar[str] = "LitGPT fine-tunes language models only"

    @property
    def name(self) -> str:
        return "litgpt finetune_lora / finetune_full"


# --- LLaMA-Factory (hiyouga/LLaMA-Factory) -------------------------------------------------------


@dataclass(frozen=True)
class LlamaFactoryModel:
    auto_class: str  # the transformers class its loader picks for the model (model/loader.py)

    language_models_only: ClassVar[str] = (
        "autofit exports LLaMA-Factory's language-model fine-tunes only"
    )

    @property
    def name(self) -> str:
        return f"LLaMA-Factory sft ({self.auto_class})"


Trainer = (
    DiffusersScripts
    | KohyaScripts
    | SimpleTunerModel
    | SanaScript
    | TrlModel
    | MusubiScripts
    | AxolotlModel
    | AiToolkitModel
    | OneTrainerModel
    | TorchtuneModel
    | LitGptModel
    | LlamaFactoryModel
)
# The export targets that train named families, and what each declares of a family it trains.
TRAINERS: dict[str, type[Trainer]] = {
    "diffusers": DiffusersScripts,
    "kohya": KohyaScripts,
    "simpletuner": SimpleTunerModel,
    "sana": SanaScript,
    "trl": TrlModel,
    "musubi": MusubiScripts,
    "axolotl": AxolotlModel,
    "ai_toolkit": AiToolkitModel,
    "onetrainer": OneTrainerModel,
    "torchtune": TorchtuneModel,
    "litgpt": LitGptModel,
    "llamafactory": LlamaFactoryModel,
}


@dataclass(frozen=True)
class Family:
    """One model family (the module docstring says what each field means)."""

    name: str
    workload: str
    libraries: tuple[str, ...] | None
    loader: str
    unit: str | None  # None: the preset says (a user's own model)
    companions: tuple[str, ...] | None = ()  # None: the preset says (a user's own model)
    # LoRA target sets by name: module names (PEFT matches them as suffixes), or a regular
    # expression over full module names where a set takes one block list only
    lora_sets: Mapping[str, tuple[str, ...] | str] = field(default_factory=dict)
    # The dense feed-forward projections among them (a mixture of experts has none: peft cannot
    # adapt its fused 3-D experts).
    feed_forward: tuple[str, ...] = ()
    trainers: Mapping[str, Trainer | Refuse] = field(default_factory=dict)
    # A transformers causal language model: its loss is next-token cross-entropy over an output
    # projection (the loss knob's values), PEFT's k-bit preparation is made for it, and its
    # published runs are classes of their own (the margins).
    causal_lm: bool = False
    # How checkpointing every N blocks (checkpoint_interval) groups the blocks of each list
    # (CHECKPOINT_GROUPS); None: the family checkpoints every block and has no interval.
    checkpoint_groups: str | None = None
    # The children of each block whose saved tensors SimpleTuner's attention activation offload
    # copies to the host (offload_activations=attention); (): it offers none for the family.
    attention_modules: tuple[str, ...] = ()
    # Its samples are video clips of `frames` frames (the frames knob), each `resolution` pixels
    # in size, which its VAE compresses `inputs.temporal_downsample` to one after the first.
    video: bool = False
    # A config.json naming this class (`_class_name`) builds a model of this family, with the
    # inputs, companions, buckets and LoRA targets of the `config_template` preset.
    denoiser_class: str | None = None
    config_template: str | None = None

    def __post_init__(self) -> None:
        # A trainer of language models only refuses every other family by its own declaration
        # (`language_models_only`), so a family names only the trainers that concern it.
        implied = {
            name: Refuse(kind.language_models_only)
            for name, kind in TRAINERS.items()
            if getattr(kind, "language_models_only", None) and not self.causal_lm
        }
        object.__setattr__(self, "trainers", {**implied, **self.trainers})

    def trainer(self, target: str) -> Trainer | None:
        """What the trainer of `target` runs for this family; None where it refuses it."""
        found = self.trainers.get(target)
        return None if isinstance(found, Refuse) else found
