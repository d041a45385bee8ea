"""The simulator allocates what a real step allocates: the `simulate` backend (fake tensors) and
the `cpu` backend (real tensors) record the same allocations, in the same order, with the same
sizes and categories, for every precision, optimizer and checkpointing setting on the tiny models,
and for every value of every knob on the first tiny model the rules let the CPU run it on (where
a library's own code runs for real and is emulated on fake tensors, within what LOOSER says; where
no tiny model can run it on the CPU, NOT_ON_CPU says why).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import assert_same_allocations, changes_around, spec, tiny_llama

from autofit.backends import cpu, simulate
from autofit.errors import ConfigError
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.models import load_preset
from autofit.paths import calibration_dir
from autofit.units import value as text

PRECISION_CASES = list(
    itertools.product(
        ["tiny_mlp", "tiny_sana"],
        ["fp32", "fp16", "bf16", "bf16_pure"],
        [False, True],
        ["adamw", "sgd"],
    )
)


@pytest.mark.parametrize("model,precision,checkpointing,optimizer", PRECISION_CASES)
def test_simulated_allocations_equal_real_ones(
    model: str, precision: str, checkpointing: bool, optimizer: str
) -> None:
    probe = spec(
        model, batch_size=2, precision=precision, checkpointing=checkpointing, optimizer=optimizer
    )
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert_same_allocations(fake, real)


@pytest.mark.parametrize(
    "precision,checkpointing", itertools.product(["bf16", "bf16_pure"], [False, True])
)
def test_kbit_prep_holds_on_fake_tensors_what_it_holds_on_real_ones(
    precision: str, checkpointing: bool
) -> None:
    """peft's prepare_model_for_kbit_training on the 4-bit stand-in (fake) and on bitsandbytes'
    own layers (real): the same parameters, and the peak apart by what it is apart without it.
    (bitsandbytes' CPU kernels and the stand-in differ by a few small temporaries with or
    without the knob, so the QLoRA base is not byte-exact as the other knobs' runs are.)"""
    knobs = dict(precision=precision, checkpointing=checkpointing, train_mode="qlora")
    # The first real 4-bit step of a process makes a few more small allocations than later ones
    # (36 more, 18.5 KiB, on this model): one step first, so that every measured one is alike.
    cpu.trace(tiny_llama(**knobs))
    gaps, parameters = [], []
    for prep in ("none", "peft"):
        probe = tiny_llama(**knobs, kbit_prep=prep)
        _, fake = simulate.trace(probe)
        _, real = cpu.trace(probe)
        fake_report, real_report = fake.peak_report(), real.peak_report()
        assert fake_report.breakdown["parameters"] == real_report.breakdown["parameters"]
        gaps.append(fake.peak - real.peak)
        parameters.append(fake_report.breakdown["parameters"])
    assert gaps[1] == gaps[0]
    # Two more bytes for each weight of the embedding and the output head (the norms' 128 bytes
    # become 256 in the same 512-byte block).
    assert parameters[1] - parameters[0] == 2 * 512 * 64 * 2


# --- every value of every knob ------------------------------------------------------------------

GPU = load_gpu("h100_80")  # compute capability 9.0: every value the rules allow a GPU
TINY = {"tiny_mlp": load_preset("tiny_mlp"), "tiny_sana": load_preset("tiny_sana")}
TINY_LLAMA_PRESET = load_preset("llama3_8b")  # tiny_llama's preset, its widths cut down
# The files the knobs that name one read: a PEFT LoRA and SimpleTuner's Sana LoKr.
FILES = {
    "peft_config": str(calibration_dir() / "peft" / "lora-rank32.json"),
    "lycoris_config": str(
        calibration_dir() / "lycoris" / "sana-lokr-full-factor2-attention-4-ffn.json"
    ),
}


def _alternatives(name: str) -> list[Any]:
    values = [v for v in REGISTRY[name].sample_values() if v is not None]
    return values + ([FILES[name]] if name in FILES else [])


def candidates(knob: str, value: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Tiny models and knobs (`knob=value`, the others at their defaults but for one or two
    changed to make it valid) that the rules let the cpu backend run, fewest changes first."""
    models = [*TINY.items(), ("tiny_llama", TINY_LLAMA_PRESET)]
    for change in changes_around(knob, _alternatives):
        for model, preset in models:
            resolution = 32 if model == "tiny_llama" else preset.resolution
            config = {**defaults(), "batch_size": 2, "resolution": resolution, knob: value}
            if invalid_reason({**config, **change}, GPU, preset, "cpu") is None:
                yield model, {knob: value, **change}


# The values no tiny model runs on the cpu backend, and why; the test fails for any other.
NOT_ON_CPU = {
    ("checkpoint_stride", 1): "never valid: a stride is 0, or at least the interval (2 or more)",
    ("t5_precision", "fp8_quanto"): "no tiny model has a T5 text encoder",
    ("t5_precision", "int8_quanto"): "no tiny model has a T5 text encoder",
    ("optimizer", "paged_adamw8bit"): "it pages its state through CUDA unified memory",
    ("optimizer", "paged_lion8bit"): "it pages its state through CUDA unified memory",
    ("offload_optimizer", "nvme"): "ZeRO-Infinity's swap needs DeepSpeed's async I/O op and a "
    "drive: it is emulated only",
    ("offload_params", "nvme"): "ZeRO-Infinity's swap needs DeepSpeed's async I/O op and a "
    "drive: it is emulated only",
    ("offload_activations", "attention"): "SimpleTuner offloads the attention of SD3 and Flux "
    "blocks, and no tiny model has them",
    ("fsdp_offload", "cpu"): "FSDP2's CPU offload pins host memory, which needs a GPU",
    ("world_size", 2): "a probe runs one process: only the simulation models more GPUs",
}


def _probe(model: str, knobs: dict[str, Any], backend: str) -> Any:
    if model == "tiny_llama":
        return tiny_llama(backend=backend, gpu=GPU.name, **knobs)
    return spec(model, gpu=GPU.name, backend=backend, **{"batch_size": 2, **knobs})


# Where the cpu backend runs a library's own code that the simulation emulates or stands in for:
# what the test holds there (the peak within a share of the real one; 0: the same peak and the
# same breakdown, the allocations in between differing), and why.
LOOSER = (
    (
        lambda k: k.get("zero_stage", 0) > 0,
        0.001,
        "the cpu backend runs DeepSpeed's engine, the simulation its emulation: DeepSpeed's "
        "16-bit gradient buffer and its flags against the emulation's fp32 gradients "
        "(tests/test_offload.py holds each difference to the byte)",
    ),
    (
        lambda k: k.get("fsdp", "off") != "off",
        0.005,
        "the cpu backend runs torch's fully_shard over gloo, the simulation its emulation "
        "(autofit/emulations/fsdp.py): their all-gather and reduce-scatter buffers are freed in a "
        "different order (tests/test_fsdp.py)",
    ),
    (
        lambda k: k.get("train_mode") in ("qlora", "qdora"),
        0.005,
        "bitsandbytes' CPU 4-bit kernels make a few small temporaries the 4-bit stand-in does "
        "not (tests/test_kbit_prep.py)",
    ),
    (
        lambda k: k.get("optimizer") in ("adamw8bit", "lion8bit"),
        0,
        "bitsandbytes' CPU kernels for 8-bit optimizer state make 512-byte temporaries in the "
        "update that its emulation does not; the update's peak is the same",
    ),
    (
        lambda k: k.get("base_precision") in ("int8_quanto", "fp8_quanto"),
        0,
        "quanto's own layers on fake tensors make a few small tensors (scales, Marlin tables) "
        "its CPU kernels do not; the step's peak is the same",
    ),
    (
        lambda k: k.get("loss") == "fused_linear",
        0,
        "the fused loss's chunk loop on real CPU kernels makes short-lived temporaries its fake "
        "kernels do not; the peak is the same",
    ),
)


def _contract(knobs: dict[str, Any]) -> tuple[float, str] | None:
    for applies, bound, why in LOOSER:
        if applies(knobs):
            return bound, why
    return None


CASES = [(k, v) for k in REGISTRY for v in _alternatives(k)]


def _release(run: Any) -> None:
    """Tear down a real DeepSpeed engine: its ZeRO-3 hooks keep the engine and its reduce bucket
    (1 GB of address space) alive until `destroy()`. A probe owns its process; a test does not,
    and a dozen such runs left the process too large to fork."""
    engine = getattr(run.stepper, "module", None)
    if hasattr(engine, "destroy"):
        engine.destroy()


@pytest.mark.long
@pytest.mark.parametrize("knob,value", CASES, ids=[f"{k}={text(v)}" for k, v in CASES])
def test_every_value_of_every_knob_allocates_on_fake_tensors_what_it_does_on_real_ones(
    knob: str, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every value of every knob, on the first tiny model and configuration the rules let the
    cpu backend run: the simulated step's allocation log is the real one (or, where a library's
    own code runs for real and is emulated on fake tensors, as LOOSER says); a value no tiny
    model can run on the cpu backend is skipped with the rules' reason."""
    monkeypatch.setenv("LYCORIS_KERNEL_BACKEND", "torch")  # the library's torch path on both
    for model, knobs in candidates(knob, value):
        try:
            _, fake = simulate.trace(_probe(model, knobs, "simulate"))
        except ConfigError:  # what only building the model finds (a network adapting nothing)
            continue
        break
    else:
        assert (knob, value) in NOT_ON_CPU, f"no tiny model runs {knob}={text(value)} on cpu"
        pytest.skip(f"the cpu backend cannot run {knob}={text(value)}: {NOT_ON_CPU[knob, value]}")
    # A library's first real step in a process makes a few small tensors later ones do not
    # (bitsandbytes'): one step first, so that what is compared does not hang on the order.
    for _ in range(2):
        run, real = cpu.trace(_probe(model, knobs, "cpu"))
        _release(run)
    contract = _contract(knobs)
    if contract is None:
        assert_same_allocations(fake, real)
        return
    bound, why = contract
    fake_report, real_report = fake.peak_report(), real.peak_report()
    if bound == 0:
        assert fake_report.peak_allocated_bytes == real_report.peak_allocated_bytes, why
        assert fake_report.breakdown == real_report.breakdown, why
    else:
        assert fake.peak == pytest.approx(real.peak, rel=bound), why


def test_every_value_said_not_to_run_on_cpu_is_a_value() -> None:
    assert set(NOT_ON_CPU) <= set(CASES)
