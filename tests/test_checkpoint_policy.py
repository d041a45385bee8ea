"""checkpoint_policy=op: torchtitan's per-op selective checkpointing, torch's own selective
checkpointing with torchtitan's policy, on fake tensors and on real ones on the CPU."""

from __future__ import annotations

from typing import Any

from helpers import refusal, tiny_llama

from autofit.backends import cpu, simulate
from autofit.knobs import REGISTRY, defaults
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset
from autofit.simulator.tracker import round_allocation

FULL_FT = {"precision": "bf16_pure", "train_mode": "full", "checkpointing": True}


def _activations(backend: str = "simulate", **knobs: Any) -> tuple[int, Any]:
    probe = tiny_llama(backend, **{**FULL_FT, **knobs})
    log = (simulate if backend == "simulate" else cpu).trace(probe)[1]
    return log.peak_report().breakdown["activations"], log


def test_fake_and_real_keep_the_same_bytes() -> None:
    for knobs in (
        {"checkpoint_policy": "op"},
        {"checkpoint_policy": "op", "checkpoint_interval": 2},
    ):
        _, fake = _activations(**knobs)
        _, real = _activations("cpu", **knobs)
        assert fake.peak == real.peak
        assert fake.peak_report() == real.peak_report()


def test_each_checkpointed_layer_keeps_every_other_matmul_and_attention() -> None:
    """Tiny Llama (width 64, 4 heads of 16, 2 key-value heads, MLP 128), batch 2 of 32 tokens in
    bf16: of its seven matmuls a layer keeps the 1st, 3rd, 5th and 7th outputs (q_proj, v_proj,
    gate_proj, down_proj) and attention's output and fp32 log-sum-exp, beside its input."""
    tokens, bf16 = 2 * 32, 2

    def kept(*shape: int, size: int = bf16) -> int:
        count = 1
        for n in shape:
            count *= n
        return round_allocation(count * size)

    per_layer = (
        kept(tokens, 64) + kept(tokens, 2 * 16) + kept(tokens, 128) + kept(tokens, 64)
        + kept(tokens, 64) + kept(2, 4, 32, size=4)
    )  # fmt: skip
    full, _ = _activations()
    op, _ = _activations(checkpoint_policy="op")
    assert op - full == 2 * per_layer
    unchecked, _ = _activations(checkpointing=False)
    assert full < op < unchecked


def test_rules_and_words() -> None:
    assert refusal({"checkpoint_policy": "op"}, "llama3_8b") == (
        "checkpoint_policy=op needs checkpointing=true"
    )
    segments = {"checkpoint_policy": "op", "checkpointing": True, "checkpoint_interval": 2}
    assert refusal(segments, "sd35_medium").startswith(  # type: ignore[union-attr]
        "checkpoint_policy=op with checkpoint_interval=2: torchtitan's policy counts each block's"
    )
    assert refusal(segments, "llama3_8b") is None  # layers, each under a call of its own
    config = {**defaults(), **FULL_FT, "checkpoint_policy": "op"}
    subject = Subject(config, load_preset("llama3_8b"))
    knob = REGISTRY["checkpoint_policy"]
    for vocabulary in ("trl", "simpletuner", "kohya", "diffusers", "sana"):
        assert isinstance(knob.express(vocabulary, "op", subject), Refuse)
        assert isinstance(knob.express(vocabulary, "full", subject), Say)
