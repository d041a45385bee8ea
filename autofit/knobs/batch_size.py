"""batch_size: samples per optimizer step on one GPU (the micro-batch).

The planner varies it for every combination of the other knobs; gradient accumulation (an
export's `target.global_batch`) makes a larger effective batch out of it.
"""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, Subject, say


def _deepspeed(value: Any, s: Subject) -> Any:
    return say(
        train_batch_size=value * s.accumulation * s.world_size,
        train_micro_batch_size_per_gpu=value,
        gradient_accumulation_steps=s.accumulation,
    )


class BatchSize(Knob):
    name = "batch_size"
    depends_on = ("world_size",)
    default = 1
    help = "samples per optimizer step on one GPU"
    kind = int
    minimum = 1
    default_asks_nothing = False  # every trainer has a batch size of its own

    def means(self, value: Any, subject: Subject) -> str:
        return f"{value} samples per GPU per step (the micro-batch)"

    # kohya's batch is its dataset's (the layout writes dataset.toml).
    trainers = {
        "deepspeed": _deepspeed,
        "simpletuner": lambda v, s: say(
            train_batch_size=v, gradient_accumulation_steps=s.accumulation
        ),
        "sana": lambda v, s: say(
            **{"train.train_batch_size": v, "train.gradient_accumulation_steps": s.accumulation}
        ),
        "diffusers": lambda v, s: say(
            **{"--train_batch_size": v, "--gradient_accumulation_steps": s.accumulation}
        ),
        "trl": lambda v, s: say(
            per_device_train_batch_size=v, gradient_accumulation_steps=s.accumulation
        ),
        "axolotl": lambda v, s: say(micro_batch_size=v, gradient_accumulation_steps=s.accumulation),
        "torchtune": lambda v, s: say(batch_size=v, gradient_accumulation_steps=s.accumulation),
        # litgpt 0.5.13's TrainArgs: the accumulation is global_batch_size / devices /
        # micro_batch_size (args.py gradient_accumulation_iters), so the global batch says it.
        "litgpt": lambda v, s: say(
            **{
                "train.micro_batch_size": v,
                "train.global_batch_size": v * s.accumulation * s.world_size,
            }
        ),
        # LLaMA-Factory's training arguments are transformers' Seq2SeqTrainingArguments
        "llamafactory": lambda v, s: say(
            per_device_train_batch_size=v, gradient_accumulation_steps=s.accumulation
        ),
    }
