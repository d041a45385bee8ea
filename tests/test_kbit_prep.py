"""kbit_prep=peft: peft's prepare_model_for_kbit_training on the quantized base, before the adapters
(autofit/knobs/kbit_prep.py says what it holds and why)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import spec, tiny_llama, with_blocks

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.models import load_preset
from autofit.records.probe import ProbeSpec


def qlora_llama(**knobs: Any) -> ProbeSpec:
    """The tiny Llama under QLoRA."""
    return tiny_llama(train_mode="qlora", **knobs)


def dtypes(model: torch.nn.Module) -> dict[str, set[torch.dtype]]:
    """The dtypes of the model's packed 4-bit weights, adapters and every other parameter."""
    found: dict[str, set[torch.dtype]] = {"packed": set(), "adapters": set(), "other": set()}
    for name, param in model.named_parameters():
        kind = (
            "adapters" if "lora_" in name else "packed" if param.dtype == torch.uint8 else "other"
        )
        found[kind].add(param.dtype)
    return found


@pytest.mark.long
@pytest.mark.parametrize("backend", [simulate, cpu])
def test_peft_casts_every_weight_but_the_4bit_ones_to_fp32(backend: Any) -> None:
    before, _ = backend.trace(qlora_llama(precision="bf16"))
    after, _ = backend.trace(qlora_llama(precision="bf16", kbit_prep="peft"))
    assert dtypes(before.model) == {
        "packed": {torch.uint8}, "adapters": {torch.float32}, "other": {torch.bfloat16},
    }  # fmt: skip
    assert dtypes(after.model) == {
        "packed": {torch.uint8}, "adapters": {torch.float32}, "other": {torch.float32},
    }  # fmt: skip
    # Under pure bf16 the adapters stay bf16; what peft cast stays fp32.
    pure, _ = backend.trace(qlora_llama(precision="bf16_pure", kbit_prep="peft"))
    assert dtypes(pure.model)["adapters"] == {torch.bfloat16}
    assert dtypes(pure.model)["other"] == {torch.float32}


def test_with_checkpointing_the_embeddings_output_needs_a_gradient_and_the_run_checkpoints() -> (
    None
):
    run, _ = simulate.trace(qlora_llama(precision="bf16", checkpointing=True, kbit_prep="peft"))
    assert run.model._require_grads_hooks  # transformers' enable_input_require_grads, peft's call
    layers = run.model.model.layers
    assert all(layer._gradient_checkpointing_func == run.checkpoint for layer in layers)
    plain, _ = simulate.trace(qlora_llama(precision="bf16", checkpointing=False, kbit_prep="peft"))
    assert not getattr(plain.model, "_require_grads_hooks", None)


@pytest.mark.parametrize(
    "precision,logits", [("bf16", torch.bfloat16), ("bf16_pure", torch.float32)]
)
def test_the_residual_stream_runs_in_fp32_and_the_head_in_its_own_dtype(
    precision: str, logits: torch.dtype
) -> None:
    """A real step: the fp32 embedding's output (which needs a gradient, under checkpointing)
    carries fp32 through the blocks; autocast casts the fp32 head to bf16, so its logits stay
    bf16, where without autocast they come out fp32."""
    from autofit.simulator import cuda_autocast
    from autofit.training import TrainingRun

    cuda_autocast.install()
    run = TrainingRun(
        qlora_llama(precision=precision, checkpointing=True, kbit_prep="peft"), torch.device("cpu")
    )
    run.build()
    seen: dict[str, Any] = {}
    model = run.model.model
    model.embed_tokens.register_forward_hook(
        lambda _m, _i, out: seen.update(embedded=(out.dtype, out.requires_grad))
    )
    model.norm.register_forward_hook(lambda _m, _i, out: seen.update(hidden=out.dtype))
    run.model.lm_head.register_forward_hook(lambda _m, _i, out: seen.update(logits=out.dtype))
    run.step()
    assert seen == {"embedded": (torch.float32, True), "hidden": torch.float32, "logits": logits}


def test_llama3_8b_holds_its_embedding_and_head_in_fp32_and_a_bf16_copy_of_the_head() -> None:
    """One block of Llama 3 8B at 64 tokens under bf16 autocast: the embedding and the untied
    head (128,256 x 4,096 each) gain two bytes a weight, the norms (three, one block) too; the
    head's bf16 copy, which autocast makes and the matmul keeps, is among the activations."""

    def traced(prep: str) -> Any:
        probe = spec(
            "llama3_8b", batch_size=1, resolution=64, precision="bf16", train_mode="qlora",
            checkpointing=True, kbit_prep=prep,
        )  # fmt: skip
        return simulate.trace(with_blocks(probe, 1))[1].peak_report()

    none, peft = traced("none"), traced("peft")
    head = 128256 * 4096
    norms = 3 * 4096
    assert peft.breakdown["parameters"] - none.breakdown["parameters"] == (2 * head + norms) * 2
    assert peft.breakdown["activations"] - none.breakdown["activations"] >= head * 2


def _reason(model: str, **knobs: Any) -> str | None:
    config = {**defaults(), "resolution": 512, **knobs}
    return invalid_reason(config, load_gpu("a40"), load_preset(model), "simulate")


def test_peft_is_refused_where_it_was_not_measured() -> None:
    assert _reason("llama3_8b", train_mode="qlora", kbit_prep="peft") is None
    assert _reason("llama3_8b", train_mode="qdora", kbit_prep="peft") is None
    refused = {
        "train_mode=lora has none": _reason("llama3_8b", train_mode="lora", kbit_prep="peft"),
        "flux_dev is a flux model": _reason("flux_dev", train_mode="qlora", kbit_prep="peft"),
        "DeepSpeed ZeRO casts": _reason(
            "llama3_8b", train_mode="qlora", kbit_prep="peft", zero_stage=2
        ),
        "use swap_blocks=0": _reason(
            "llama3_8b", train_mode="qlora", kbit_prep="peft", swap_blocks=4
        ),
    }
    for words, reason in refused.items():
        assert reason is not None and words in reason and "\n" not in reason, reason


def test_a_search_without_a_trainer_leaves_peft_out_beside_none() -> None:
    knob = REGISTRY["kbit_prep"]
    assert knob.saves_memory_over("peft", ("none", "peft")) is None
    assert knob.needless_without_trainer("peft", ("none", "peft"))
    assert knob.needless_without_trainer("peft", ("peft",)) is None
    assert knob.needless_without_trainer("none", ("none", "peft")) is None
