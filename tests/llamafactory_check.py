"""Run by tests/llamafactory_env.py in LLaMA-Factory's own environment: read an exported config as
`llamafactory-cli train` does (LLaMA-Factory 0.9.5: hparams/parser.py get_train_args), then set
up the model as its loader does (model/loader.py load_model: patch_config, patch_model,
init_adapter) on the meta device, from the local folder's config.json in place of the weights;
rank 0 prints what it saw as JSON.

    python llamafactory_check.py JOBS_JSON

JOBS_JSON lists {"config", "model", "bf16"} objects: the exported config.yaml, the model folder,
and whether the GPU the run was measured for has bf16 (and, for an FSDP export, the
"accelerate_config" it is launched with, read first as `accelerate launch` reads it); one process
for all, as importing LLaMA-Factory takes most of the time.
"""

import json
import os
import re
import sys
import tempfile

import torch
import yaml


def stand_in_for_the_gpu(bf16: bool) -> None:
    """What this CPU-only machine answers otherwise than the GPU would. The parser asks the GPU it runs on whether it has bf16 (transformers refuses bf16 without,
    LLaMA-Factory refuses pure_bf16): here the answer is the measured GPU's."""
    import llamafactory.hparams.parser
    import transformers.training_args

    transformers.training_args.is_torch_bf16_gpu_available = lambda: bf16
    llamafactory.hparams.parser.is_torch_bf16_gpu_available = lambda: bf16
    # DeepSpeed's CPU accelerator would first compile its shared-memory allreduce (a minute) for
    # a process group that reduces nothing here.
    import deepspeed.comm.torch

    deepspeed.comm.torch.build_shm_op = lambda: None
    # autofit's environment holds a torchao newer than peft 0.18.1 can import (LLaMA-Factory pins
    # no torchao): peft's LoRA layer for torchao-quantized weights, which no export asks for, is
    # left out of its dispatch.
    import peft.tuners.lora.torchao

    peft.tuners.lora.torchao.is_torchao_available = lambda: False


def _layers(model: torch.nn.Module) -> torch.nn.Module:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.layers


def _use_reentrant(layer: torch.nn.Module) -> bool | None:
    func = getattr(layer, "_gradient_checkpointing_func", None)
    inner = getattr(func, "__wrapped__", None)  # LLaMA-Factory's wrapper of partial(checkpoint)
    return None if inner is None else inner.keywords.get("use_reentrant")


def launched_by(accelerate_config: str) -> dict:
    """What `accelerate launch --config_file accelerate_config` hands the training process
    (accelerate 1.11.0's config loader, launch validation and multi-GPU environment), set in this
    process's environment as the Trainer would find it, and the FSDP plugin accelerate builds from
    it there."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", accelerate_config, "-m", "llamafactory.launcher"])
    args, _, _ = _validate_launch_command(args)
    for key in [k for k in os.environ if k.startswith(("FSDP_", "ACCELERATE_"))]:
        del os.environ[key]  # one job's launch is not the next one's
    os.environ.update(prepare_multi_gpu_env(args))
    plugin = FullyShardedDataParallelPlugin()
    return {
        "num_processes": args.num_processes,
        "mixed_precision": args.mixed_precision,
        "fsdp_version": plugin.fsdp_version,
        "reshard_after_forward": plugin.reshard_after_forward,
        "cpu_offload": type(plugin.cpu_offload).__name__,
        "transformer_cls_names_to_wrap": plugin.transformer_cls_names_to_wrap,
        "cpu_ram_efficient_loading": plugin.cpu_ram_efficient_loading,
        "activation_checkpointing": plugin.activation_checkpointing,
    }


def check(config: str, model: str, bf16: bool, accelerate_config: str | None = None) -> dict:
    from llamafactory.hparams import get_train_args
    from llamafactory.model.adapter import init_adapter
    from llamafactory.model.loader import load_config
    from llamafactory.model.patcher import patch_config, patch_model
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    launch = launched_by(accelerate_config) if accelerate_config else None
    with open(config, encoding="utf-8") as file:
        cfg = yaml.safe_load(file)
    cfg["model_name_or_path"] = model  # the exported hub id, read from a local config.json
    cfg["output_dir"] = tempfile.mkdtemp()
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(cfg)

    hf_config = load_config(model_args)
    init_kwargs: dict = {}
    patch_config(hf_config, None, model_args, init_kwargs, is_trainable=True)
    # What from_pretrained(torch_dtype="auto") would load, without weights or DeepSpeed's Init.
    model_class = AutoModelForCausalLM._model_mapping[type(hf_config)]
    with torch.device("meta"):
        built = model_class(hf_config).to(hf_config.dtype)
    patch_model(built, None, model_args, is_trainable=True, add_valuehead=False)
    built = init_adapter(hf_config, built, model_args, finetuning_args, is_trainable=True)

    trained = {n: p for n, p in built.named_parameters() if p.requires_grad}
    frozen = [p for p in built.parameters() if not p.requires_grad]
    quantization = init_kwargs.get("quantization_config")
    ds = getattr(training_args, "hf_deepspeed_config", None)
    layer = _layers(built)[-1]
    return {
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "world_size": training_args.world_size,
        "cutoff_len": data_args.cutoff_len,
        "bf16": training_args.bf16,
        "fp16": training_args.fp16,
        "pure_bf16": finetuning_args.pure_bf16,
        "compute_dtype": str(model_args.compute_dtype),
        "optim": getattr(training_args.optim, "value", training_args.optim),
        "finetuning_type": finetuning_args.finetuning_type,
        "lora_rank": finetuning_args.lora_rank,
        "lora_alpha": finetuning_args.lora_alpha,
        "attn_implementation": hf_config._attn_implementation,
        "liger": model_args.enable_liger_kernel,
        "quantization": quantization.to_dict() if quantization is not None else None,
        "checkpointing": bool(getattr(layer, "gradient_checkpointing", False)),
        "use_reentrant": _use_reentrant(layer),
        "trained_dtypes": sorted({str(p.dtype) for p in trained.values()}),
        "frozen_dtypes": sorted({str(p.dtype) for p in frozen if p.is_floating_point()}),
        "trained_layers": sorted(
            {int(m) for n in trained for m in re.findall(r"layers\.(\d+)\.", n)}
        ),
        "lora_modules": sorted({n.split(".")[-4] for n in trained if ".lora_A." in n}),
        "zero3": is_deepspeed_zero3_enabled(),
        "zero_stage": ds.config["zero_optimization"]["stage"] if ds else 0,
        "deepspeed_mismatches": ds.mismatches if ds else [],
        "launch": launch,
    }


def main() -> None:
    seen = []
    for job in json.loads(sys.argv[1]):
        stand_in_for_the_gpu(job["bf16"])
        seen.append(check(**job))
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(seen, default=str), flush=True)


if __name__ == "__main__":
    main()
