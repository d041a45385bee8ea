"""`target=sana`: an overlay in the layout of NVlabs Sana's train configs (configs/sana_config/).

`sana_overlay.yaml` holds only what autofit decides (data, model, train sections, Sana's own key
names, from each knob's Sana words); it goes on top of the model's shipped config. Sana's
train.py reads one config through pyrallis, so the launch command passes the overlay as pyrallis'
dotted flags (`--train.train_batch_size=8`), which override the shipped config's values.

Sana's train.py trains the whole model under accelerate's mixed precision (fp32 weights), with
its optimizers registered through mmcv, and shards with FSDP rather than DeepSpeed. The overlay
and the flags also carry the shipped config's learning rate, epochs and schedule
(autofit/export/trainer_defaults.yaml), which a comment marks as defaults to review.
"""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

import yaml

from autofit.export.base import ExportPlan, Target, knob_text, steps_note
from autofit.families import REGISTRY, SanaScript


def nested(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`section.key` settings as Sana's config sections."""
    sections: dict[str, dict[str, Any]] = {"data": {}, "model": {}, "train": {}}
    for dotted, value in settings.items():
        *path, key = dotted.split(".")
        place = sections
        for part in path:  # train.optimizer.fused: a key of the optimizer's own block
            place = place.setdefault(part, {})
        place[key] = copy.deepcopy(value)  # a knob's block is its declaration: never edit it
    # One square size, as measured (multi-scale buckets hold about the same pixels).
    sections["model"]["multi_scale"] = False
    return {name: keys for name, keys in sections.items() if keys}


def leaves(settings: dict[str, Any]) -> dict[str, Any]:
    """Every value of `settings` under its full dotted key (a block's own keys included)."""
    out: dict[str, Any] = {}
    for dotted, value in settings.items():
        if isinstance(value, dict):
            out.update(leaves({f"{dotted}.{key}": inner for key, inner in value.items()}))
        else:
            out[dotted] = value
    return out


def flags(data: dict[str, Any]) -> list[str]:
    """pyrallis' dotted flags for the overlay; a dict value is written as a YAML (JSON) string."""
    out = []
    for section, values in data.items():
        for key, value in values.items():
            text = (
                json.dumps(value, separators=(",", ":"))
                if isinstance(value, dict)
                else knob_text(value)
            )
            out.append(shlex.quote(f"--{section}.{key}={text}"))
    return out


class Sana(Target):
    name = "sana"
    summary = (
        "an overlay of NVlabs Sana's train config (configs/sana_config/), and its launch flags"
    )

    def build(self, plan: ExportPlan) -> None:

        world = plan.point.world_size
        script = REGISTRY[plan.point.family].trainer(self.name)
        assert isinstance(script, SanaScript)  # the family's check refused it otherwise
        settings = plan.say_rest()
        defaults = plan.training_defaults(leaves(settings))
        data = nested({**settings, **defaults})
        base = plan.point.preset.trainers.get("sana", {}).get("config")
        if base is None:
            base = "configs/sana_config/path/to/your_config.yaml"
            plan.note(
                f"autofit knows no shipped Sana config for {plan.point.model}: replace '{base}' "
                "with the config of the model you train"
            )
        heading = f"# {plan.defaults_heading}:\n#   {', '.join(defaults)}\n" if defaults else ""
        plan.add(
            "sana_overlay.yaml",
            f"# On top of {base}\n{heading}" + yaml.safe_dump(data, sort_keys=False),
            f"overlay of {base} in Sana's config layout",
        )
        plan.command = " ".join(
            [f"torchrun --nproc_per_node={world} {script.script}",
             shlex.quote(f"--config_path={base}"), "--work_dir=output/autofit", *flags(data)]
        )  # fmt: skip
        steps_note(
            plan,
            "an epoch is your images / that many steps, for train.num_epochs of the config",
        )
        plan.note("run the launch command from Sana's repository folder")


TARGET = Sana()
