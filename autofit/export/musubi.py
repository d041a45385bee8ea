"""`target=musubi`: kohya-ss musubi-tuner's dataset TOML, its caching commands and its LoRA launch.

musubi-tuner (github.com/kohya-ss/musubi-tuner, not on PyPI: run from its folder) trains video
and image LoRAs on latents and text-encoder outputs cached before training. The export writes:

- `dataset.toml`: its dataset config ([general] and one [[datasets]] of videos, or of images for
  an image family, with a `control_directory` of reference images for an editing model), the
  sample as measured: `resolution` [width, height] of the run's largest
  bucket (with buckets of at most that area), for a video `target_frames` [frames] taken from the
  head of each video, the micro-batch;
- `cache.sh`: the family's two caching scripts (latents, then text-encoder outputs) over it;
- `train.sh`: `accelerate launch` of the family's *_train_network.py (wan_train_network.py with
  its --task, hv_train_network.py, qwen_image_train_network.py) with each knob's musubi words
  (autofit/knobs/) and, below them,
  musubi-tuner's documented learning rate, epochs and timestep flags for the family
  (autofit/export/trainer_defaults.yaml), marked as defaults to review.

Option names and dataset keys are musubi-tuner's own (tests/test_export.py pins them at the
commit they were read at).
"""

from __future__ import annotations

import shlex
from typing import Any

from autofit.export.base import ExportPlan, Target, steps_note
from autofit.export.defaults import MARK
from autofit.export.toml import dumps
from autofit.families import REGISTRY, MusubiScripts, musubi
from autofit.knobs.frames import clip_frames
from autofit.models import ModelPreset

# placeholders: autofit never sees the user's data
VIDEO_DIR = "path/to/videos"
IMAGE_DIR = "path/to/images"
CONTROL_DIR = "path/to/control_images"
CACHE_DIR = "path/to/cache"


def _samples(plan: ExportPlan) -> dict[str, Any]:
    """The [[datasets]] entry: a video family's clips of the measured length, taken from the head
    of each video (dataset/config_utils.py VIDEO_DATASET_DISTINCT_SCHEMA), or an image family's
    images (IMAGE_DATASET_DISTINCT_SCHEMA)."""
    point = plan.point
    if not REGISTRY[point.family].video:
        images = {"image_directory": IMAGE_DIR, "cache_directory": CACHE_DIR}
        if point.preset.inputs.get("num_reference_images"):
            # each target's reference, of the same file name, resized to the target's bucket by
            # default (dataset/image_video_dataset.py), as measured (docs/dataset_config.md)
            images["control_directory"] = CONTROL_DIR
        return images
    frames = point.config["frames"]  # said by its musubi words: the clip length is here
    return {
        "video_directory": VIDEO_DIR,
        "cache_directory": CACHE_DIR,
        "target_frames": [clip_frames({"frames": frames}, point.preset)],
        "frame_extraction": "head",
    }


def _dataset(plan: ExportPlan) -> dict[str, Any]:
    point = plan.point
    resolution = plan.value("resolution") or point.preset.resolution
    height, width = point.preset.shape(resolution)
    return {
        "general": {
            # musubi-tuner's resolution is [width, height]; its buckets keep at most that area
            # (dataset/bucket.py), so no clip holds more pixels than the measured one.
            "resolution": [width, height],
            "caption_extension": ".txt",
            "batch_size": plan.value("batch_size"),
            "enable_bucket": True,
            "bucket_no_upscale": True,
        },
        "datasets": [_samples(plan)],
    }


def _task(plan: ExportPlan, scripts: MusubiScripts) -> str | None:
    """Its --task (Wan's configs), from the preset, or from the block count for another model;
    None where the script has no --task."""
    if not scripts.tasks:
        return None
    preset: ModelPreset = plan.point.preset
    task = scripts.tasks.get(preset.name)
    if task is None:
        task = "t2v-1.3B" if int(preset.architecture.get("num_layers", 0)) == 30 else "t2v-14B"
        plan.note(f"--task {task} is taken from {preset.name}'s block count: check it")
    return task


def _words(settings: dict[str, Any]) -> list[str]:
    """Settings as command-line words: a flag for True, its values for a list."""
    words: list[str] = []
    for key, value in settings.items():
        if value is False or value is None:
            continue
        words.append(key)
        if value is True:
            continue
        values = value if isinstance(value, list) else [value]
        words += [shlex.quote(str(v)) for v in values]
    return words


def _lines(words: list[str]) -> str:
    """Words as continued shell lines, one option with its values per line."""
    lines: list[list[str]] = []
    for word in words:
        if word.startswith("--") or not lines:  # an option begins a line; its values follow
            lines.append([word])
        else:
            lines[-1].append(word)
    return " \\\n  ".join(" ".join(line) for line in lines)


def _cache_commands(scripts: MusubiScripts, config: str, task: str | None) -> list[str]:
    """musubi-tuner's two caching commands for the dataset config `config`: the latents (with
    the task's own flags, an I2V task's first frame and CLIP features) and the text encoders'
    outputs."""
    latents = (
        [f"{k} path/to/{v}" for k, v in scripts.latent_files.items()]
        + list(scripts.cache_flags.get(task or "", ()))
        + list(scripts.flags)
    )
    text = [f"{k} path/to/{v}" for k, v in scripts.text_files.items()] + list(scripts.flags)
    return [
        f"python {scripts.cache_latents} --dataset_config {config} " + " ".join(latents),
        f"python {scripts.cache_text} --dataset_config {config} "
        + " ".join(text)
        + " --batch_size 16",
    ]


def _data_notes(plan: ExportPlan, video: bool) -> None:
    """Where the user's clips or images (and an edit model's references) go."""
    if video:
        plan.note(
            f"put your videos (with .txt captions) in '{VIDEO_DIR}' of dataset.toml; each "
            'trains on its first frames (frame_extraction = "head")'
        )
    else:
        plan.note(f"put your images (with .txt captions) in '{IMAGE_DIR}' of dataset.toml")
    if plan.point.preset.inputs.get("num_reference_images"):
        plan.note(
            f"put each image's reference (control) image, of the same file name, in "
            f"'{CONTROL_DIR}' of dataset.toml"
        )


class Musubi(Target):
    name = "musubi"
    summary = (
        "kohya-ss musubi-tuner's dataset TOML, caching commands and LoRA launch (Wan, "
        "HunyuanVideo, Qwen-Image(-Edit), FLUX.1 Kontext)"
    )

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        scripts = musubi(point.family)
        assert scripts is not None  # the family's check refused it otherwise
        dataset = plan.add(
            "dataset.toml", dumps(_dataset(plan)), "musubi-tuner dataset config (--dataset_config)"
        )
        config = shlex.quote(str(dataset))
        task = _task(plan, scripts)
        cache = _cache_commands(scripts, config, task)
        cache_file = plan.add(
            "cache.sh",
            "#!/usr/bin/env bash\n# musubi-tuner caches latents and text-encoder outputs before "
            "training (encoders=cached)\nset -e\n" + "\n".join(cache),
            "musubi-tuner caching commands (latents, text-encoder outputs)",
        )
        world = plan.value("world_size")  # the launcher's --num_processes
        said = plan.say_rest()
        args: dict[str, Any] = {
            "--dit": f"path/to/{point.model}.safetensors",
            "--dataset_config": str(dataset),
            **said,
            "--gradient_accumulation_steps": point.accumulation,
            "--output_dir": "output",
            "--output_name": point.study,
        }
        defaults = {k: v for k, v in plan.training_defaults(args).items() if k not in args}
        launch = (
            f"accelerate launch --num_cpu_threads_per_process 1 --num_processes {world} "
            f"--mixed_precision {args['--mixed_precision']} {scripts.script}"
        )
        task_options = [] if task is None else ["--task", task, *scripts.task_flags.get(task, ())]
        options = task_options + list(scripts.flags) + _words(args)
        text = "#!/usr/bin/env bash\n# musubi-tuner LoRA training, as autofit measured it\nset -e\n"
        if defaults:
            text += (
                f"# {plan.defaults_heading}\nDEFAULTS=(\n"
                + "".join(f"  {' '.join(_words({k: v}))}  # {MARK}\n" for k, v in defaults.items())
                + ")\n"
            )
        text += f"{launch} \\\n  " + _lines(options)
        if defaults:
            text += ' \\\n  "${DEFAULTS[@]}"'
        train_file = plan.add("train.sh", text, f"musubi-tuner launch of {scripts.script}")
        plan.note(
            f"replace the 'path/to/...' placeholders: --dit in train.sh is {point.model}'s DiT "
            "as one .safetensors file of the original (non-diffusers) layout musubi-tuner loads; "
            "cache.sh names the VAE and text encoders"
        )
        video = REGISTRY[point.family].video
        _data_notes(plan, video)
        if task is not None and task.endswith("A14B"):  # Wan 2.2's two-expert models
            plan.note(
                "Wan 2.2: --dit is the one expert autofit measured (low- or high-noise); "
                "--dit_high_noise would hold both experts, which was not measured"
            )
        steps_note(
            plan,
            f"an epoch is your {'videos' if video else 'images'} / that many steps, for "
            "--max_train_epochs of train.sh",
        )
        plan.note("run cache.sh and train.sh from musubi-tuner's folder")
        plan.command = f"bash {shlex.quote(str(cache_file))} && bash {shlex.quote(str(train_file))}"


TARGET = Musubi()
