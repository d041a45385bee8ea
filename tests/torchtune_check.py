"""Run by tests/torchtune_env.py in torchtune 0.6.1's own environment: read each exported config
and launch line as torchtune does, and build what needs no files; print the results as JSON.

    python torchtune_check.py JOBS_JSON

JOBS_JSON lists {"config", "command"} objects. For each:

- the launch line through `tune run`'s own parser (torchtune/_cli/run.py, with torchrun's
  options), its recipe one of torchtune's built-in ones (a distributed one under --nproc_per_node);
- the config as that recipe reads it (config.parse: TuneRecipeArgumentParser and the merge of
  the YAML with the command line's overrides), then `tune validate`'s check (config.validate:
  every component's arguments bound to its signature);
- instantiated with config.instantiate, as the recipes do: the model under the config's dtype on
  the meta device (no memory, nothing loaded); the optimizer and learning-rate scheduler over a
  small real parameter of that dtype (torch's fused AdamW refuses meta tensors); the loss, and for
  the chunked one the model's output chunked to it, as the recipes set it. The tokenizer,
  checkpointer and dataset need the model's files and the user's data: validate binds their
  arguments only.
"""

import argparse
import json
import shlex
import sys

import torch
from omegaconf import OmegaConf
from torchtune import config, training
from torchtune._cli.run import Run
from torchtune._recipe_registry import get_all_recipes
from torchtune.config._parse import TuneRecipeArgumentParser
from torchtune.config._utils import _merge_yaml_and_cli_args
from torchtune.modules.peft import DoRALinear, LoRALinear, get_adapter_params


def launch(command: str) -> tuple[dict, list[str]]:
    """The recipe the line runs, and the arguments it hands the recipe."""
    words = shlex.split(command)
    while "=" in words[0]:  # the environment the line sets
        words.pop(0)
    assert words[0] == "tune", command
    parser = argparse.ArgumentParser(prog="tune")
    Run.create(parser.add_subparsers())  # `tune run`'s own parser (tune.py adds it so)
    args = parser.parse_args(words[1:])
    recipe = next((r for r in get_all_recipes() if r.name == args.recipe), None)
    assert recipe is not None, f"{args.recipe} is no torchtune recipe"
    nproc = int(args.nproc_per_node)
    assert nproc == 1 or recipe.supports_distributed, f"{recipe.name} runs on one device only"
    return {"recipe": recipe.name, "nproc": nproc}, list(args.recipe_args)


def check(job: dict) -> dict:
    found, recipe_args = launch(job["command"])
    yaml_args, cli_args = TuneRecipeArgumentParser(description="").parse_known_args(recipe_args)
    cfg = _merge_yaml_and_cli_args(yaml_args, cli_args)
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(OmegaConf.load(job["config"]))
    config.validate(cfg)

    dtype = training.get_dtype(cfg.dtype, device=torch.device("cpu"))
    with training.set_default_dtype(dtype), torch.device("meta"):
        model = config.instantiate(cfg.model)
    loss = config.instantiate(cfg.loss)
    chunks = getattr(loss, "num_output_chunks", None)
    if type(loss).__name__ == "CEWithChunkedOutputLoss":
        model.set_num_output_chunks(chunks)
        logits = [torch.randn(1, 2, 16) for _ in range(chunks)]
        value = loss(logits, torch.randint(0, 16, (1, 2 * chunks)))
        assert torch.isfinite(value), value

    weight = torch.nn.Parameter(torch.zeros(64, 64, dtype=dtype))
    optimizer = config.instantiate(cfg.optimizer, [weight])
    scheduler = None
    if cfg.get("lr_scheduler") is not None:
        scheduler = config.instantiate(cfg.lr_scheduler, optimizer, num_training_steps=10)

    adapted = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, (LoRALinear, DoRALinear))
        }
    )
    return {
        **found,
        "dtype": str(dtype),
        "params": sum(p.numel() for p in model.parameters()),
        "adapter_params": sum(p.numel() for p in get_adapter_params(model).values()),
        "adapted": adapted,
        "dora": any(isinstance(m, DoRALinear) for m in model.modules()),
        "model_dtype": str(next(model.parameters()).dtype),
        "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__name__}",
        "optimizer_defaults": {k: v for k, v in optimizer.defaults.items() if isinstance(v, (bool, int, float, type(None)))},
        "scheduler": type(scheduler).__name__ if scheduler else None,
        "loss": type(loss).__name__,
        "chunks": chunks,
        "recipe_settings": {
            key: cfg.get(key)
            for key in (
                "batch_size", "gradient_accumulation_steps", "enable_activation_checkpointing",
                "enable_activation_offloading", "compile", "optimizer_in_bwd", "ac_mode",
                "ac_option", "fsdp_cpu_offload", "fsdp_reshard_after_forward", "epochs",
            )
        },
        "custom_sharded_layers": OmegaConf.to_container(cfg.custom_sharded_layers)
        if cfg.get("custom_sharded_layers") is not None
        else None,
        "max_seq_len": cfg.tokenizer.max_seq_len,
    }  # fmt: skip


def main() -> None:
    jobs = json.loads(sys.argv[1])
    print(json.dumps([check(job) for job in jobs], default=str))


if __name__ == "__main__":
    main()
